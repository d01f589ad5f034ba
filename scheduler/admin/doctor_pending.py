"""The doctor's cheap first read of the jobs that are their spec record alone (enqueued, never
claimed: no hash), most of a big backlog: one STRLEN, PTTL and GET each, paged, instead of the
atomic snapshot the other ids get (a scale audit: 90 s and 936 MB of client for 1M pending
jobs, with nothing wrong). Only those this read finds suspect go on to the snapshot. The GETs
of a page go in pipelines of at most _PAGE_BYTES of records, by their STRLEN."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from scheduler.admin.doctor_model import _PAGE, _PAGE_BYTES, MAX_SCORE_MS, _unreadable
from scheduler.admin.doctor_text import _has_undecodable
from scheduler.admin.inspection import iter_chunks
from scheduler.core.keys import QueueKeys
from scheduler.core.spec_record import with_spec


def unclaimed_suspects(
    node: Any, keys: QueueKeys, ids: Sequence[str], due: Mapping[str, int]
) -> list[str]:
    """Of `ids` (a page of them, in due or flow:held with a spec record when scanned, most with
    no job hash; `due` their due scores), those that may be wrong: the record gone or not a
    STRING, holding bytes that are not UTF-8, unreadable, or unusable as claim would read it
    (doctor_model._unreadable), an expiry on it, a due score that is no time. The rest are
    healthy pending jobs (a job claimed meanwhile is read as it was: claims keep its record;
    one with a hash is read whole as well, by doctor_scan.job_suspects)."""
    out: list[str] = []
    for page in iter_chunks(list(ids), _PAGE):
        pipe = node.pipeline(transaction=False)
        for jid in page:
            pipe.strlen(keys.spec(jid))
            pipe.pttl(keys.spec(jid))
        heads = pipe.execute(raise_on_error=False)
        sizes = [n if type(n) is int else 0 for n in heads[::2]]  # another type: GET says
        ttls = dict(zip(page, heads[1::2], strict=True))
        for part in _by_size(page, sizes):
            pipe = node.pipeline(transaction=False)
            for jid in part:
                # Raw bytes: a record holding bytes that are not UTF-8 is a finding (undecodable).
                pipe.execute_command("GET", keys.spec(jid), NEVER_DECODE=True)
            for jid, raw in zip(part, pipe.execute(raise_on_error=False), strict=True):
                score = due[jid]
                odd = not isinstance(raw, bytes) or ttls[jid] != -1
                odd = odd or not 0 <= score <= MAX_SCORE_MS
                text = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else ""
                if odd or _has_undecodable(text) or _unreadable(with_spec({}, text, score)):
                    out.append(jid)
    return out


def _by_size(ids: Sequence[str], sizes: Sequence[int]) -> Iterator[list[str]]:
    """`ids` in order, cut where their `sizes` pass _PAGE_BYTES (one alone may be more)."""
    part: list[str] = []
    total = 0
    for jid, n in zip(ids, sizes, strict=True):
        if part and total + n > _PAGE_BYTES:
            yield part
            part, total = [], 0
        part.append(jid)
        total += n
    if part:
        yield part
