"""Leasing: what a worker does with a job (claim, heartbeat, complete, fail, release)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from scheduler.core import codec
from scheduler.core.errors import BadArgument, SchedulerError, raise_for_status
from scheduler.core.limits import DEFAULT_LEASE_MS
from scheduler.core.models import ClaimBatch, FailOutcome
from scheduler.core.progress import ProgressText, encode_progress
from scheduler.operations.requests import Op, OpsBase, Script, ScriptPipeline
from scheduler.operations.schedule_refill import refill as refill_schedules
from scheduler.schedules import recurring


def refill_most(claimed: int) -> int:
    """Cron schedules one claim refills: 2 per job it claimed (at least 20, at most 1,000 or
    as many as it claimed). Each claimed run asks for one refill at most (lib/rearm.lua), so
    requests cannot outgrow refills. A fixed 20 let 400 cron schedules defined together,
    claimed in one call a minute, run out of slots and lose runs
    (tests/test_schedules_scale.py)."""
    return min(max(20, 2 * claimed), max(1_000, claimed))


# A script runs alone on the server: one heartbeat of 100,000 leases held it 2.4 s, one
# complete_many of 50,000 3.2 s (bench/lua_call_bounds.py settle). A longer list goes as several
# calls of at most SETTLE_CHUNK items, in one pipeline (one round trip; other clients' commands
# run between them; each call atomic, and each item is on its own in any case).
SETTLE_CHUNK = 250
# complete_many's calls also carry at most this many bytes of their items' texts (one item
# alone may be more): a result may be 512 KiB, and 250 of them were one 125 MiB call (16 of
# them 8 MiB; 250 held the server 225 ms).
SETTLE_BYTES = 4 * 1024 * 1024


def _text_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def _starts(args: list[str], width: int, sized: bool) -> list[int]:
    """Where each call's items start in `args`: SETTLE_CHUNK items a call at most, and when
    `sized` at most SETTLE_BYTES of their texts (a call holds one item at least)."""
    step = SETTLE_CHUNK * width
    if not sized:
        return list(range(0, len(args), step)) or [0]
    starts, start, size = [0], 0, 0
    for i in range(0, len(args), width):
        item = sum(_text_bytes(a) for a in args[i : i + width])
        if i > start and (i - start >= step or size + item > SETTLE_BYTES):
            starts.append(i)
            start, size = i, 0
        size += item
    return starts


def _chunked(
    name: str, head: list[str], args: list[str], width: int, *, sized: bool = False
) -> Op[list[Any]]:
    """The replies (lists) of `name` over `args` (`width` per item) in calls of at most
    SETTLE_CHUNK items (and SETTLE_BYTES when `sized`), each after the same `head`, in order."""
    starts = _starts(args, width, sized)
    if len(starts) == 1:
        return [(yield Script(name, head + args))]
    ends = [*starts[1:], len(args)]
    calls = [Script(name, head + args[a:b]) for a, b in zip(starts, ends, strict=True)]
    return list((yield ScriptPipeline(calls)))


class LeasingOps(OpsBase):
    """A worker's calls; documented for users on Queue (claim, heartbeat, complete, fail,
    release), which drives these."""

    def claim(
        self,
        worker_id: str,
        *,
        limit: int = 100,
        lease_ms: int = DEFAULT_LEASE_MS,
        reap_limit: int = 100,
        nonce: str | None = None,
        holding: int | None = None,
        drained_for: str | None = None,
    ) -> Op[ClaimBatch]:
        """`nonce`: give the same one again when re-sending a call whose answer was lost:
        claim.lua then returns that call's jobs instead of leasing more (default: fresh).
        `holding`, `drained_for`: how many leases the worker holds, the suspect it drains for
        (claim.lua)."""
        nonce = codec.new_nonce() if nonce is None else nonce
        args = codec.claim_args(worker_id, limit, lease_ms, nonce, reap_limit, holding, drained_for)
        reply = yield Script("claim", args)
        batch = codec.parse_claim(reply)
        # Cron schedules running low on precomputed slots: refill on this same call.
        if recurring.refill_requested(reply, int(reply[2]), codec.CLAIM_FIELDS):
            try:
                most = refill_most(len(batch.jobs))
                placed_ms = yield from refill_schedules(self.keys, batch.now_ms, most=most)
            except (RedisError, SchedulerError):
                # The jobs are leased already: hand them out. The refill request stays in
                # Redis, and the next claim (by any client) tries again.
                return batch
            if placed_ms is not None and not 0 <= batch.next_ms <= placed_ms:
                batch = dataclasses.replace(batch, next_ms=placed_ms)
        return batch

    def heartbeat(
        self, leases: Sequence[tuple[str, str]], *, lease_ms: int
    ) -> Op[tuple[int, dict[str, str]]]:
        """`(lease_until_ms, {job_id: 'held' | 'expired' | 'stale' | 'cancelled' |
        'missing'})`; refusals are statuses, not exceptions."""
        args = codec.heartbeat_args(leases, lease_ms)
        replies = yield from _chunked("heartbeat", args[:1], args[1:], 2)
        # Each call's lease end: the earliest one stands for them all.
        until = min(int(codec.s(r[0])) for r in replies)
        return codec.parse_heartbeat([until, *(st for r in replies for st in r[1:])], leases)

    def progress(self, items: Sequence[tuple[str, str, Any]]) -> Op[dict[str, str]]:
        """{job_id: 'held' | 'expired' | 'stale' | 'cancelled' | 'missing'} for (job_id, token,
        progress) items; a progress is JSON (ctx.set_progress's text, or any value to encode).
        Written only while the token holds an unexpired lease (lua/progress.lua)."""
        args: list[str] = []
        for job_id, token, value in items:
            codec.check_lease(job_id, token)
            text = value if type(value) is ProgressText else encode_progress(value)
            args.extend((job_id, token, text))
        if not args:
            return {}
        reply = [st for r in (yield from _chunked("progress", [], args, 3)) for st in r]
        return {job_id: codec.s(st) for (job_id, _, _), st in zip(items, reply, strict=True)}

    def complete_many(self, items: Sequence[tuple[str, str, Any]]) -> Op[list[str]]:
        """Statuses per job: 'done' | 'stale' | 'cancelled' | 'missing' (no exception)."""
        if isinstance(items, str) or not isinstance(items, Sequence):  # None: a caller's bug
            what = f"{items!r:.80}"
            raise BadArgument(f"items must be a list of (job_id, token, result), got {what}")
        if not items:
            return []
        s = self.settings
        args = codec.complete_args(items, s.result_ttl_ms, s.max_payload_bytes)
        replies = yield from _chunked("complete", args[:1], args[1:], 3, sized=True)
        return codec.parse_statuses([st for r in replies for st in r])

    def complete(self, job_id: str, token: str, result: Any = None) -> Op[None]:
        """Record success; raises StaleToken / JobCancelled / JobNotFound when refused."""
        (status,) = yield from self.complete_many([(job_id, token, result)])
        raise_for_status(status, job_id, token)

    def fail(
        self,
        job_id: str,
        token: str,
        error: BaseException | tuple[str, str, str],
        *,
        retryable: bool = True,
        delay_ms: int | None = None,
    ) -> Op[FailOutcome]:
        """FailOutcome('retry', run_at_ms) or ('dead', dead_reason); raises StaleToken /
        JobCancelled / JobNotFound when refused."""
        args = codec.fail_args(job_id, token, error, retryable=retryable, delay_ms=delay_ms)
        return codec.parse_fail((yield Script("fail", args)), job_id, token)

    def release(self, leases: Sequence[tuple[str, str]]) -> Op[list[str]]:
        """Statuses per job: 'released' | 'stale' | 'cancelled' | 'missing' (no exception)."""
        pairs = codec.lease_pairs(leases)  # before the empty answer: None is refused
        if not pairs:
            return []
        replies = yield from _chunked("release", [], pairs, 2)
        return codec.parse_statuses([st for r in replies for st in r])
