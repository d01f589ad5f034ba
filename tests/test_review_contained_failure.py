"""Review: contained failure and on time, with real workers on a private server.

A job that can never succeed (it hangs, raises, returns an outsized result) must not block or
starve the worker's other jobs, and healthy due jobs must start on time beside it."""

from __future__ import annotations

import asyncio
import collections
import enum
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis

from scheduler import Queue
from scheduler.core.backoff import Backoff
from scheduler.core.connection import connect_async
from scheduler.core.errors import InvalidPayload
from scheduler.core.json_bounded import encode_json_bounded
from scheduler.core.json_text import encode_json
from scheduler.core.limits import MAX_PAYLOAD_BYTES
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.registry import JobContext, Registry
from tests.fixtures.polling import poll
from tests.redis_server import RedisProcess

registry = Registry()


class Gate:
    """Made in each test's event loop: hung handlers wait on it until the test ends."""

    release: asyncio.Event


STARTS: dict[str, int] = {}


@registry.task(name="rc-quick")
async def quick(payload: Any, ctx: JobContext) -> str:
    STARTS[ctx.job_id] = STARTS.get(ctx.job_id, 0) + 1
    return "ok"


@registry.task(name="rc-hang")
async def hang(payload: Any, ctx: JobContext) -> None:
    await Gate.release.wait()


@pytest.fixture
def admin(module_server: RedisProcess) -> Iterator[redis.Redis]:
    c = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    yield c
    c.close()


@pytest.fixture
def rq(admin: redis.Redis) -> Queue:
    return Queue(admin, f"rc-{uuid.uuid4().hex[:10]}")


def run_with_worker(
    url: str,
    settings: WorkerSettings,
    steps: Callable[[Worker], Awaitable[None]],
    reg: Registry = registry,
) -> None:
    """An in-process worker runs while `steps` do; then stopped (grace 0) and its hung handlers
    let go."""

    async def main() -> None:
        Gate.release = asyncio.Event()
        client = connect_async(url)
        w = Worker(client, reg, settings)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await steps(w)
        finally:
            Gate.release.set()
            w.request_stop()
            await asyncio.wait_for(task, 15)
            await client.aclose()

    asyncio.run(main())


# -- a long or hung run among short jobs -------------------------------------------------------


def test_one_hung_run_among_short_jobs_does_not_stop_the_worker_claiming(
    module_server: RedisProcess, rq: Queue
) -> None:
    """Default prefetch (100): the hysteresis waits for min(48, (concurrency + prefetch) // 2)
    free slots while short jobs run. A run past a heartbeat interval turns prefetch off, so a
    worker of 4 slots has at most 3 free beside it: the threshold is half the room there is
    then (2), not 52, which it never reached while that run went on (claiming.py _hold_claim)."""
    settings = WorkerSettings(queues=(rq.name,), concurrency=4, heartbeat_ms=50, lease_ms=1_000,
                              grace_s=0)  # fmt: skip

    async def steps(w: Worker) -> None:
        warm = [rq.enqueue("rc-quick") for _ in range(20)]  # short jobs: the mean run < 20 ms
        await poll(lambda: all(rq.status(i) == "done" for i in warm), "the warm-up jobs")
        hung = rq.enqueue("rc-hang")
        await poll(lambda: rq.status(hung) == "leased", "the hung job to start")
        await asyncio.sleep(0.3)  # past a heartbeat interval: a long run now
        later = [rq.enqueue("rc-quick") for _ in range(3)]
        # The hung run never ends (the gate opens after the test): before, none of them ran.
        what = "the healthy jobs behind a hung run, 3 of 4 slots free"
        await poll(lambda: all(rq.status(i) == "done" for i in later), what, timeout_s=3.0)
        assert rq.status(hung) == "leased"

    run_with_worker(module_server.url, settings, steps)


# -- a job held behind its own abandoned run ----------------------------------------------------

HUNG = threading.Event()  # set at each test's end: the abandoned threads return then


@registry.task(name="rc-hang-sync", timeout_s=0.2)
def hang_sync(payload: Any, ctx: JobContext) -> None:
    HUNG.wait(60)  # ignores its timeout and ctx.stopped


