"""Review: time inputs at the boundary, and the "on time" promise (README "On time, by one
clock": no job is claimed before its run-at time, and idle workers sleep until the next due
job or until an enqueue wakes them).

The input side checks what a caller may give as a time (aware datetimes in any zone, DST folds,
sub-millisecond parts, the 2200 bound, floats / bools / index-able ints / timedeltas where
milliseconds belong) on every door: enqueue, enqueue_many, reschedule, fail, RetryLater, the
CLI. What tests/test_bad_input.py, tests/test_limits_review.py and
tests/test_cli_enqueue_review.py check already is not repeated.

The "not long after" side runs a real worker on the real clock with its idle safety nets out of
the way (an hour, tests/test_worker_retry_wake.py no_safety_nets): a lost wake-up shows as a job
that does not run within a generous deadline, where the wrong behaviour is a wait of 30 s (or
the hour)."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from click.testing import CliRunner

from scheduler import BadArgument, JobSpec, PartitionedQueue, Queue, RetryLater
from scheduler.cli.main import main as cli_main
from scheduler.core.codec import epoch_ms
from scheduler.core.connection import connect_async
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.registry import JobContext, Registry
from tests.conftest import Clock
from tests.fixtures.polling import poll
from tests.redis_server import RedisProcess
from tests.test_worker_retry_wake import no_safety_nets

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def exact_ms(at: datetime) -> int:
    """The instant in epoch ms, rounded up, in integer arithmetic (no float on the way)."""
    us = (at - EPOCH) // timedelta(microseconds=1)
    return -(-us // 1000)


def stored_run_at(q: Queue, job_id: str) -> int:
    score = q.client.zscore(q.keys.due, job_id)
    assert score is not None
    return int(score)


# -- run_at: zones, folds, sub-millisecond parts ---------------------------------------------

PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = ZoneInfo("America/New_York")


@pytest.mark.parametrize(
    "at",
    [
        datetime(2031, 6, 1, 12, 0, tzinfo=PARIS),
        datetime(2031, 6, 1, 12, 0, tzinfo=NEW_YORK),
        # The autumn change in Paris: 02:30 happens twice; fold picks which.
        datetime(2031, 10, 26, 2, 30, tzinfo=PARIS, fold=0),
        datetime(2031, 10, 26, 2, 30, tzinfo=PARIS, fold=1),
        # The spring gap: 02:30 does not exist; Python maps it by fold, the queue follows.
        datetime(2031, 3, 30, 2, 30, tzinfo=PARIS, fold=0),
        datetime(2031, 3, 30, 2, 30, tzinfo=PARIS, fold=1),
        datetime(2031, 6, 1, 12, 0, 0, 900, tzinfo=timezone(timedelta(hours=5, minutes=45))),
        datetime(2031, 6, 1, 12, 0, tzinfo=timezone(timedelta(seconds=-1))),
    ],
    ids=["paris", "new-york", "fold0", "fold1", "gap-fold0", "gap-fold1", "+05:45", "-1s"],
)
def test_an_aware_run_at_in_any_zone_is_stored_as_its_instant(q: Queue, at: datetime) -> None:
    job = q.enqueue("t", run_at=at)
    assert stored_run_at(q, job) == exact_ms(at) == epoch_ms(at)
    moved = q.enqueue("t", delay_ms=3_600_000)
    assert q.reschedule(moved, run_at=at) == "rescheduled"
    assert stored_run_at(q, moved) == exact_ms(at)


def test_the_two_folds_of_an_ambiguous_local_time_are_an_hour_apart(q: Queue) -> None:
    first = datetime(2031, 10, 26, 2, 30, tzinfo=PARIS, fold=0)
    second = first.replace(fold=1)
    a, b = q.enqueue("t", run_at=first), q.enqueue("t", run_at=second)
    assert stored_run_at(q, b) - stored_run_at(q, a) == 3_600_000


@pytest.mark.parametrize("micro", [1, 500, 900, 999])
def test_a_sub_millisecond_run_at_is_never_due_before_its_instant(
    tq: tuple[Queue, Clock], micro: int
) -> None:
    """run_at 10:00:00.000900 is due at 10:00:00.001 (rounded up), never at 10:00:00.000."""
    q, clock = tq
    at = datetime(2031, 1, 1, 10, 0, 0, micro, tzinfo=UTC)
    whole = exact_ms(at.replace(microsecond=0))
    job = q.enqueue("t", run_at=at)
    spec = q.enqueue_many([JobSpec("t", run_at=at)])[0]
    assert stored_run_at(q, job) == stored_run_at(q, spec) == whole + 1
    clock.set_ms(whole)
    batch = q.claim("w", limit=10)
    assert batch.jobs == [] and batch.next_ms == whole + 1
    clock.set_ms(whole + 1)
    assert {j.id for j in q.claim("w", limit=10).jobs} == {job, spec}


@pytest.mark.parametrize(
    "at",
    [
        datetime(2039, 1, 1, 0, 0, 0, 4_000, tzinfo=UTC),
        datetime(2039, 2, 25, 16, 24, 2, 485_000, tzinfo=UTC),
        datetime(2107, 8, 31, 11, 18, 7, 765_000, tzinfo=UTC),
    ],
    ids=["2039-01-01", "2039-02-25", "2107-08-31"],
)
def test_a_whole_millisecond_run_at_is_stored_exactly(q: Queue, at: datetime) -> None:
    job = q.enqueue("t", run_at=at)
    assert stored_run_at(q, job) == exact_ms(at)
    assert q.get_job(job).run_at_ms == exact_ms(at)


def test_every_door_converts_a_time_in_integers(q: Queue, redis_url: str) -> None:
    """One helper (codec.ceil_ms) behind enqueue, reschedule, the CLI's --at and the schedules'
    utc_ms: whole ms exact across 1970..2200, any sub-ms part rounds up, never down."""
    from random import Random

    from scheduler.core.codec import ceil_ms
    from scheduler.schedules.recurring import utc_ms

    rng = Random(7)
    for _ in range(20_000):
        ms = rng.randrange(0, 7_258_118_400_000)
        at = EPOCH + timedelta(milliseconds=ms)
        assert ceil_ms(at) == utc_ms(at) == epoch_ms(at) == ms
        assert ceil_ms(at + timedelta(microseconds=rng.randrange(1, 1000))) == ms + 1
    at = datetime(2039, 2, 25, 16, 24, 2, 485_000, tzinfo=UTC)
    job = q.enqueue("t", delay_ms=3_600_000)
    assert q.reschedule(job, run_at=at) == "rescheduled"
    assert stored_run_at(q, job) == exact_ms(at)
    got = CliRunner().invoke(
        cli_main, ["enqueue", "t", "-q", q.name, "--at", at.isoformat(), "--url", redis_url]
    )
    assert got.exit_code == 0, got.output
    assert stored_run_at(q, got.stdout.strip()) == exact_ms(at)


def test_the_cli_at_with_a_zone_offset_and_a_fraction_is_rounded_up(
    q: Queue, redis_url: str
) -> None:
    run = CliRunner().invoke
    text = "2031-10-26T02:30:00.000001+01:00"
    got = run(cli_main, ["enqueue", "t", "-q", q.name, "--at", text, "--url", redis_url])
    assert got.exit_code == 0, got.output
    job = got.stdout.strip()
    assert stored_run_at(q, job) == exact_ms(datetime.fromisoformat(text))
    assert stored_run_at(q, job) % 1000 == 1
    # jobs reschedule --at: the same reading.
    text2 = "2031-10-26T02:30:00.999999+02:00"
    args = ["jobs", "reschedule", job, "-q", q.name, "--at", text2, "--url", redis_url]
    got = run(cli_main, args)
    assert got.exit_code == 0, got.output
    assert stored_run_at(q, job) == exact_ms(datetime.fromisoformat(text2))
    # A naive --at is refused (exit 2), as the API refuses a naive datetime.
    got = run(cli_main, ["jobs", "reschedule", job, "-q", q.name, "--at", "2031-01-01T00:00",
                         "--url", redis_url])  # fmt: skip
    assert got.exit_code == 2 and "offset" in got.output


# -- milliseconds given as something else ------------------------------------------------------


class IndexInt:
    """What numpy.int64 looks like to the client: an integer by __index__, not an int."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __index__(self) -> int:
        return self.v


