"""Concurrent AsyncQueue.enqueue callers share script calls (client/enqueue_batcher.py) while a
TCP proxy cuts connections at random moments and a durable redis-server (appendonly yes,
appendfsync always) is killed -9 and restarted. Durable acceptance, per caller: an id a caller
got back is a job that runs exactly once, never before its run time; a missing `after=` parent
refuses that caller only; a caller that met an error re-sends the same call (ids are client-made)
and gets the same job, never a second one; no caller hangs."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff

from scheduler import AsyncQueue, BadArgument, Queue
from tests.faults.conftest import DURABLE, FaultyProxy, Server
from tests.workers.procs import wait_for

QUEUE = "batched"
TRANSIENT = (redis.ConnectionError, redis.TimeoutError)  # BusyLoadingError is a ConnectionError
RESENDS = 40  # a caller's tries of one call before it gives up (counted, then judged)
PRODUCE_S = 2.5  # each round's producers start calls for this long, under faults
LIVENESS_S = 90.0  # the whole gather's bound: a hung caller fails the test, not a slow one


@dataclass
class Call:
    """One caller's enqueue and everything it got back."""

    kind: str  # plain | delayed | keyed | orphan
    job_id: str | None  # the id it asked for (None: the client makes one per try)
    delay_ms: int = 0
    key: str | None = None
    started_ms: int = 0  # wall clock before its first try (the server runs on this host)
    ids: list[str] = field(default_factory=list)  # every id a try returned
    errors: list[str] = field(default_factory=list)
    refused: BaseException | None = None
    gave_up: bool = False


async def produce(aq: AsyncQueue, p: int, seed: int, until: float, calls: list[Call]) -> None:
    """One producer's calls until `until` (monotonic): each re-sent after an error."""
    rng = random.Random(seed * 1000 + p)
    i = 0
    while time.monotonic() < until:
        call = new_call(rng, seed, p, i)
        calls.append(call)
        i += 1
        await asyncio.sleep(rng.uniform(0, 0.02))
        call.started_ms = int(time.time() * 1000)
        for _ in range(RESENDS):
            try:
                if call.kind == "orphan":
                    jid = await aq.enqueue("chaos.t", None, job_id=call.job_id,
                                           after=[f"missing-{call.job_id}"])  # fmt: skip
                else:
                    jid = await aq.enqueue("chaos.t", {"k": call.kind}, job_id=call.job_id,
                                           delay_ms=call.delay_ms, key=call.key)  # fmt: skip
            except TRANSIENT as exc:
                call.errors.append(type(exc).__name__)
                await asyncio.sleep(rng.uniform(0.01, 0.05))
                continue
            except BadArgument as exc:
                call.refused = exc
                break
            call.ids.append(jid)
            break
        else:
            call.gave_up = True


def new_call(rng: random.Random, seed: int, p: int, i: int) -> Call:
    kind = rng.choices(["plain", "delayed", "keyed", "orphan"], [5, 3, 2, 0.3])[0]
    if kind == "keyed":  # a key two producers ask for (their i-th calls): one job for both
        return Call(kind, None, key=f"key-{seed}-{p // 2}-{i}")
    delay = rng.randint(1, 300) if kind == "delayed" else 0
    return Call(kind, f"j-{seed}-{p}-{i}", delay_ms=delay)


def faults(stop: threading.Event, server: Server, proxy: FaultyProxy, rng: random.Random,
           kill: bool, counts: Counter[str]) -> None:  # fmt: skip
    """Random moments: a burst of cut connections (and replies held past the socket timeout)
    at the proxy, or kill -9 and restart."""
    while not stop.wait(rng.uniform(0.05, 0.4)):
        if kill and rng.random() < 0.4:
            server.restart(hard=True)
            counts["kill -9"] += 1
        else:
            proxy.faults(drop_request=0.3, drop_reply=0.4, delay_reply=0.3, delay_s=0.6)
            time.sleep(rng.uniform(0.01, 0.08))
            proxy.faults()
            counts["cut bursts"] += 1