def test_a_one_slot_worker_claims_again_once_a_job_held_behind_its_hung_run_is_failed(
    module_server: RedisProcess, rq: Queue
) -> None:
    """One slot. The poison job's thread ignores its timeout; its retry, claimed here again,
    waits behind that thread (README: held a whole lease, then failed StillRunning). That
    retry filled the worker's room, so the claim loop waits for a slot to free; the
    StillRunning fail must wake it (it woke nothing: the worker never claimed again while the
    thread lived, the healthy job never ran, the poison job's last attempt neither)."""
    settings = WorkerSettings(queues=(rq.name,), concurrency=1, heartbeat_ms=100, lease_ms=1_000,
                              grace_s=0)  # fmt: skip

    async def steps(w: Worker) -> None:
        poison = rq.enqueue("rc-hang-sync", max_attempts=3, backoff=Backoff(0, 1.0, 0, 0.0))
        await poll(lambda: rq.get_job(poison).attempts == 2, "the poison job's retry")
        healthy = rq.enqueue("rc-quick")
        await poll(lambda: rq.status(poison) == "dead", "the poison job parked", timeout_s=8.0)
        await poll(lambda: rq.status(healthy) == "done", "the healthy job", timeout_s=5.0)

    HUNG.clear()
    try:
        run_with_worker(module_server.url, settings, steps)
    finally:
        HUNG.set()


# -- an outsized result --------------------------------------------------------------------


@registry.task(name="rc-slow")
async def slow(payload: Any, ctx: JobContext) -> str:
    STARTS[ctx.job_id] = STARTS.get(ctx.job_id, 0) + 1
    await asyncio.sleep(payload["s"])
    return "ok"


@registry.task(name="rc-rows")
def rows(payload: Any, ctx: JobContext) -> dict[str, Any]:
    # 2,000,000 rows (34 MB of JSON; the list itself is 16 MB of references to one row).
    return {"rows": [{"a": 1, "b": "xy"}] * 2_000_000}


def test_an_outsized_result_does_not_hold_the_other_jobs_leases(
    module_server: RedisProcess, rq: Queue
) -> None:
    """The result is refused (parked InvalidResult, as documented) without the whole value
    being encoded (it was, on the worker's loop: 1-2 s with no heartbeat, so the healthy job
    running beside it lost its lease and ran a second time); a sync handler's in its thread."""
    settings = WorkerSettings(queues=(rq.name,), concurrency=4, heartbeat_ms=50, lease_ms=400,
                              grace_s=0)  # fmt: skip

    async def steps(w: Worker) -> None:
        healthy = rq.enqueue("rc-slow", {"s": 2.0})
        await poll(lambda: STARTS.get(healthy) == 1, "the healthy job to start")
        poison = rq.enqueue("rc-rows", max_attempts=1)
        await poll(lambda: rq.status(poison) == "dead", "the outsized result parked")
        assert rq.get_job(poison).fields["last_error_type"] == "InvalidResult"
        await poll(lambda: rq.status(healthy) == "done", "the healthy job", timeout_s=10.0)
        assert STARTS[healthy] == 1, "the healthy job lost its lease and ran again"

    run_with_worker(module_server.url, settings, steps)


class _Level(enum.IntEnum):
    HIGH = 2


_SAME: list[Any] = [
    None, 7, 2.5, "héllo", [], {}, [[]], [1, "a", None, True], (1, 2), {"a": [1, {"b": "c"}]},
    {1: "a", "x": [_Level.HIGH]}, {True: 1, None: 2}, collections.OrderedDict(a=1),
    collections.defaultdict(list, a=[1]), [{"a": 1, "b": "xy"}] * 20, [{}] * 9 + [{"k": [1]}],
    list(range(50)), {f"k{i}": i for i in range(30)}, {"deep": [[[["x"]]]]}, "\u2603" * 100,
]  # fmt: skip


@pytest.mark.parametrize("value", _SAME)
def test_a_result_is_written_as_the_one_encoder_writes_it(value: Any) -> None:
    """encode_json_bounded (results): every shape it reads (short containers item by item,
    long ones and rows by C-speed passes, subclasses, enums) gives encode_json's text."""
    limit = MAX_PAYLOAD_BYTES
    assert encode_json_bounded(value, "result", limit) == encode_json(value, "result", limit)


def _refusal(value: Any, encode: Callable[[Any, str, int], str]) -> str:
    with pytest.raises(InvalidPayload) as err:
        encode(value, "result", MAX_PAYLOAD_BYTES)
    return str(err.value)