ODD_MS: list[Any] = [
    0.0001, -0.0, 0.0, math.nan, math.inf, -math.inf, 1e300, True, False,
    IndexInt(1000), timedelta(seconds=1), "1000", None,
]  # fmt: skip
ODD_IDS = ["1e-4", "-0.0", "0.0", "nan", "inf", "-inf", "1e300", "True", "False", "index",
           "timedelta", "str", "None"]  # fmt: skip


@pytest.mark.parametrize("value", ODD_MS, ids=ODD_IDS)
def test_a_delay_that_is_not_an_int_is_bad_argument_on_every_door(
    q: Queue, client: redis.Redis, value: Any
) -> None:
    """delay_ms, jitter_ms, start_within_ms, reschedule's delay_ms, fail's delay_ms and
    RetryLater: a float (nan, inf, -0.0 included), a bool, an index-able non-int or a
    timedelta is refused as BadArgument, nothing written. None means "not given" where the
    argument is optional."""
    held = q.enqueue("t", delay_ms=3_600_000)
    leased = q.enqueue("t")
    lease = q.claim("w", limit=1).jobs[0]
    assert lease.id == leased
    before = sorted(client.scan_iter(match=q.keys.pattern()))
    calls: dict[str, Callable[[], Any]] = {
        "enqueue delay_ms": lambda: q.enqueue("t", delay_ms=value),
        "JobSpec delay_ms": lambda: q.enqueue_many([JobSpec("t", delay_ms=value)]),
        "jitter_ms": lambda: q.enqueue("t", jitter_ms=value),
        "start_within_ms": lambda: q.enqueue("t", start_within_ms=value),
        "reschedule delay_ms": lambda: q.reschedule(held, delay_ms=value),
        "fail delay_ms": lambda: q.fail(lease.id, lease.token, ValueError("x"), delay_ms=value),
        "RetryLater": lambda: RetryLater(value),
    }
    optional = {"enqueue delay_ms", "JobSpec delay_ms", "start_within_ms", "fail delay_ms"}
    for name, call in calls.items():
        if value is None and name in optional:
            continue
        with pytest.raises(BadArgument):
            call()
    assert sorted(client.scan_iter(match=q.keys.pattern())) == before
    assert q.status(leased) == "leased"


