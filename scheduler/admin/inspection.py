"""Read-only views for operators (the CLI and the doctor): queue discovery, recent outcome
counts from the per-minute stats hashes, key listings; live workers in admin/workers.py.
Nothing here writes, but for the queue index a listing fills after its first SCAN."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

# Where the doctor, the CLI and the dashboard have always imported them from.
from scheduler.admin.workers import WorkerInfo as WorkerInfo
from scheduler.admin.workers import live_workers as live_workers
from scheduler.core import queue_index
from scheduler.core.connection import UNREACHABLE, is_cluster, named_primaries, node_for_key
from scheduler.core.errors import BadArgument, UnreadableRecord
from scheduler.core.keys import ROOT, QueueKeys, check_queue_name
from scheduler.core.partitions import PARTITION_NAME, Layout, meta_key
from scheduler.core.vocabulary import STAT_FIELDS, stat_field

STATS_KEEP_MINUTES = 120  # lua/lib/util.lua bump_stat keeps each minute 2 h
WINDOWS_MIN = (1, 5, 60)
_SCAN_COUNT = 1000
_QUEUE_IN_KEY = re.compile(r"^" + ROOT + r":\{([^}]*)\}:")


def server_now_ms(client: redis.Redis, keys: QueueKeys | None = None) -> int:
    """The Redis server's clock: the only clock the scripts use (on a cluster, the clock of
    the primary owning `keys`' slot, the one its scripts read)."""
    sec, usec = (node_for_key(client, keys.prefix) if keys else client).time()
    return int(sec) * 1000 + int(usec) // 1000


def discover_queues(client: redis.Redis, unreachable: list[str] | None = None) -> list[str]:
    """Queue names that hold jobs, workers or schedules: from the queue index (core/
    queue_index.py), else found with SCAN (never KEYS), whose names then fill the index.
    Typed scans skip the job hashes, so the transfer stays small on a large keyspace. A key
    whose queue part is not a valid queue name (written by hand, or hostile) is skipped. On a
    Redis Cluster every primary is scanned (each holds the queues of its slots). With
    `unreachable` (a list), a cluster node that cannot answer is skipped, its queues unlisted,
    and named there ("host:port: error"); one server, or every node, unreachable raises."""
    try:
        indexed = queue_index.listed(client)
    except UNREACHABLE:
        if not is_cluster(client):
            raise
        indexed = None  # the index's node is down: the other nodes' queues, by SCAN
    if indexed is not None:
        return indexed
    failed = len(unreachable) if unreachable is not None else 0
    names = _scan_queues(client, unreachable)
    if (len(unreachable) if unreachable is not None else 0) == failed:  # every node scanned
        queue_index.add_scanned(client, names)
    return names


def _scan_queues(client: redis.Redis, unreachable: list[str] | None) -> list[str]:
    names: set[str] = set()
    nodes = named_primaries(client)
    for name, node in nodes:
        try:
            for key_type in ("zset", "list"):
                match = f"{ROOT}:{{*}}:*"
                for key in node.scan_iter(match=match, count=_SCAN_COUNT, _type=key_type):
                    m = _QUEUE_IN_KEY.match(str(key))
                    if m:
                        names.add(m.group(1))
        except UNREACHABLE as exc:
            if unreachable is None or len(nodes) == 1:
                raise
            unreachable.append(f"{name}: {exc}")
            if len(unreachable) == len(nodes):
                raise
    return sorted(n for n in names if _valid_queue(n))


def stored_layout(client: redis.Redis, queue: str) -> Layout | None:
    """`queue`'s partition layout (core/partitions.py), None for a plain queue: one GET.
    UnreadableRecord when the record is not one this version wrote, or not a string."""
    try:
        raw = client.get(meta_key(queue))
    except redis.ResponseError as exc:
        if not str(exc).startswith("WRONGTYPE"):
            raise
        raise UnreadableRecord(f"the partition record of queue {queue!r} is not a string") from None
    return None if raw is None else Layout.parse(queue, str(raw))


