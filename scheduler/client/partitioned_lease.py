"""The manual lease API of a partitioned queue: PartitionedQueue's claim, heartbeat,
set_progress, fail, release and complete_many, and the settings written to every partition,
set_dead_retention and set_priority_aging (each partition checked first, as pause's:
partitioned_change.checked_change_sync); a mixin. The plan and the merges are shared with the
asyncio twin, partitioned_lease_aio.py.

claim asks every partition in one driver call per node (run_answering), each for its share of
`limit`: an even split, the remainder to the partitions from a start the call's nonce picks
(random per call, the same for a re-sent nonce), so a busy partition does not starve the
others. A partition that took its whole share and has more due (next_ms <= now_ms) gets what
the others left in a second call, when every partition answered the first. The batch keeps
each partition's claim order (aged, then priority, then run_at), the partitions taking turns
from the start partition. A partition whose node does not answer is left out while others
answer: the batch names it (`not_reached`) and carries the others' jobs, never an exception
hiding leased jobs. The calls by job id group the ids by the partition each routes to (one
driver call per node); an id answered 'missing' that carries no partition tag (a job written
to a partition's own queue) is asked for in the other partitions (one more call)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from scheduler.client.partitioned_change import checked_change_sync
from scheduler.client.partitioned_ids import holding_sync, looked_up
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
from scheduler.client.partitioned_merge import PartitionsNotReached
from scheduler.client.partitioned_partial import answering_sync
from scheduler.client.queue import Queue
from scheduler.core.limits import DEFAULT_LEASE_MS, check_int, check_lease, lease_pairs
from scheduler.core.models import FailOutcome
from scheduler.core.partitions import Layout
from scheduler.core.progress import encode_progress
from scheduler.operations.ops import Op

if TYPE_CHECKING:
    from scheduler.client.partitioned import PartitionedQueue

__all__ = ["PartitionedClaimBatch", "PartitionedLeasing"]


class PartitionedLeasing:
    """PartitionedQueue's manual lease API (documented on Queue; the differences here)."""

    parts: list[Queue]
    layout: Layout

    def claim(
        self,
        worker_id: str,
        *,
        limit: int = 100,
        lease_ms: int = DEFAULT_LEASE_MS,
        reap_limit: int = 100,
        nonce: str | None = None,
    ) -> PartitionedClaimBatch:
        """`Queue.claim` over every partition: at most `limit` jobs in all, shared fairly
        (module docstring), one driver call per node, a second one when partitions that took
        their share have more due. Returns a `PartitionedClaimBatch`, its `jobs` in each
        partition's claim order (as `Queue.claim`'s), the partitions taking turns; a
        partition whose node does not answer is named in its `not_reached` while others answer
        (any job its lost reply leased is retried when that lease lapses; re-send `nonce` to
        get them back). None answering: the first error is raised. BadArgument: nothing was
        leased. A last-attempt suspect comes back alone: what the other partitions leased is
        given back (docs/durability.md, "Contained failure")."""
        q = cast("PartitionedQueue", self)
        nonce = claim_checked(worker_id, limit, lease_ms, reap_limit, nonce)
        order = turn_order(len(self.parts), claim_start(len(self.parts), nonce))
        shares = split(order, limit)
        make = refusing(claimer(self.parts, worker_id, shares, lease_ms, reap_limit, nonce))
        rounds = [first_round(answering_sync(q, make, self.parts))]
        final = alone(order, rounds[0])
        if final is None and (more := second_round(order, shares, rounds[0], limit)):
            make = refusing(claimer(self.parts, worker_id, more, lease_ms, 0, round_nonce(nonce)))
            asked = [self.parts[k] for k in more]
            rounds.append(dict(zip(more, kept(looked_up(q, make, asked)), strict=True)))
        elif final is not None and (others := besides(rounds, final)):
            try:  # given back, attempts returned: a job not given back is still the caller's
                statuses: list[Any] = self.release(others)
            except PartitionsNotReached as exc:
                statuses = exc.partial
            except Exception:  # its answer lost: a heartbeat tells which are still the caller's
                try:
                    held = self.heartbeat(others, lease_ms=lease_ms)[1]
                    statuses = [None if held.get(i) == "held" else "gone" for i, _ in others]
                except Exception:
                    statuses = []
            rounds = without(rounds, others, statuses)
        return merged_claim(self.parts, order, rounds)

    def _by_id(
        self,
        what: str,
        items: Sequence[Any],
        make: Callable[[Queue, list[Any]], Op[list[str]]],
    ) -> list[Any]:
        """make(partition, its items) -> their statuses, for items (job_id first) grouped by
        the partition each id routes to; strays looked for elsewhere (module docstring)."""
        q = cast("PartitionedQueue", self)
        ids = [it[0] for it in items]
        out: list[Any] = [None] * len(items)
        why: Why = {}
        for first in (True, False):
            groups = routed_items(self.layout, ids) if first else strays(self.layout, ids, out)
            if not groups:
                continue
            asked = [self.parts[k] for k in groups]
            lookup = answering_sync if first else looked_up  # none answering: raised / errors
            each = lookup(q, for_items(self.parts, groups, items, make), asked)
            place(self.parts, groups, each, out, why, first)
        settled(what, self.parts, why, out)
        return out

    def heartbeat(
        self, leases: Sequence[tuple[str, str]], *, lease_ms: int = DEFAULT_LEASE_MS
    ) -> tuple[int, dict[str, str]]:
        """`Queue.heartbeat` of leases from any partitions (one driver call per node):
        `lease_until_ms` is the earliest partition's. PartitionsNotReached when some partitions
        do not answer: `partial` is (lease_until_ms, the statuses of the others' leases)."""
        lease_pairs(leases)
        check_int(lease_ms, "lease_ms")
        if not leases:
            return self.parts[0].heartbeat([], lease_ms=lease_ms)
        untils: list[int] = []
        try:
            got = self._by_id("heartbeat", leases, lambda p, sub: beat(p, sub, lease_ms, untils))
        except PartitionsNotReached as exc:
            exc.partial = beats(leases, exc.partial, untils)
            raise
        return beats(leases, got, untils)

    def set_progress(self, job_id: str, token: str, progress: Any) -> str:
        """`Queue.set_progress` on the job's partition."""
        check_lease(job_id, token)
        text = encode_progress(progress)
        return str(self._by_id("set_progress", [(job_id, token, text)], progressed)[0])

    def complete_many(self, items: Sequence[tuple[str, str, Any]]) -> list[str]:
        """`Queue.complete_many` of jobs from any partitions (one driver call per node), the
        statuses in the items' order. PartitionsNotReached when some partitions do not answer:
        `partial` is that list with None for their items (re-send those: a completion sent
        again with its token answers 'done' again)."""
        checked = completions(items, self.parts[0].ops.settings.max_payload_bytes)
        return self._by_id("complete_many", checked, lambda p, sub: p.ops.complete_many(sub))

    def fail(
        self,
        job_id: str,
        token: str,
        error: BaseException | tuple[str, str, str],
        *,
        retryable: bool = True,
        delay_ms: int | None = None,
    ) -> FailOutcome:
        """`Queue.fail` on the job's partition (else the one holding it, as `complete`)."""
        q = cast("PartitionedQueue", self)
        return holding_sync(
            q,
            job_id,
            lambda p: p.fail(job_id, token, error, retryable=retryable, delay_ms=delay_ms),
        )

    def release(self, leases: Sequence[tuple[str, str]]) -> list[str]:
        """`Queue.release` of leases from any partitions (one driver call per node), the
        statuses in the leases' order. PartitionsNotReached as complete_many's."""
        lease_pairs(leases)
        return self._by_id("release", leases, lambda p, sub: p.ops.release(sub))

    def set_dead_retention(
        self, max_age_ms: int | None = None, max_count: int | None = None
    ) -> None:
        """`Queue.set_dead_retention` on every partition (each keeps `max_count` of its own).
        Every partition is checked first: one refusing (a config of another type, a newer
        version's storage) refuses the change, nothing written. PartitionsNotReached when some
        partitions do not answer: those answering took it; call it again (it is idempotent)."""
        # No `lost` (pause's changed_if_lost): a setter's write asked again after its reply was
        # lost sets the same value again and answers None, as the first would have.
        checked_change_sync(
            self,
            "set_dead_retention",
            lambda p: p.ops.check_dead_retention(max_age_ms, max_count),
            lambda p: p.ops.set_dead_retention(max_age_ms, max_count),
        )

    def set_priority_aging(self, priority_aging_ms: int | None) -> None:
        """`Queue.set_priority_aging` on every partition: each claim reads its own partition's
        config, never the logical name's (a hand HSET there is read by no claim). Every
        partition is checked first, as set_dead_retention's. PartitionsNotReached when some
        partitions do not answer: those answering took it; call it again (it is idempotent)."""
        checked_change_sync(
            self,
            "set_priority_aging",
            lambda p: p.ops.check_priority_aging(priority_aging_ms),
            lambda p: p.ops.set_priority_aging(priority_aging_ms),
        )