def test_a_bounded_result_keeps_each_refusal_and_stops_an_outsized_one_early() -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    for bad in ({"a": float("nan")}, [{1: "a", "1": "b"}], {"s": {1}}, cyclic, {"a": "\ud800"}):
        assert _refusal(bad, encode_json_bounded) == _refusal(bad, encode_json)
    rows = {"rows": [{"a": 1, "b": "xy"}] * 2_000_000}  # 34 MB: stopped at the limit
    assert "its encoding was stopped" in _refusal(rows, encode_json_bounded)
    for text in ({"text": "x" * (MAX_PAYLOAD_BYTES + 1)}, [1, ["x" * (MAX_PAYLOAD_BYTES + 1)]]):
        assert "it holds a str of" in _refusal(text, encode_json_bounded)  # read, never encoded


@pytest.mark.parametrize("shape", ["long", "short", "nested"])
def test_an_outsized_result_of_long_ints_is_stopped_not_encoded_whole(shape: str) -> None:
    """An int is written with its digits (up to 4,300): the read counts them, so a result of
    many long ints goes to the stopped chunks, not whole through the C encoder (it counted one
    character an int: 2,000 ints of 4,000 digits, 8 MB, were encoded whole on the loop)."""
    big = 10**3999
    value: Any = {
        "long": [big] * 2_000,
        "short": {f"k{i}": [big, -big, big, big] for i in range(40)},
        "nested": [[big] * 3] * 200,
    }[shape]
    assert "its encoding was stopped" in _refusal(value, encode_json_bounded)
    small = [big] * 100  # 400 KB: under the limit, written as the one encoder writes it
    assert encode_json_bounded(small, "result", MAX_PAYLOAD_BYTES) == encode_json(
        small, "result", MAX_PAYLOAD_BYTES
    )


# -- checked and found correct -------------------------------------------------------------

RUNS: dict[str, list[tuple[float, int]]] = {}  # job id -> (wall ms at each start, run_at_ms)
# What happened, in order: ("start" | "timeout" | "enqueued", job id). Order, not wall times,
# is what the tests assert (a loaded machine stretches every interval).
EVENTS: list[tuple[str, str]] = []


def _ran(ctx: JobContext) -> None:
    RUNS.setdefault(ctx.job_id, []).append((time.time() * 1000, ctx.run_at_ms))
    EVENTS.append(("start", ctx.job_id))


def _after(first: tuple[str, str], then: tuple[str, str]) -> bool:
    """`then` happened after `first` (each by its first occurrence)."""
    return EVENTS.index(first) < EVENTS.index(then)


@registry.task(name="rc-mark")
async def mark(payload: Any, ctx: JobContext) -> str:
    _ran(ctx)
    return "ok"


@registry.task(name="rc-boom")
async def boom(payload: Any, ctx: JobContext) -> None:
    _ran(ctx)
    raise RuntimeError("always")


@registry.task(name="rc-hang-t", timeout_s=0.3)
async def hang_timed(payload: Any, ctx: JobContext) -> None:
    _ran(ctx)
    try:
        await Gate.release.wait()
    except asyncio.CancelledError:  # its timeout (0.3 s)
        EVENTS.append(("timeout", ctx.job_id))
        raise


def test_a_hung_run_frees_its_concurrency_key_at_its_timeout_and_other_keys_never_wait(
    module_server: RedisProcess, rq: Queue
) -> None:
    """A real worker: the hung job's key (limit 1) is its for as long as the worker heartbeats
    it (lease 3 s, renewed), so only its timeout (0.3 s) can free it; a job of another key
    starts at once meanwhile, the key's next job right after the timeout, and the hung job is
    parked after its 2 attempts (JobTimeout), not retried or leased for ever."""
    settings = WorkerSettings(queues=(rq.name,), concurrency=4, heartbeat_ms=100, lease_ms=3_000,
                              grace_s=0)  # fmt: skip

    async def steps(w: Worker) -> None:
        hung = rq.enqueue("rc-hang-t", max_attempts=2, backoff=Backoff(500, 1.0, 500, 0.0),
                          concurrency_key="rc-k", concurrency_limit=1)  # fmt: skip
        await poll(lambda: hung in RUNS, "the hung job to start")
        same = rq.enqueue("rc-mark", concurrency_key="rc-k", concurrency_limit=1)
        other = rq.enqueue("rc-mark", concurrency_key="rc-other", concurrency_limit=1)
        await poll(lambda: other in RUNS, "the other key's job", timeout_s=5.0)
        await poll(lambda: same in RUNS, "the key's next job", timeout_s=5.0)
        # The other key's job did not wait for the hung run; the key's next one waited for its
        # timeout (the lease, renewed every 100 ms, would never have freed it).
        assert _after(("start", other), ("timeout", hung))
        assert _after(("timeout", hung), ("start", same))
        await poll(lambda: rq.status(hung) == "dead", "the hung job parked", timeout_s=15.0)
        parked = rq.get_job(hung)
        assert parked.attempts == 2 and parked.fields["last_error_type"] == "JobTimeout"

    run_with_worker(module_server.url, settings, steps)