def group_partitions(client: redis.Redis, names: Sequence[str]) -> list[str]:
    """`names` with each partition replaced by its logical queue (when the logical queue's
    stored layout lists it), so a partitioned queue is listed once. One GET per candidate
    logical name; an unreadable layout record leaves its partitions listed as plain queues."""
    layouts: dict[str, Layout | None] = {}
    out: dict[str, None] = {}
    for name in names:
        logical = m.group(1) if (m := PARTITION_NAME.match(name)) else ""
        if logical and logical not in layouts:
            try:
                layouts[logical] = stored_layout(client, logical)
            except BadArgument:
                layouts[logical] = None
        layout = layouts.get(logical)
        out[logical if layout and name in layout.names else name] = None
    return sorted(out)


def logical_queues(client: redis.Redis, unreachable: list[str] | None = None) -> list[str]:
    """discover_queues (`unreachable` as there) with each partitioned queue listed once,
    under its logical name."""
    return group_partitions(client, discover_queues(client, unreachable))


def physical_queues(
    client: redis.Redis, names: Sequence[str], damaged: dict[str, str] | None = None
) -> list[str]:
    """`names` with each partitioned queue replaced by its partitions (each an ordinary
    queue: what the doctor checks and where workers register). A queue whose partition record
    cannot be read raises UnreadableRecord; given `damaged`, it is listed as itself (its own
    keys) and named there with the reason, so one hand edit does not hide every queue."""
    out: list[str] = []
    for name in names:
        try:
            layout = stored_layout(client, name)
        except UnreadableRecord as exc:
            if damaged is None:
                raise
            damaged[name], layout = str(exc), None
        out.extend(layout.names if layout else [name])
    return list(dict.fromkeys(out))


def _valid_queue(name: str) -> bool:
    try:
        check_queue_name(name)
    except BadArgument:
        return False
    return True


def queue_exists(client: redis.Redis, keys: QueueKeys, now_ms: int) -> bool:
    """Anything of this queue alive: its sets, workers, schedules, its config (a paused empty
    queue has only that), or a recent stats minute.
    One EXISTS over fixed names (all in one slot), so it costs the same on any keyspace."""
    return int(client.exists(*existence_keys(keys, now_ms))) > 0


def existence_keys(keys: QueueKeys, now_ms: int) -> list[str]:
    """The names queue_exists looks at (all in the queue's slot)."""
    minute = now_ms // 60_000
    names = [keys.due, keys.leased, keys.dead, keys.workers, keys.schedules, keys.config]
    return names + [keys.stats(minute - i) for i in range(STATS_KEEP_MINUTES + 1)]


def window_counts(
    client: redis.Redis, keys: QueueKeys, now_ms: int, windows_min: Sequence[int] = WINDOWS_MIN
) -> dict[str, dict[str, int]]:
    """Outcome counts over the last N minutes, for each N: the N newest minute buckets,
    the current (partial) minute included. Keyed '1m', '5m', '60m'."""
    span = max(windows_min)
    minute = now_ms // 60_000
    pipe = client.pipeline(transaction=False)
    for i in range(span):
        pipe.hgetall(keys.stats(minute - i))
    buckets: list[dict[str, Any]] = pipe.execute()
    out: dict[str, dict[str, int]] = {}
    for n in windows_min:
        totals = dict.fromkeys(STAT_FIELDS, 0)
        for bucket in buckets[:n]:
            for name, value in bucket.items():
                field = stat_field(str(name))  # a bucket from before the rename counts too
                if field not in totals:
                    continue  # e.g. the claim's late_* fields: a summed late_max_ms means nothing
                try:
                    totals[field] += int(value)
                except ValueError:
                    continue
        out[f"{n}m"] = totals
    return out


@dataclass(frozen=True)
class KeyInfo:
    key: str
    type: str  # 'none' when the key does not exist (an empty set is deleted by Redis)
    size: int
    ttl_ms: int | None  # None: no expiry
    about: str

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


@dataclass(frozen=True)
class KeyFamily:
    pattern: str
    about: str
    count: int

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


_SIZE_CMD = {"zset": "ZCARD", "list": "LLEN", "hash": "HLEN", "set": "SCARD", "string": "STRLEN"}


