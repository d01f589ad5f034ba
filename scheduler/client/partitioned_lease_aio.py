"""AsyncPartitionedQueue's manual lease API: partitioned_lease.py's mixin for asyncio (the
same plan and merges, partitioned_lease_plan.py; the nodes' calls concurrently)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from scheduler.client.aio import AsyncQueue
from scheduler.client.partitioned_change import checked_change_async
from scheduler.client.partitioned_ids import holding_async
from scheduler.client.partitioned_lease_plan import (
    PartitionedClaimBatch,
    Why,
    alone,
    beat,
    beats,
    besides,
    claim_checked,
    claim_start,
    claimer,
    completions,
    first_round,
    for_items,
    kept,
    merged_claim,
    place,
    progressed,
    refusing,
    round_nonce,
    routed_items,
    second_round,
    settled,
    split,
    strays,
    turn_order,
    without,
)
from scheduler.client.partitioned_merge import PartitionsNotReached, not_answering
from scheduler.client.partitioned_partial import answering_async
from scheduler.core.limits import DEFAULT_LEASE_MS, check_int, check_lease, lease_pairs
from scheduler.core.models import FailOutcome
from scheduler.core.partitions import Layout
from scheduler.core.progress import encode_progress
from scheduler.operations.ops import Op

if TYPE_CHECKING:
    from scheduler.client.partitioned_aio import AsyncPartitionedQueue


async def looked_up_async(
    q: Any, make: Callable[[Any], Op[Any]], asked: Sequence[Any]
) -> list[Any]:
    """partitioned_ids.looked_up for asyncio: none answering gives each its error."""
    try:
        return await answering_async(q, make, asked)
    except Exception as exc:
        if not not_answering(exc):
            raise
        return [exc] * len(asked)


class AsyncPartitionedLeasing:
    """AsyncPartitionedQueue's manual lease API (PartitionedQueue's, as coroutines)."""

    parts: list[AsyncQueue]
    layout: Layout

    async def claim(
        self,
        worker_id: str,
        *,
        limit: int = 100,
        lease_ms: int = DEFAULT_LEASE_MS,
        reap_limit: int = 100,
        nonce: str | None = None,
    ) -> PartitionedClaimBatch:
        """PartitionedQueue.claim for asyncio: a `PartitionedClaimBatch`."""
        nonce = claim_checked(worker_id, limit, lease_ms, reap_limit, nonce)
        order = turn_order(len(self.parts), claim_start(len(self.parts), nonce))
        shares = split(order, limit)
        make = refusing(claimer(self.parts, worker_id, shares, lease_ms, reap_limit, nonce))
        rounds = [first_round(await answering_async(self, make, self.parts))]
        final = alone(order, rounds[0])
        if final is None and (more := second_round(order, shares, rounds[0], limit)):
            make = refusing(claimer(self.parts, worker_id, more, lease_ms, 0, round_nonce(nonce)))
            asked = [self.parts[k] for k in more]
            rounds.append(
                dict(zip(more, kept(await looked_up_async(self, make, asked)), strict=True))
            )
        elif final is not None and (others := besides(rounds, final)):
            try:  # PartitionedQueue.claim's: what is not given back is still the caller's
                statuses: list[Any] = await self.release(others)
            except PartitionsNotReached as exc:
                statuses = exc.partial
            except Exception:
                try:
                    held = (await self.heartbeat(others, lease_ms=lease_ms))[1]
                    statuses = [None if held.get(i) == "held" else "gone" for i, _ in others]
                except Exception:
                    statuses = []
            rounds = without(rounds, others, statuses)
        return merged_claim(self.parts, order, rounds)

    async def _by_id(
        self,
        what: str,
        items: Sequence[Any],
        make: Callable[[AsyncQueue, list[Any]], Op[list[str]]],
    ) -> list[Any]:
        """PartitionedQueue._by_id for asyncio."""
        ids = [it[0] for it in items]
        out: list[Any] = [None] * len(items)
        why: Why = {}
        for first in (True, False):
            groups = routed_items(self.layout, ids) if first else strays(self.layout, ids, out)
            if not groups:
                continue
            asked = [self.parts[k] for k in groups]
            lookup = answering_async if first else looked_up_async
            each = await lookup(self, for_items(self.parts, groups, items, make), asked)
            place(self.parts, groups, each, out, why, first)
        settled(what, self.parts, why, out)
        return out

    async def heartbeat(
        self, leases: Sequence[tuple[str, str]], *, lease_ms: int = DEFAULT_LEASE_MS
    ) -> tuple[int, dict[str, str]]:
        """PartitionedQueue.heartbeat for asyncio."""
        lease_pairs(leases)
        check_int(lease_ms, "lease_ms")
        if not leases:
            return await self.parts[0].heartbeat([], lease_ms=lease_ms)
        untils: list[int] = []
        try:
            got = await self._by_id(
                "heartbeat", leases, lambda p, sub: beat(p, sub, lease_ms, untils)
            )
        except PartitionsNotReached as exc:
            exc.partial = beats(leases, exc.partial, untils)
            raise
        return beats(leases, got, untils)

    async def set_progress(self, job_id: str, token: str, progress: Any) -> str:
        """PartitionedQueue.set_progress for asyncio."""
        check_lease(job_id, token)
        text = encode_progress(progress)
        return str((await self._by_id("set_progress", [(job_id, token, text)], progressed))[0])

    async def complete_many(self, items: Sequence[tuple[str, str, Any]]) -> list[str]:
        """PartitionedQueue.complete_many for asyncio."""
        checked = completions(items, self.parts[0].ops.settings.max_payload_bytes)
        return await self._by_id("complete_many", checked, lambda p, sub: p.ops.complete_many(sub))

    async def fail(
        self,
        job_id: str,
        token: str,
        error: BaseException | tuple[str, str, str],
        *,
        retryable: bool = True,
        delay_ms: int | None = None,
    ) -> FailOutcome:
        """PartitionedQueue.fail for asyncio."""
        q = cast("AsyncPartitionedQueue", self)
        return await holding_async(
            q,
            job_id,
            lambda p: p.fail(job_id, token, error, retryable=retryable, delay_ms=delay_ms),
        )

    async def release(self, leases: Sequence[tuple[str, str]]) -> list[str]:
        """PartitionedQueue.release for asyncio."""
        lease_pairs(leases)
        return await self._by_id("release", leases, lambda p, sub: p.ops.release(sub))

    async def set_dead_retention(
        self, max_age_ms: int | None = None, max_count: int | None = None
    ) -> None:
        """PartitionedQueue.set_dead_retention for asyncio."""
        await checked_change_async(
            self,
            "set_dead_retention",
            lambda p: p.ops.check_dead_retention(max_age_ms, max_count),
            lambda p: p.ops.set_dead_retention(max_age_ms, max_count),
        )

    async def set_priority_aging(self, priority_aging_ms: int | None) -> None:
        """PartitionedQueue.set_priority_aging for asyncio."""
        await checked_change_async(
            self,
            "set_priority_aging",
            lambda p: p.ops.check_priority_aging(priority_aging_ms),
            lambda p: p.ops.set_priority_aging(priority_aging_ms),
        )