@pytest.mark.parametrize(
    ("seed", "n_producers", "kill"), [(1, 64, False), (2, 128, True), (3, 200, True)]
)
def test_batched_enqueues_survive_cuts_and_kill_9(
    start_server: Callable[..., Server],
    proxy_factory: Callable[[Server, int], FaultyProxy],
    seed: int,
    n_producers: int,
    kill: bool,
) -> None:
    server = start_server(*DURABLE)  # every acknowledged write survives kill -9
    proxy = proxy_factory(server, seed)
    rng = random.Random(seed)
    calls: list[Call] = []
    stop = threading.Event()
    counts: Counter[str] = Counter()
    chaos = threading.Thread(target=faults, args=(stop, server, proxy, rng, kill, counts))

    async def main() -> None:
        # Few retries of its own: errors do reach callers, whose re-sends are then judged.
        retry = AsyncRetry(ExponentialBackoff(cap=0.05, base=0.01), 2)
        client = aredis.Redis.from_url(
            proxy.url, decode_responses=True, retry=retry, socket_timeout=0.5,
            socket_connect_timeout=1, retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        )  # fmt: skip
        aq = AsyncQueue(client, QUEUE)
        try:
            until = time.monotonic() + PRODUCE_S
            producers = [produce(aq, p, seed, until, calls) for p in range(n_producers)]
            await asyncio.wait_for(asyncio.gather(*producers), LIVENESS_S)
        finally:
            await client.aclose()

    chaos.start()
    try:
        asyncio.run(main())
    finally:
        stop.set()
        chaos.join(timeout=30)
    proxy.faults()

    # Drain on the server's own socket: every job claimed once, none before its run time.
    admin = server.admin()
    q = Queue(admin, QUEUE)
    claimed: Counter[str] = Counter()
    early: list[tuple[str, int, int]] = []
    run_at: dict[str, int] = {}

    def drained() -> bool:
        batch = q.claim("drain", limit=100, lease_ms=60_000)
        for job in batch.jobs:
            claimed[job.id] += 1
            run_at[job.id] = job.run_at_ms
            if job.claimed_ms < job.run_at_ms:
                early.append((job.id, job.claimed_ms, job.run_at_ms))
        assert set(q.complete_many([(j.id, j.token, None) for j in batch.jobs])) <= {"done"}
        c = q.counts()
        return c.due + c.scheduled + c.leased == 0

    wait_for(drained, timeout_s=30, what="queue drained")

    acked = {i for c in calls for i in c.ids}
    stored = {k.removeprefix(q.keys.job("")) for k in admin.scan_iter(match=q.keys.job("*"))}
    states = Counter(q.status(j) for j in stored)
    errored = [c for c in calls if c.errors]
    gave_up = [c for c in calls if c.gave_up]
    print(f"\nbatched chaos seed={seed}: producers={n_producers} calls={len(calls)} "
          f"faults={dict(counts)} proxy={dict(proxy.stats)} restarts={server.restarts} "
          f"acked={len(acked)} stored={len(stored)} states={dict(states)} "
          f"callers with errors={len(errored)} "
          f"error kinds={dict(Counter(e for c in calls for e in c.errors))} "
          f"gave up={len(gave_up)}")  # fmt: skip

    assert early == [], f"claimed before run time: {early[:3]}"
    # Every acknowledged id is a job that ran exactly once, to done.
    assert acked <= stored, f"acknowledged but lost: {sorted(acked - stored)[:5]}"
    assert all(claimed[j] == 1 for j in stored), [j for j in stored if claimed[j] != 1][:5]
    assert states == Counter({"done": len(stored)})
    for c in calls:
        if c.kind == "orphan":  # refused for this caller only, nothing written
            assert c.ids == [] and isinstance(c.refused, BadArgument), c
            assert "after" in str(c.refused) and c.job_id not in stored
            continue
        assert c.refused is None, c
        # Every re-send answered with the same id: the one asked for, or the key's.
        assert len(set(c.ids)) <= 1, c
        if c.job_id is not None:
            assert set(c.ids) <= {c.job_id}, c
        if c.ids and c.delay_ms:  # never earlier than asked, from the first try on
            assert run_at[c.ids[0]] >= c.started_ms + c.delay_ms, c
    # One job per key, the same id for both of its callers.
    by_key: dict[str, set[str]] = {}
    for c in calls:
        if c.key is not None:
            by_key.setdefault(c.key, set()).update(c.ids)
    assert all(len(ids) <= 1 for ids in by_key.values()), by_key
    # No job that no caller can name: each is an id asked for, or a key's job got back (a
    # keyed caller that gave up may have written one it never learnt).
    asked = {c.job_id for c in calls if c.job_id is not None and c.kind != "orphan"}
    unnamed = stored - acked - asked
    keyed_gave_up = sum(1 for c in gave_up if c.key is not None)
    assert len(unnamed) <= keyed_gave_up, sorted(unnamed)[:5]
    assert counts, "no fault was injected"
    if kill:
        assert counts["kill -9"] > 0 and server.restarts == counts["kill -9"]