def fixed_keys(client: redis.Redis, keys: QueueKeys) -> list[KeyInfo]:
    """The queue's fixed keys with type, size and expiry (two pipelined round trips)."""
    named = [
        (keys.due, "ZSET job id -> run_at_ms (due now and scheduled later)"),
        (keys.leased, "ZSET job id -> lease_until_ms"),
        (keys.dead, "ZSET dead job id -> dead_ms"),
        (keys.wake, "LIST wake-up tokens for idle workers"),
        (keys.workers, "ZSET worker id -> last_seen_ms"),
        (keys.schedules, "recurring schedules index"),
    ]
    pipe = client.pipeline(transaction=False)
    for name, _ in named:
        pipe.type(name)
        pipe.pttl(name)
    replies = pipe.execute()
    types = [str(t) for t in replies[0::2]]
    ttls = [int(t) for t in replies[1::2]]
    pipe = client.pipeline(transaction=False)
    for (name, _), t in zip(named, types, strict=True):
        pipe.execute_command(_SIZE_CMD.get(t, "EXISTS"), name)  # type: ignore[no-untyped-call]
    sizes = [int(v) for v in pipe.execute()]
    return [
        KeyInfo(name, t, size if t in _SIZE_CMD else 0, ttl if ttl >= 0 else None, about)
        for (name, about), t, size, ttl in zip(named, types, sizes, ttls, strict=True)
    ]


# (prefix, suffix, about); the first that fits counts a key. A schedule name has no ':'
# (limits.SCHEDULE_NAME_RE): a cron schedule's `schedule:<name>:slots` ZSET is told from the
# schedule hashes by its suffix, and listed before them.
_FAMILIES = (
    ("job:", "", "HASH one per claimed job (or older layout): state, attempts, token, worker, ..."),
    ("spec:", "", "STRING a job's spec record: 2|task|max_attempts|backoff|...|payload"),
    ("stats:", "", "HASH per-minute outcome counters (kept 2 h)"),
    ("idem:", "", "STRING idempotency key digest -> job id [last debounced calls: id, id=job]"),
    ("claim:", "", "STRING claim replay answers (kept one lease)"),
    ("worker:", "", "HASH one per live worker (expires when it stops)"),
    ("worker_stop:", "", "STRING a quiet / stop asked of a worker, until its next beat (expires)"),
    ("schedule:", ":slots", "ZSET a cron schedule's next slot times (one per cron schedule)"),
    ("schedule:", "", "HASH one per recurring schedule (its pattern matches the ZSETs above too)"),
)


MAX_KEYS = 1_000_000  # key_families' default bound: `scheduler keys --max-keys` changes it


def key_families(
    client: redis.Redis, keys: QueueKeys, *, max_keys: int = MAX_KEYS
) -> tuple[list[KeyFamily], bool]:
    """Count the per-item keys of the queue by family with one SCAN over its pattern,
    stopping after max_keys (bounded work on a huge queue), and whether it stopped there with
    keys left uncounted (the counts are then lower bounds)."""
    counts = [0] * len(_FAMILIES)
    seen, cut = 0, False
    node = node_for_key(client, keys.prefix)  # a queue's keys share one slot: one node
    for key in node.scan_iter(match=keys.pattern(), count=_SCAN_COUNT):
        if seen >= max_keys:  # one key beyond the bound: the listing is cut
            cut = True
            break
        rest = str(key)[len(keys.prefix) :]
        for i, (p, suffix, _) in enumerate(_FAMILIES):
            # After the prefix: a schedule named 'slots' is a hash, not a slots ZSET.
            if rest.startswith(p) and rest[len(p) :].endswith(suffix):
                counts[i] += 1
                break
        seen += 1
    out = [
        KeyFamily(keys.prefix + p + "*" + suffix, about, n)
        for (p, suffix, about), n in zip(_FAMILIES, counts, strict=True)
    ]
    out.append(KeyFamily(keys.pattern(), "all keys of the queue", seen))
    return out, cut


def iter_chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
