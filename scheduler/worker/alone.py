"""A suspect on its last attempt runs alone (lua/claim.lua): a crash of its worker parks it, so
no other job may share that process. The worker tells each claim how many leases it holds; it
claims nothing while it runs such a suspect, and drains (takes nothing until it holds nothing,
then claims that suspect first) when a claim answers `ClaimBatch.drain`."""

from __future__ import annotations

import asyncio
import time

from scheduler.core.models import ClaimBatch
from scheduler.worker.core import WorkerCore


class Alone(WorkerCore):
    # The last-attempt suspect it drains for (queue, id; WorkerCore._alone: the one it holds),
    # until when (monotonic; the suspect's drainer mark lapses then, claim.lua).
    _drain_for: tuple[str, str] | None = None
    _drain_until_s = 0.0

    def _claims_closed(self) -> bool:
        """Claim nothing: a last-attempt suspect runs (until its lease is gone: _forget), or the
        worker drains for one, until it holds nothing or the drain's time is up."""
        if self._alone is not None and self._alone in self._suspects:
            return True
        return bool(self._drain_for and self._held) and time.monotonic() < self._drain_until_s

    def _drained_for(self) -> tuple[str, str] | None:
        """The suspect drained for, once nothing is held: the next claim round asks its queue
        alone, with `held=0, drained_for=` its id."""
        return self._drain_for if self._drain_for and not self._held else None

    def _note_alone(self, queue: str, batch: ClaimBatch, now_s: float) -> None:
        """After a claim of `queue`: the suspect it leased, if on its last attempt; a drain."""
        if batch.suspect is not None and any(
            j.id == batch.suspect and j.attempts >= j.max_attempts for j in batch.jobs
        ):
            self._alone = (queue, batch.suspect)
        if batch.drain is not None and self._held:
            self._drain_for = (queue, batch.drain)
            wait_s = self.settings.lease_ms / 1000
            self._drain_until_s = now_s + wait_s
            # Then claim again even with jobs held (its slot wait ends).
            asyncio.get_running_loop().call_later(wait_s, self._slot_free.set)
