"""The doctor's first read of a queue's jobs, a page at a time: a SCAN page of job hashes or of
spec records with the ids' scores in the places (one ZMSCORE a place), a ZSCAN page of a place
with its ids' records (EXISTS). Only a page and the suspects are held, never a place whole (a
scale review: 350-400 B of client a job, 162 MB for 500,000 jobs, when they were loaded into
dicts). These reads are not atomic: doctor.py re-reads each suspect inside one MULTI, so a job
moving between them is no finding."""

import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any, TypeVar

import redis

from scheduler.admin.doctor_checks import diagnose
from scheduler.admin.doctor_model import (
    Context,
    Issue,
    Snapshot,
    _hash_reply,
    _kept,
    _score_ms,
    _ttl,
    _with_spec,
)
from scheduler.core.keys import QueueKeys

# The ZSETs that list a job, in the order their findings come; flow:held is read as due.
PLACES = ("flow_held", "due", "leased", "dead")
_JOB_READS = 5  # TYPE, HGETALL, PTTL of the hash; GET, PTTL of the spec record
T = TypeVar("T")


def pages(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """`items` in lists of `size` (the last shorter), read lazily: a SCAN is never held whole."""
    it = iter(items)
    while page := list(islice(it, size)):
        yield page


def place_types(
    client: redis.Redis, keys: QueueKeys, places: Sequence[str]
) -> tuple[list[str], list[Issue]]:
    """Of the queue's ZSETs `places` (due, leased, dead, flow_held, dead_migrating): those that
    are ZSETs (or absent), and a finding for each of another type (written by hand), read as
    empty so the check goes on."""
    readable: list[str] = []
    found: list[Issue] = []
    for place in places:
        key = getattr(keys, place)
        t = str(client.type(key))
        if t in ("zset", "none"):
            readable.append(place)
        else:
            found.append(wrong_type_place(keys.queue, place, key, t))
    return readable, found


def _ask_scores(pipe: Any, keys: QueueKeys, readable: Sequence[str], ids: list[str]) -> None:
    for place in readable:
        pipe.zmscore(getattr(keys, place), ids)


def _scores(replies: Sequence[Any], readable: Sequence[str], n: int) -> dict[str, list[int | None]]:
    """Each place's score of each of `n` ids, in ms (None: not there). A place of another type
    (not readable, or edited into one since: its ZMSCORE refused) lists nothing."""
    out: dict[str, list[int | None]] = {p: [None] * n for p in PLACES}
    for place, reply in zip(readable, replies, strict=True):
        if not isinstance(reply, Exception):
            out[place] = [None if s is None else _score_ms(s) for s in reply]
    return out


def _due(at: Mapping[str, list[int | None]], n: int) -> int | None:
    """The due score of id n: in due, else in flow:held (set aside by flow control: due)."""
    due = at["due"][n]
    return at["flow_held"][n] if due is None else due


def job_suspects(
    client: redis.Redis, ctx: Context, readable: Sequence[str], page: Sequence[str]
) -> list[str]:
    """The ids of this SCAN page of job keys whose reads (hash, spec record, places) break a
    rule."""
    keys = ctx.keys
    ids = [key[len(keys.prefix + "job:") :] for key in page]
    pipe = client.pipeline(transaction=False)
    for key, jid in zip(page, ids, strict=True):
        pipe.type(key)
        pipe.hgetall(key)
        pipe.pttl(key)
        pipe.get(keys.spec(jid))
        pipe.pttl(keys.spec(jid))
    _ask_scores(pipe, keys, readable, ids)
    reply = pipe.execute(raise_on_error=False)
    at = _scores(reply[_JOB_READS * len(ids) :], readable, len(ids))
    out: list[str] = []
    for n, jid in enumerate(ids):
        t, h, pttl, spec, spec_pttl = reply[_JOB_READS * n : _JOB_READS * (n + 1)]
        due_ms = _due(at, n)
        t, fields = _with_spec(str(t), _hash_reply(h), spec, due_ms)
        dead = 0 if at["dead"][n] is None else 1
        ttl, kept = _ttl(pttl, spec_pttl), _kept(pttl, spec_pttl)
        s = Snapshot(jid, t, fields, ttl, due_ms, at["leased"][n], dead, kept=kept)
        if diagnose(s, ctx):
            out.append(jid)
    return out


def spec_page(
    node: redis.Redis, keys: QueueKeys, readable: Sequence[str], page: Sequence[str]
) -> tuple[list[str], dict[str, int]]:
    """This SCAN page of spec record keys: (the ids in no place with no job hash, orphan
    suspects; the ids in due or flow:held alone, with their due score, for doctor_pending's
    cheap read of the record: one with a hash too is also read whole by job_suspects). One in
    leased or dead is unrecorded()'s when it has no hash, job_suspects' when it has."""
    ids = [key[len(keys.prefix + "spec:") :] for key in page]
    pipe = node.pipeline(transaction=False)
    _ask_scores(pipe, keys, readable, ids)
    at = _scores(pipe.execute(raise_on_error=False), readable, len(ids))
    placeless: list[str] = []
    pending: dict[str, int] = {}
    for n, jid in enumerate(ids):
        if at["leased"][n] is not None or at["dead"][n] is not None:
            continue
        due_ms = _due(at, n)
        if due_ms is None:
            placeless.append(jid)  # most often a finished job's record, with its hash
        else:
            pending[jid] = due_ms
    return _lacking(node, placeless, lambda jid: (keys.job(jid),)), pending


def unrecorded(client: redis.Redis, keys: QueueKeys, place: str, ids: Sequence[str]) -> list[str]:
    """Of this ZSCAN page of a place's ids, those neither job_suspects nor spec_page reads:
    leased or dead with no hash, due or held with no record at all (one with its spec record
    alone is a pending job, read by spec_page)."""
    if place in ("leased", "dead"):
        return _lacking(client, ids, lambda jid: (keys.job(jid),))
    return _lacking(client, ids, lambda jid: (keys.spec(jid), keys.job(jid)))


def _lacking(
    client: redis.Redis, ids: Sequence[str], records: Callable[[str], tuple[str, ...]]
) -> list[str]:
    """Of `ids`, those none of whose `records` keys exists. One EXISTS of each id's first key
    first: when it counts them all (the usual page) that is the answer, one call instead of
    one an id (EXISTS counts a key named twice twice: a duplicate id cannot hide a missing one)."""
    if not ids or int(client.exists(*(records(jid)[0] for jid in ids))) == len(ids):
        return []
    pipe = client.pipeline(transaction=False)
    for jid in ids:
        pipe.exists(*records(jid))
    return [jid for jid, n in zip(ids, pipe.execute(), strict=True) if not int(n)]


# -- queue-level findings: a place no job check can read -------------------------------------
# What a key of another type in each place stops (a claim, a report, a listing fails on it).
_PLACE_ROLE = {
    "due": "no job can be enqueued to or claimed from it",
    "leased": "claims and reports of this queue fail on it",
    "dead": "no job can be dead-lettered, listed dead or requeued",
    "flow_held": "no job can be set aside by flow control or read as held",
    "dead_migrating": "an old dead LIST is not converted through it, and claims and parks fail "
    "until it is deleted (with no dead LIST it is unused: delete it)",
}


def wrong_type_place(queue: str, place: str, key: str, key_type: str) -> Issue:
    """A queue's due / leased / dead / flow:held / dead:migrating key of another type (written
    by hand): read as empty, so the jobs it should list show up as other findings."""
    return Issue(
        "wrong-type",
        "error",
        f"{key} is a {key_type}, not a ZSET: {_PLACE_ROLE[place]}",
        f"inspect it: redis-cli TYPE {shlex.quote(key)}",
        queue,
    )
