"""Dead letters: find (dead_ids), requeue and purge the jobs that ran out of attempts.

The dead key is a ZSET id -> dead_ms (lua/lib/job.lua); a LIST left by an older version is
converted in bounded steps by whichever script touches it first. Readers that page the key here
drive the conversion to its end first (dead_migrate, at most 1,000 ids per call), so a page is
never read from a half-converted key."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.core import codec
from scheduler.core.errors import BadArgument
from scheduler.core.keys import QueueKeys
from scheduler.operations.requests import Commands, Op, OpsBase, Script


def dead_converted() -> Op[None]:
    """Finish converting an old dead LIST, one bounded script call at a time."""
    while int((yield Script("dead_migrate", []))) > 0:
        pass


def dead_page(keys: QueueKeys, offset: int, limit: int) -> Op[list[str]]:
    """Dead ids newest first (highest dead_ms), `limit` from `offset`."""
    yield from dead_converted()
    (ids,) = yield Commands([("ZRANGE", keys.dead, offset, offset + limit - 1, "REV")])
    return [codec.s(i) for i in ids]


def _retention_arg(value: int | None, name: str, lo: int, hi: int) -> str:
    if value is None:
        return ""
    codec._int(value, name)
    if not lo <= value <= hi:
        raise BadArgument(f"{name} must be in [{lo}, {hi}] or None, got {value}")
    return str(value)


class DeadLetterOps(OpsBase):
    """Dead letters; documented for users on Queue.dead_ids, requeue_dead, purge_dead."""

    def set_dead_retention(
        self, max_age_ms: int | None = None, max_count: int | None = None
    ) -> Op[None]:
        """Opt-in retention of this queue's dead letters (None: no limit; both None, the
        default, keeps every dead letter). Applied as jobs die, at most 100 of the oldest
        deleted per park, counted in stats as `dead_trimmed`."""
        age = _retention_arg(max_age_ms, "max_age_ms", 1, codec.MAX_TIME_MS)
        count = _retention_arg(max_count, "max_count", 0, codec.MAX_SAFE_INT)
        yield Script("dead_retention", [age, count])

    def dead_ids(
        self,
        *,
        task: str | None = None,
        error_type: str | None = None,
        older_than_ms: int | None = None,
        page: int = 1000,
    ) -> Op[list[str]]:
        """Dead ids (newest first) matching every filter given (all when none is)."""
        counts = yield from self.counts()
        out: list[str] = []
        start = 0
        while True:
            ids = yield from dead_page(self.keys, start, page)
            if not ids:
                return out
            start += len(ids)
            if task is None and error_type is None and older_than_ms is None:
                out.extend(ids)
                continue
            fields = yield Commands(
                [("HMGET", self.keys.job(i), "task", "last_error_type", "dead_ms") for i in ids]
            )
            for job_id, (t, et, dead_ms) in zip(ids, fields, strict=True):
                if task is not None and (t is None or codec.s(t) != task):
                    continue
                if error_type is not None and (et is None or codec.s(et) != error_type):
                    continue
                # A dead_ms that does not read as a number (hand-edited) matches no age filter.
                dead_at = codec.stored_int(dead_ms)
                if older_than_ms is not None and (
                    dead_at is None or counts.now_ms - dead_at < older_than_ms
                ):
                    continue
                out.append(job_id)

    def requeue_dead(self, ids: Sequence[str], batch_size: int = 500) -> Op[int]:
        """Move these dead jobs back to due with a fresh attempt budget; returns how many."""
        moved = 0
        for i in range(0, len(ids), batch_size):
            moved += int((yield Script("requeue_dead", list(ids[i : i + batch_size]))))
        return moved

    def purge_dead(self, ids: Sequence[str], batch_size: int = 500) -> Op[int]:
        """Delete these dead jobs for good; returns how many."""
        purged = 0
        for i in range(0, len(ids), batch_size):
            purged += int((yield Script("purge_dead", list(ids[i : i + batch_size]))))
        return purged
