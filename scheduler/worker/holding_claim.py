"""The worker's AsyncQueue: its `claim` also says what the worker holds (worker/alone.py), which
claim.lua needs to run a suspect on its last attempt alone. The public `claim` does not take it:
a caller of the manual API that does not say is leased such a suspect as its call's only job."""

from __future__ import annotations

from scheduler.client.aio import AsyncQueue
from scheduler.core.limits import DEFAULT_LEASE_MS
from scheduler.core.models import ClaimBatch


class HoldingClaim(AsyncQueue):
    async def claim(
        self,
        worker_id: str,
        *,
        limit: int = 100,
        lease_ms: int = DEFAULT_LEASE_MS,
        reap_limit: int = 100,
        nonce: str | None = None,
        holding: int | None = None,
        drained_for: str | None = None,
    ) -> ClaimBatch:
        """AsyncQueue.claim, plus `holding` (how many leases the worker holds) and
        `drained_for` (the suspect it drains for: ClaimBatch.drain)."""
        return await self._run(self.ops.claim(worker_id, limit=limit, lease_ms=lease_ms,
                                              reap_limit=reap_limit, nonce=nonce, holding=holding,
                                              drained_for=drained_for))  # fmt: skip
