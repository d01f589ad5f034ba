"""A suspect on its last attempt runs alone (lua/claim.lua): a crash of its worker parks it, so
no other job may share that process. The worker tells each claim how many leases it holds; it
claims nothing while it runs such a suspect, and drains when a claim answers `ClaimBatch.drain`:
it takes nothing new until it holds nothing, claiming that suspect's queue alone with
`drained_for` (each such claim renews its drainer mark and takes nothing while jobs are held;
the one with nothing held leases the suspect first)."""

from __future__ import annotations

import asyncio
import time

from scheduler.core.models import ClaimBatch
from scheduler.worker.core import WorkerCore


class Alone(WorkerCore):
    # The last-attempt suspect it drains for (queue, id; WorkerCore._alone: the one it holds),
    # and when its next claim renews the drainer mark (monotonic; the mark lasts a lease).
    _drain_for: tuple[str, str] | None = None
    _drain_until_s = 0.0

    def _holding(self) -> int:
        """What a claim is told this worker holds: its leases. Not the handler threads running
        past their end (a timed-out sync handler): one that never returns would keep the worker
        from its last-attempt suspect for good, which may be that run's own job (held back
        behind it, then parked: tests/test_untimed_held_back.py)."""
        return min(len(self._held), 1000)

    def _claims_closed(self) -> bool:
        """Claim nothing: a last-attempt suspect runs (until its lease is gone: _forget), or the
        worker drains for one while it holds anything, until its mark is due for renewal."""
        if self._alone is not None and self._alone in self._suspects:
            return True
        return bool(self._drain_for and self._holding()) and time.monotonic() < self._drain_until_s

    def _note_alone(self, queue: str, batch: ClaimBatch, now_s: float) -> None:
        """After a claim of `queue` (its jobs held): the suspect it leased, if on its last
        attempt; a drain told (again), else none: the one drained for ended, or was taken."""
        if batch.suspect is not None and any(
            j.id == batch.suspect and j.attempts >= j.max_attempts for j in batch.jobs
        ):
            self._alone = (queue, batch.suspect)
        if batch.drain is not None and self._holding():
            self._drain_for = (queue, batch.drain)
            wait_s = self.settings.lease_ms / 2000  # renewed twice a lease: the mark stays
            self._drain_until_s = now_s + wait_s
            asyncio.get_running_loop().call_later(wait_s, self._slot_free.set)
        elif self._drain_for is not None and self._drain_for[0] == queue:
            self._drain_for = None