@pytest.mark.parametrize("value", [math.nan, 1e300, 0.0001, True, IndexInt(1000)],
                         ids=["nan", "1e300", "1e-4", "True", "index"])  # fmt: skip
def test_a_run_at_that_is_not_a_datetime_is_bad_argument(q: Queue, value: Any) -> None:
    held = q.enqueue("t", delay_ms=3_600_000)
    with pytest.raises(BadArgument, match="run_at"):
        q.enqueue("t", run_at=value)
    with pytest.raises(BadArgument, match="run_at"):
        q.reschedule(held, run_at=value)
    # A naive datetime in reschedule too (enqueue's is in tests/test_bad_input.py).
    with pytest.raises(BadArgument, match="timezone-aware"):
        q.reschedule(held, run_at=datetime(2031, 1, 1))
    assert q.counts().scheduled == 1


def test_run_at_past_and_far_future_edges_on_reschedule(q: Queue) -> None:
    """enqueue's edges are in tests/test_limits_review.py; reschedule takes the same range."""
    job = q.enqueue("t", delay_ms=3_600_000)
    for bad in (datetime(9999, 12, 31, tzinfo=UTC), datetime(1969, 12, 31, 23, 59, tzinfo=UTC),
                datetime.max.replace(tzinfo=timezone(timedelta(hours=-5)))):  # fmt: skip
        with pytest.raises(BadArgument, match="run_at"):
            q.reschedule(job, run_at=bad)
    edge = datetime(2200, 1, 1, tzinfo=UTC)
    assert q.reschedule(job, run_at=edge) == "rescheduled"
    assert stored_run_at(q, job) == exact_ms(edge)
    # A past one: due now (it keeps its instant as the order key).
    assert q.reschedule(job, run_at=EPOCH) == "rescheduled"
    assert q.status(job) == "due"


