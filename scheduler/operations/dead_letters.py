"""Dead letters: find (dead_ids), requeue and purge the jobs that ran out of attempts."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.core import codec
from scheduler.operations.requests import Commands, Op, OpsBase, Script


class DeadLetterOps(OpsBase):
    def dead_ids(
        self,
        *,
        task: str | None = None,
        error_type: str | None = None,
        older_than_ms: int | None = None,
        page: int = 1000,
    ) -> Op[list[str]]:
        """Ids on the dead list matching every filter given (all when none is)."""
        counts = yield from self.counts()
        out: list[str] = []
        start = 0
        while True:
            (ids,) = yield Commands([("LRANGE", self.keys.dead, start, start + page - 1)])
            ids = [codec.s(i) for i in ids]
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
