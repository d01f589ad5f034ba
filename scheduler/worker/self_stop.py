"""Burst mode (`WorkerSettings.burst`, `scheduler worker --burst`): run what is claimable now,
then stop as after a SIGTERM. For tests, one-off drains and cron-driven batches."""

from __future__ import annotations

from scheduler.worker.core import WorkerCore
from scheduler.worker.execution import Running


class Burst(WorkerCore):
    """When a burst worker is done: a full round of claims took nothing and it holds nothing."""

    def _burst_next(self, rounded: bool) -> bool:
        """After a round of claims that took nothing and all answered. rounded: every queue
        was claimed from in it. True: claim again now (the worker may be stopping), False:
        wait as usual. Jobs held here (running, waiting to start or for their outcome to be
        acknowledged) may still release dependants or retry at once: not done yet."""
        if not rounded:  # a queue that sat the round out may have jobs due since
            self._skip_until.clear()
            return True
        if self._held or self._nonce:
            return False
        if self._wake.is_set():
            # Since the round's claims were sent: the last job held ended (its complete may
            # have released dependants those claims did not see), an enqueue, a retry due.
            return True
        self.log.info("burst: nothing claimable is left; stopping")
        self.request_stop()
        return True

    def _forget(self, r: Running) -> None:
        super()._forget(r)
        if self.settings.burst and not self._held:
            self._wake.set()  # the last job held ended: one more round decides