def test_a_delay_and_a_run_at_together_are_refused_on_reschedule_and_job_spec(q: Queue) -> None:
    job = q.enqueue("t", delay_ms=3_600_000)
    at = datetime(2031, 1, 1, tzinfo=UTC)
    with pytest.raises(BadArgument):
        q.reschedule(job, delay_ms=0, run_at=at)
    with pytest.raises(BadArgument):
        q.enqueue_many([JobSpec("t", delay_ms=0, run_at=at)])
    assert q.counts().scheduled == 1


# -- "not long after": a real worker on the real clock -------------------------------------

registry = Registry()


class Gate:
    release: asyncio.Event


@registry.task(name="rti-ok")
async def ok(payload: object, ctx: JobContext) -> str:
    STARTS.setdefault(ctx.job_id, []).append((ctx.run_at_ms, ctx.claimed_ms))
    return "ok"


@registry.task(name="rti-gated")
async def gated(payload: object, ctx: JobContext) -> str:
    await Gate.release.wait()
    return "ok"


def run_with_worker(
    url: str,
    queues: tuple[str, ...],
    steps: Callable[[Worker], Awaitable[None]],
    lease_ms: int = 30_000,
    clock: str = "server",
) -> None:
    async def main() -> None:
        Gate.release = asyncio.Event()
        client = connect_async(url)
        settings = WorkerSettings(queues=queues, concurrency=4, grace_s=0, lease_ms=lease_ms)
        w = Worker(client, registry, settings, _clock=clock)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await poll(w._idle.is_set, "the worker to wait")
            await steps(w)
        finally:
            Gate.release.set()
            w.request_stop()
            await asyncio.wait_for(task, 10)
            await client.aclose()

    asyncio.run(main())


STARTS: dict[str, list[tuple[int, int]]] = {}  # job id -> (run_at_ms, claimed_ms) per attempt


def on_time(q: Queue, job_id: str) -> None:
    """Every attempt claimed at or after its run_at, by the server's clock."""
    starts = STARTS[job_id]
    assert starts and all(claimed >= run_at for run_at, claimed in starts), starts


async def sleeping_towards(w: Worker) -> None:
    """The worker idles, its next wake-up planned at the far job (no earlier due time)."""
    await poll(w._idle.is_set, "the worker to wait")
    await asyncio.sleep(0.2)  # its claim answered and its plan made
    await poll(w._idle.is_set, "the worker to wait")


def done(q: Queue | PartitionedQueue, job_id: str) -> Callable[[], bool]:
    return lambda: q.status(job_id) == "done"


DEADLINE_S = 8.0  # for a 1 s delay; the wrong behaviour is the 30 s job's time (or the hour)