def test_a_poison_job_retried_at_once_for_ever_takes_its_turn_not_the_healthy_jobs(
    module_server: RedisProcess, rq: Queue
) -> None:
    """One slot, a job that always fails with no backoff and a million attempts: each retry
    is due at its fail's time, behind the jobs due before it, so a healthy job enqueued every
    30 ms still starts within a few ms of its run time (measured: 14 ms at most)."""
    settings = WorkerSettings(queues=(rq.name,), concurrency=1, heartbeat_ms=100, lease_ms=1_000,
                              grace_s=0)  # fmt: skip

    async def steps(w: Worker) -> None:
        poison = rq.enqueue("rc-boom", max_attempts=1_000_000, backoff=Backoff(0, 1.0, 0, 0.0))
        await poll(lambda: len(RUNS.get(poison, [])) > 5, "the poison job cycling")
        healthy = []
        for _ in range(30):
            healthy.append(rq.enqueue("rc-mark"))
            EVENTS.append(("enqueued", healthy[-1]))
            await asyncio.sleep(0.03)  # a steady stream, not a synchronisation
        await poll(lambda: all(i in RUNS for i in healthy), "the healthy jobs", timeout_s=10.0)
        # Between a healthy job's enqueue and its start, the poison job ran at most the run in
        # progress and one claimed beside it (each retry is due at its fail, behind it): never
        # a string of retries ahead of it.
        for h in healthy:
            span = EVENTS[EVENTS.index(("enqueued", h)) : EVENTS.index(("start", h))]
            assert span.count(("start", poison)) <= 2, (h, span.count(("start", poison)))
        assert len(RUNS[poison]) > 30  # it ran on too: a fair share, not none
        assert rq.status(poison) in ("due", "leased")  # still within its attempts

    run_with_worker(module_server.url, settings, steps)


def test_a_schedule_that_always_fails_re_arms_and_leaves_its_neighbour_on_time(
    module_server: RedisProcess, rq: Queue
) -> None:
    """Every 100 ms: each run of the failing schedule is tried its 2 attempts and parked, no
    more; the schedule keeps arming its next slot (a failed run is no reason to stop), and a
    healthy schedule beside it runs its slots on time."""
    settings = WorkerSettings(queues=(rq.name,), concurrency=2, heartbeat_ms=100, lease_ms=1_000,
                              grace_s=0)  # fmt: skip

    async def steps(w: Worker) -> None:
        rq.schedule("rc-bad", "rc-boom", every_ms=100, max_attempts=2,
                    backoff=Backoff(20, 1.0, 20, 0.0))  # fmt: skip
        rq.schedule("rc-good", "rc-mark", every_ms=100)

        def runs(name: str) -> list[str]:
            return sorted(i for i in RUNS if i.startswith(f"schedule:{name}:"))

        await poll(lambda: min(len(runs("rc-bad")), len(runs("rc-good"))) >= 10, "10 runs each",
                   timeout_s=20.0)  # fmt: skip
        bad, good = runs("rc-bad"), runs("rc-good")
        # The healthy schedule kept pace with the failing one: a run of it for about each of
        # the failing one's slots (both every 100 ms), none of its slots left behind.
        assert len(good) >= len(bad) - 3, (len(good), len(bad))
        settled = [i for i in bad if rq.status(i) == "dead"]
        assert len(settled) >= len(bad) - 2  # the last one or two may still be retrying
        assert all(len(RUNS[i]) == 2 and rq.get_job(i).attempts == 2 for i in settled)
        assert max(len(RUNS[i]) for i in bad) <= 2
        # Still armed: a pending run of a slot after every run it made.
        last_slot = int(bad[-1].rsplit(":", 1)[1])
        sched = {s.name: s for s in rq.list_schedules()}["rc-bad"]
        assert sched.next_run_ms is not None and sched.next_run_ms > last_slot

    run_with_worker(module_server.url, settings, steps)