def test_a_sleeping_worker_is_woken_for_a_sooner_job(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_safety_nets(monkeypatch)
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    q = Queue(admin, f"rti-one-{uuid.uuid4().hex[:8]}")
    far = q.enqueue("rti-ok", None, delay_ms=30_000)

    async def steps(w: Worker) -> None:
        await sleeping_towards(w)
        soon = q.enqueue("rti-ok", None, delay_ms=1_000)
        await poll(lambda: q.status(soon) == "done", "the 1 s job", timeout_s=DEADLINE_S)
        on_time(q, soon)
        assert q.status(far) == "scheduled"

    run_with_worker(module_server.url, (q.name,), steps)


def test_a_worker_of_several_queues_is_woken_for_a_sooner_job_of_another(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_safety_nets(monkeypatch)
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    tag = uuid.uuid4().hex[:8]
    qa, qb = Queue(admin, f"rti-a-{tag}"), Queue(admin, f"rti-b-{tag}")
    qa.enqueue("rti-ok", None, delay_ms=30_000)
    qb.enqueue("rti-ok", None, delay_ms=40_000)

    async def steps(w: Worker) -> None:
        await sleeping_towards(w)
        soon = qb.enqueue("rti-ok", None, delay_ms=1_000)
        await poll(lambda: qb.status(soon) == "done", "qb's 1 s job", timeout_s=DEADLINE_S)
        on_time(qb, soon)
        # And a job of the empty-headed round: qa, due now.
        now = qa.enqueue("rti-ok", None)
        await poll(lambda: qa.status(now) == "done", "qa's job", timeout_s=DEADLINE_S)

    run_with_worker(module_server.url, (qa.name, qb.name), steps)


def test_a_worker_of_a_partitioned_queue_is_woken_for_a_sooner_job(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_safety_nets(monkeypatch)
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    pq = PartitionedQueue.create(admin, f"rti-pq-{uuid.uuid4().hex[:8]}", partitions=3)
    for _ in range(3):  # one far job in every partition (round robin)
        pq.enqueue("rti-ok", None, delay_ms=30_000)

    async def steps(w: Worker) -> None:
        await sleeping_towards(w)
        for _ in range(3):  # each partition in turn
            soon = pq.enqueue("rti-ok", None, delay_ms=1_000)
            await poll(done(pq, soon), "the 1 s job", timeout_s=DEADLINE_S)
        at = pq.enqueue("rti-ok", None, run_at=datetime.now(UTC) + timedelta(seconds=1))
        await poll(lambda: pq.status(at) == "done", "the run_at job", timeout_s=DEADLINE_S)

    run_with_worker(module_server.url, (pq.name,), steps)


def test_a_job_rescheduled_sooner_is_picked_up_promptly(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """reschedule (delay_ms, run_at, delay_ms=0) of the job the worker sleeps towards, and of
    one behind it, on a plain and a partitioned queue."""
    no_safety_nets(monkeypatch)
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    tag = uuid.uuid4().hex[:8]
    q = Queue(admin, f"rti-rs-{tag}")
    pq = PartitionedQueue.create(admin, f"rti-rspq-{tag}", partitions=2)
    head = q.enqueue("rti-ok", None, delay_ms=30_000)
    behind = q.enqueue("rti-ok", None, delay_ms=40_000)
    third = q.enqueue("rti-ok", None, delay_ms=50_000)
    p_head = pq.enqueue("rti-ok", None, delay_ms=30_000)

    async def steps(w: Worker) -> None:
        await sleeping_towards(w)
        assert q.reschedule(head, delay_ms=1_000) == "rescheduled"
        await poll(lambda: q.status(head) == "done", "the head moved sooner", DEADLINE_S)
        on_time(q, head)
        await sleeping_towards(w)
        at = datetime.now(UTC) + timedelta(seconds=1)
        assert q.reschedule(behind, run_at=at) == "rescheduled"
        await poll(lambda: q.status(behind) == "done", "the job moved sooner", DEADLINE_S)
        on_time(q, behind)
        await sleeping_towards(w)
        assert q.reschedule(third, delay_ms=0) == "rescheduled"
        await poll(lambda: q.status(third) == "done", "the job run now", DEADLINE_S)
        assert pq.reschedule(p_head, delay_ms=1_000) == "rescheduled"
        await poll(lambda: pq.status(p_head) == "done", "the partitioned job", DEADLINE_S)

    run_with_worker(module_server.url, (q.name, pq.name), steps)


def test_a_retry_later_of_one_second_runs_about_a_second_later(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler's RetryLater(1000) while the worker's next due job is 30 s away."""
    no_safety_nets(monkeypatch)
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    q = Queue(admin, f"rti-rl-{uuid.uuid4().hex[:8]}")
    q.enqueue("rti-ok", None, delay_ms=30_000)
    runs: list[float] = []
    reg = Registry()

    @reg.task(name="rti-later")
    async def later(payload: object, ctx: JobContext) -> str:
        runs.append(time.monotonic())
        STARTS.setdefault(ctx.job_id, []).append((ctx.run_at_ms, ctx.claimed_ms))
        if ctx.attempt == 1:
            raise RetryLater(1_000, "not yet")
        return "ok"

    async def main() -> None:
        client = connect_async(module_server.url)
        w = Worker(client, reg, WorkerSettings(queues=(q.name,), concurrency=4, grace_s=0))
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await sleeping_towards(w)
            job = q.enqueue("rti-later", None)
            await poll(lambda: q.status(job) == "done", "the retried job", DEADLINE_S)
            on_time(q, job)
            (_, first), (retry_at, _) = STARTS[job]
            assert retry_at >= first + 1_000  # the retry's run_at: the asked delay on
        finally:
            w.request_stop()
            await asyncio.wait_for(task, 10)
            await client.aclose()

    asyncio.run(main())


# -- a due head the worker may not take hides every later enqueue ----------------------------

T0 = 1_000_000
LEASE = 1_000


def _lapse(q: Queue, clock: Clock) -> None:
    """Lease every due job, let the lease lapse and reap it (one lapse each)."""
    now = int(q.client.get(q.keys.test_clock) or 0)
    q.claim("crashed", limit=100, lease_ms=LEASE)
    clock.set_ms(now + LEASE + 1)
    q.claim("reaper", limit=0, lease_ms=LEASE)


def test_a_job_enqueued_while_a_skipped_suspect_heads_due_is_not_left_to_the_safety_net(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two suspects (jobs whose lease lapsed twice: a fleet crashed twice). The only worker
    takes one (it runs, gated) and may take no other: the second stays at the head of due,
    re-scored to the claim's now, and the worker sleeps until its suspect's lease end. A plain
    job enqueued then, due now, is compared with that head by enqueue.lua (due no sooner: no
    wake-up) and waits for the lease end or the 30 s safety net (an hour each here)."""
    no_safety_nets(monkeypatch)
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    q = Queue(admin, f"rti-sus-{uuid.uuid4().hex[:8]}", _clock="test")
    clock = Clock(admin, q)
    clock.set_ms(T0)
    suspects = [q.enqueue("rti-gated") for _ in range(2)]
    _lapse(q, clock)
    _lapse(q, clock)

    async def steps(w: Worker) -> None:
        await poll(lambda: sum(q.status(i) == "leased" for i in suspects) == 1, "one suspect")
        await poll(w._idle.is_set, "the claim loop to wait")
        await asyncio.sleep(0.3)  # its own wake-up (suspects left) popped and claimed again
        await poll(w._idle.is_set, "the claim loop to wait")
        clock.set_ms(T0 + 10 * LEASE)  # later than the skipped suspect's new score
        plain = q.enqueue("rti-ok", None)
        await poll(lambda: q.status(plain) == "done", "the plain job", timeout_s=DEADLINE_S)

    run_with_worker(module_server.url, (q.name,), steps, lease_ms=3_600_000, clock="test")


def test_a_claim_that_skips_a_suspect_still_answers_a_later_jobs_run_at_as_next_ms(
    tq: tuple[Queue, Clock],
) -> None:
    """docs/guide/manual.md: next_ms is "the earliest server time anything may become
    claimable ... sleep until then". A worker holding a suspect, a second suspect skipped at the
    head of due, and a job enqueued to run in 1 s: the claim answered the worker's own lease
    end (10 min here), so even a woken worker slept past the job by that much."""
    q, clock = tq
    clock.set_ms(T0)
    for _ in range(2):
        q.enqueue("t")
    _lapse(q, clock)
    _lapse(q, clock)
    assert len(q.claim("w1", limit=4, lease_ms=600_000).jobs) == 1  # one suspect, held
    clock.set_ms(T0 + 10 * LEASE)
    soon = q.enqueue("t", delay_ms=1_000)
    again = q.claim("w1", limit=4, lease_ms=600_000)
    assert again.jobs == []
    assert again.next_ms == q.get_job(soon).run_at_ms == again.now_ms + 1_000


@pytest.mark.parametrize("delay_ms", [400, None], ids=["job-in-400ms", "none"])
def test_a_claim_that_skips_a_suspect_comes_back_within_a_second(
    tq: tuple[Queue, Clock], delay_ms: int | None
) -> None:
    """The same claim with a job due sooner than SUSPECT_POLL_MS (its run_at), or none (the
    bounded poll, not the worker's 10 min lease end): never "now", so no claim loop."""
    q, clock = tq
    clock.set_ms(T0)
    for _ in range(2):
        q.enqueue("t")
    _lapse(q, clock)
    _lapse(q, clock)
    assert len(q.claim("w1", limit=4, lease_ms=600_000).jobs) == 1
    clock.set_ms(T0 + 10 * LEASE)
    if delay_ms is not None:
        q.enqueue("t", delay_ms=delay_ms)
    again = q.claim("w1", limit=4, lease_ms=600_000)
    assert again.jobs == []
    assert again.next_ms == again.now_ms + (delay_ms or 1_000)
