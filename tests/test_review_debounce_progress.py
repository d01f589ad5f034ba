"""Review: debounce (`enqueue(..., key=k, debounce=True)`) and progress (`ctx.set_progress`,
`Queue.set_progress`) from a user's side, at the edges test_debounce.py and test_progress.py
leave: a key reused after its job finished, a job given back by a worker, a paused queue, a
run time moved both ways, refused arguments that must write nothing, concurrent producers, a
partitioned queue, dependants; progress after the lease ended, across a retry, refused values,
the lease left alone, a run cancelled or stopped by a shutdown."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler import (
    AsyncQueue,
    BadArgument,
    InvalidPayload,
    JobContext,
    JobSpec,
    Queue,
    Registry,
)
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.codec import MAX_PAYLOAD_BYTES
from scheduler.core.limits import MAX_PROGRESS_BYTES
from scheduler.worker import WorkerSettings
from tests.conftest import Clock, dump_queue
from tests.embedded_worker import run_until, worker_thread
from tests.fixtures.partitioned import delete_partitioned

T0 = 1_000_000


@dataclass
class Digest:
    n: int


def _payload(q: Queue, job_id: str) -> Any:
    return json.loads(q.get_job(job_id).payload_json)


def _claim_one(q: Queue, job_id: str) -> str:
    """The token of `job_id`'s lease (the claim may take others: they stay leased)."""
    jobs = q.claim("w", limit=50, lease_ms=10_000).jobs
    (got,) = [j for j in jobs if j.id == job_id]
    return got.token


def _poll(cond: Callable[[], bool], bound_s: float = 15.0) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


# Debounce -----------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["done", "cancelled", "dead"])
def test_a_key_reused_after_its_job_ended_makes_a_new_job_the_key_then_names(
    tq: tuple[Queue, Clock], outcome: str
) -> None:
    """README: once an attempt started (or the job ended), the next debounced call makes a new
    job and the key names it; the ended job keeps its state and payload."""
    q, clock = tq
    clock.set_ms(T0)
    first = q.enqueue("digest", {"n": 1}, key="u:1", debounce=True, max_attempts=1)
    if outcome == "cancelled":
        assert q.cancel(first) == "due"
    else:
        token = _claim_one(q, first)
        if outcome == "done":
            q.complete(first, token, "ok")
        else:
            assert q.fail(first, token, RuntimeError("boom")).status == "dead"
    assert q.status(first) == outcome
    second = q.enqueue("digest", {"n": 2}, key="u:1", debounce=True, delay_ms=60_000)
    assert second != first
    assert q.status(second) == "scheduled" and _payload(q, second) == {"n": 2}
    # The key names the new job: the next debounced call replaces it, not the ended one.
    assert q.enqueue("digest", {"n": 3}, key="u:1", debounce=True, delay_ms=60_000) == second
    assert _payload(q, second) == {"n": 3}
    assert q.status(first) == outcome
    # And a plain call with the key is answered with it too.
    assert q.enqueue("digest", {"n": 4}, key="u:1") == second
    assert q.counts().scheduled == 1


def test_a_job_given_back_unstarted_is_replaced_but_not_once_its_run_set_progress(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    """README: a job a worker gave back unstarted (release) is still replaced (its id, the new
    payload and run time); one whose run reported progress counts as started."""
    q, clock = tq
    clock.set_ms(T0)
    first = q.enqueue("digest", {"n": 1}, key="d", debounce=True)
    token = _claim_one(q, first)
    assert q.release([(first, token)]) == ["released"]
    assert q.enqueue("digest", {"n": 2}, key="d", debounce=True, delay_ms=5_000) == first
    assert client.zscore(q.keys.due, first) == T0 + 5_000
    assert q.claim("w", limit=5, lease_ms=10_000).jobs == []  # not before its new time
    clock.set_ms(T0 + 5_000)
    (got,) = q.claim("w", limit=5, lease_ms=10_000).jobs
    assert got.id == first and json.loads(got.payload_json) == {"n": 2}
    assert q.set_progress(first, got.token, {"step": 1}) == "held"
    assert q.release([(first, got.token)]) == ["released"]
    again = q.enqueue("digest", {"n": 3}, key="d", debounce=True, delay_ms=5_000)
    assert again != first  # that run started: a new job, the given-back one keeps its data
    assert _payload(q, first) == {"n": 2} and _payload(q, again) == {"n": 3}
    assert q.get_job(first).progress == {"step": 1}


def test_a_debounce_while_the_job_is_leased_then_given_back_leaves_two_jobs(
    tq: tuple[Queue, Clock],
) -> None:
    """The race with a claim: the call finds the job leased (started, as far as the server
    knows) and makes a new one; the worker then gives its claim back unstarted. Both jobs run,
    each with its own payload, and the key names the new one (README: 'once an attempt
    started ... the next call makes a new job')."""
    q, clock = tq
    clock.set_ms(T0)
    first = q.enqueue("digest", {"n": 1}, key="r", debounce=True)
    token = _claim_one(q, first)
    second = q.enqueue("digest", {"n": 2}, key="r", debounce=True)
    assert second != first
    assert q.release([(first, token)]) == ["released"]
    assert q.enqueue("digest", {"n": 3}, key="r", debounce=True) == second
    assert (_payload(q, first), _payload(q, second)) == ({"n": 1}, {"n": 3})
    assert q.counts().due == 2


def test_a_paused_queue_still_debounces_and_runs_the_latest_once_resumed(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    q.pause()
    first = q.enqueue("digest", {"n": 1}, key="p", debounce=True)
    for n in range(2, 6):
        assert q.enqueue("digest", {"n": n}, key="p", debounce=True) == first
    assert q.claim("w", limit=5, lease_ms=10_000).jobs == []
    assert q.counts().paused and q.counts().due == 1
    q.resume()
    (got,) = q.claim("w", limit=5, lease_ms=10_000).jobs
    assert (got.id, json.loads(got.payload_json)) == (first, {"n": 5})


def test_a_run_time_moved_earlier_wakes_idle_workers_and_later_leaves_nothing_due(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    """Moved earlier than every job idle workers sleep towards: the enqueue pushes a wake-up
    (an idle worker's timer was set for the old time). Moved later: not claimable at the old
    time. The start deadline moves with the run time."""
    q, clock = tq
    clock.set_ms(T0)
    job = q.enqueue(
        "digest", {"n": 1}, key="m", debounce=True, delay_ms=3_600_000, start_within_ms=60_000
    )
    assert q.get_job(job).start_by_ms == T0 + 3_660_000
    client.delete(q.keys.wake)
    assert (
        q.enqueue(
            "digest", {"n": 2}, key="m", debounce=True, delay_ms=1_000, start_within_ms=60_000
        )
        == job
    )
    assert client.llen(q.keys.wake) >= 1
    assert client.zscore(q.keys.due, job) == T0 + 1_000
    assert q.get_job(job).start_by_ms == T0 + 61_000
    assert q.enqueue("digest", {"n": 3}, key="m", debounce=True, delay_ms=120_000) == job
    assert q.get_job(job).start_by_ms is None  # the last call gave no window
    clock.set_ms(T0 + 1_000)
    assert q.claim("w", limit=5, lease_ms=10_000).jobs == []
    clock.set_ms(T0 + 120_000)
    (got,) = q.claim("w", limit=5, lease_ms=10_000).jobs
    assert (got.id, json.loads(got.payload_json)) == (job, {"n": 3})


def test_the_key_keeps_the_window_of_the_last_call(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    job = q.enqueue("digest", {}, key="w", debounce=True, key_ttl_ms=3_600_000)
    idem = q.keys.idem(hashlib.sha256(b"w").hexdigest())
    assert 3_000_000 < client.pttl(idem) <= 3_600_000
    assert (
        q.enqueue("digest", {}, key="w", debounce=True, key_ttl_ms=60_000, delay_ms=10_000) == job
    )
    assert 60_000 < client.pttl(idem) <= 70_000


BAD_REPLACEMENTS: list[dict[str, Any]] = [
    {"delay_ms": -1},
    {"delay_ms": 10**20},
    {"delay_ms": "5"},
    {"delay_ms": 1.5},
    {"delay_ms": True},
    {"key_ttl_ms": 0},
    {"key_ttl_ms": -5},
    {"key_ttl_ms": 10**30},
    {"max_attempts": 0},
    {"start_within_ms": -1},
    {"debounce": 1},
    {"debounce": "yes"},
    {"debounce": None},
    {"priority": 2},
    {"job_id": "chosen-by-me"},
    {"key": ""},
    {"key": "x" * 513},
    {"key": 7},
]


@pytest.mark.parametrize("bad", BAD_REPLACEMENTS, ids=lambda b: f"{b!r:.40}")
def test_a_refused_debounced_call_leaves_the_job_it_would_replace_untouched(
    client: redis.Redis, tq: tuple[Queue, Clock], bad: dict[str, Any]
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    job = q.enqueue("digest", {"n": 1}, key="k", debounce=True, delay_ms=60_000)
    before = dump_queue(client, q)
    kwargs: dict[str, Any] = {"key": "k", "debounce": True, **bad}
    with pytest.raises(BadArgument):
        q.enqueue("digest", {"n": 2}, **kwargs)
    assert dump_queue(client, q) == before
    assert _payload(q, job) == {"n": 1}


def test_a_refused_payload_leaves_the_job_it_would_replace_untouched(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    job = q.enqueue("digest", {"n": 1}, key="k", debounce=True, delay_ms=60_000)
    before = dump_queue(client, q)
    for payload in ({"n": {1, 2}}, {"n": float("nan")}, {"big": "x" * (MAX_PAYLOAD_BYTES + 1)}):
        with pytest.raises(InvalidPayload):
            q.enqueue("digest", payload, key="k", debounce=True)
    assert dump_queue(client, q) == before
    assert _payload(q, job) == {"n": 1}


def test_the_cli_refuses_debounce_without_a_key_and_writes_nothing(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    result = CliRunner().invoke(
        main,
        [
            "enqueue",
            "--url",
            redis_url,
            "-q",
            q.name,
            "digest",
            "--debounce",
            "--payload",
            "{}",
        ],
    )
    assert result.exit_code != 0
    assert "key" in result.output
    assert list(client.scan_iter(match=q.keys.prefix + "*")) == []


def test_concurrent_async_debounced_calls_leave_one_job(redis_url: str, q: Queue) -> None:
    """Twenty activity events at once (asyncio.gather on one AsyncQueue): one job, every caller
    answered with its id, the payload one caller's."""

    async def run() -> list[str]:
        async with AsyncQueue.from_url(redis_url, q.name) as aq:
            return list(
                await asyncio.gather(
                    *(
                        aq.enqueue("digest", {"n": n}, key="c", debounce=True, delay_ms=60_000)
                        for n in range(20)
                    )
                )
            )

    ids = asyncio.run(run())
    assert len(set(ids)) == 1
    assert q.counts().scheduled == 1
    assert _payload(q, ids[0])["n"] in range(20)


def test_concurrent_threads_debouncing_one_key_leave_one_job(q: Queue) -> None:
    ids: list[str] = []
    lock = threading.Lock()

    def producer(n: int) -> None:
        got = q.enqueue("digest", {"n": n}, key="t", debounce=True, delay_ms=60_000)
        with lock:
            ids.append(got)

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(ids) == 8 and len(set(ids)) == 1
    assert q.counts().scheduled == 1


def test_a_partitioned_queue_debounces_across_a_claim(client: redis.Redis, queue_name: str) -> None:
    """The key routes every call to one partition: after a claim the next call's new job is
    there too, and later calls replace that one."""
    pq = PartitionedQueue.create(client, queue_name, partitions=3)
    try:
        first = pq.enqueue("d", {"n": 1}, key="u:9", debounce=True)
        (got,) = pq.claim("w", limit=5, lease_ms=10_000).jobs
        assert got.id == first
        second = pq.enqueue("d", {"n": 2}, key="u:9", debounce=True, delay_ms=60_000)
        assert second != first
        assert pq.enqueue("d", {"n": 3}, key="u:9", debounce=True, delay_ms=60_000) == second
        assert json.loads(pq.get_job(second).payload_json) == {"n": 3}
        assert pq.status(first) == "leased" and pq.status(second) == "scheduled"
        assert pq.counts().scheduled == 1
    finally:
        delete_partitioned(client, pq)


def test_a_replaced_job_keeps_its_dependants(tq: tuple[Queue, Clock]) -> None:
    """A job enqueued after=[the debounced job] waits for the id, which a replacement keeps:
    it runs once the replaced job is done, not before, and not lost."""
    q, clock = tq
    clock.set_ms(T0)
    parent = q.enqueue("digest", {"n": 1}, key="dep", debounce=True, delay_ms=60_000)
    child = q.enqueue("notify", {}, after=[parent])
    assert q.enqueue("digest", {"n": 2}, key="dep", debounce=True) == parent
    (got,) = q.claim("w", limit=5, lease_ms=10_000).jobs
    assert (got.id, json.loads(got.payload_json)) == (parent, {"n": 2})
    assert q.status(child) == "held"
    q.complete(parent, got.token, None)
    (nxt,) = q.claim("w", limit=5, lease_ms=10_000).jobs
    assert nxt.id == child


def test_a_task_handle_debounces_with_its_payload_type_checked(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    registry = Registry()

    @registry.task("digest", payload_type=Digest)
    def digest(payload: Digest, ctx: JobContext) -> None:
        return None

    first = digest.enqueue(q, Digest(1), key="h", debounce=True, delay_ms=60_000)
    assert digest.enqueue(q, Digest(2), key="h", debounce=True, delay_ms=60_000) == first
    before = dump_queue(client, q)
    with pytest.raises(BadArgument):
        digest.enqueue(q, {"n": 3}, key="h", debounce=True)
    assert dump_queue(client, q) == before
    assert _payload(q, first) == {"n": 2}


def test_enqueue_many_with_a_debounced_spec_replaces_and_creates(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    clock.set_ms(T0)
    first = q.enqueue("digest", {"n": 1}, key="a", debounce=True, delay_ms=60_000)
    ids = q.enqueue_many(
        [
            JobSpec("digest", {"n": 2}, key="a", debounce=True, delay_ms=60_000),
            JobSpec("digest", {"n": 3}, key="b", debounce=True, delay_ms=60_000),
            JobSpec("other", {}),
        ]
    )
    assert ids[0] == first and ids[1] != first and len(set(ids)) == 3
    assert _payload(q, first) == {"n": 2}
    assert q.counts().scheduled == 2


# Progress -----------------------------------------------------------------------------------


def test_progress_after_the_job_completed_or_was_retried_is_refused_and_kept(
    redis_url: str, tq: tuple[Queue, Clock]
) -> None:
    """A run's token after its complete / fail: 'missing', nothing written. The progress of
    an earlier attempt stays readable through a retry (Job.progress: 'any attempt') until the
    new run reports its own; and on the finished record (`jobs show --json`)."""
    q, clock = tq
    clock.set_ms(T0)
    job = q.enqueue("report", {}, max_attempts=2)
    token = _claim_one(q, job)
    assert q.set_progress(job, token, {"attempt": 1}) == "held"
    first_ms = q.get_job(job).progress_ms
    assert q.fail(job, token, RuntimeError("flaky")).status == "retry"
    assert q.set_progress(job, token, "late") == "missing"
    assert q.get_job(job).progress == {"attempt": 1}
    clock.set_ms(T0 + 3_600_000)  # past any backoff
    token2 = _claim_one(q, job)
    assert q.get_job(job).progress == {"attempt": 1}  # kept into the next attempt
    clock.set_ms(T0 + 3_600_500)
    assert q.set_progress(job, token2, {"attempt": 2}) == "held"
    assert q.get_job(job).progress_ms == T0 + 3_600_500 != first_ms
    q.complete(job, token2, None)
    assert q.set_progress(job, token2, "after") == "missing"
    assert q.set_progress(job, token, "older") == "missing"
    assert q.get_job(job).progress == {"attempt": 2}
    shown = CliRunner().invoke(
        main,
        ["jobs", "show", "-q", q.name, job, "--url", redis_url, "--json"],
        catch_exceptions=False,
    )
    data = json.loads(shown.stdout)
    assert data["progress"] == {"attempt": 2} and data["progress_ms"] == T0 + 3_600_500


def test_jobs_show_json_has_a_null_progress_when_none_was_reported(
    redis_url: str, q: Queue
) -> None:
    job = q.enqueue("report", {})
    shown = CliRunner().invoke(
        main,
        ["jobs", "show", "-q", q.name, job, "--url", redis_url, "--json"],
        catch_exceptions=False,
    )
    data = json.loads(shown.stdout)
    assert data["progress"] is None and data["progress_ms"] is None


def test_progress_neither_extends_nor_breaks_the_lease(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    job = q.enqueue("report", {})
    token = _claim_one(q, job)
    until = client.zscore(q.keys.leased, job)
    assert until == T0 + 10_000
    for i in range(5):
        clock.set_ms(T0 + 1_000 * (i + 1))
        assert q.set_progress(job, token, i) == "held"
    assert client.zscore(q.keys.leased, job) == until
    lease_until, statuses = q.heartbeat([(job, token)], lease_ms=10_000)
    assert statuses == {job: "held"} and lease_until == T0 + 15_000
    clock.set_ms(T0 + 14_999)
    assert q.set_progress(job, token, "late but held") == "held"
    clock.set_ms(T0 + 15_000)
    assert q.set_progress(job, token, "lapsed") == "expired"
    assert q.get_job(job).progress == "late but held"


@pytest.mark.parametrize(
    "value",
    [
        10**5000,  # int too long for str()
        float("inf"),
        b"bytes",
        {(1, 2): "tuple key"},
        "é" * 2048,  # 4,098 bytes as UTF-8 text
        ["x" * 1000] * 5,
    ],
    ids=["huge-int", "inf", "bytes", "tuple-key", "utf8-over", "list-over"],
)
def test_a_refused_progress_writes_nothing_and_keeps_the_last_good_one(
    client: redis.Redis, q: Queue, value: Any
) -> None:
    job = q.enqueue("report", {})
    token = _claim_one(q, job)
    assert q.set_progress(job, token, {"ok": 1}) == "held"
    before = dump_queue(client, q)
    with pytest.raises(InvalidPayload):
        q.set_progress(job, token, value)
    assert dump_queue(client, q) == before
    assert q.get_job(job).progress == {"ok": 1}


def test_a_deeply_nested_progress_is_refused_typed(q: Queue) -> None:
    nested: Any = []
    for _ in range(100_000):
        nested = [nested]
    job = q.enqueue("report", {})
    token = _claim_one(q, job)
    with pytest.raises(InvalidPayload):
        q.set_progress(job, token, nested)
    with pytest.raises(InvalidPayload):
        JobContext.for_test().set_progress(nested)
    assert q.get_job(job).progress is None


def test_progress_at_exactly_the_limit_in_multibyte_text_is_kept(q: Queue) -> None:
    value = "é" * ((MAX_PROGRESS_BYTES - 2) // 2)  # 4,094 bytes and two quotes
    job = q.enqueue("report", {})
    token = _claim_one(q, job)
    assert q.set_progress(job, token, value) == "held"
    assert q.get_job(job).progress == value


def test_a_handler_s_refused_progress_fails_its_run_typed(redis_url: str, q: Queue) -> None:
    """set_progress raises in the handler (InvalidPayload): the run fails with that error, the
    progress set before it stays."""
    registry = Registry()

    @registry.task("bad_progress")
    def bad_progress(payload: dict[str, Any], ctx: JobContext) -> None:
        ctx.set_progress({"ok": True})
        ctx.set_progress({"set": {1, 2}})

    job = q.enqueue("bad_progress", {}, max_attempts=1)
    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=50, lease_ms=30_000, grace_s=0)
    assert run_until(redis_url, registry, settings, lambda: q.status(job) == "dead")
    got = q.get_job(job)
    assert got.errors[-1]["type"] == "InvalidPayload"
    assert got.progress == {"ok": True}


def test_a_handler_s_progress_stays_through_a_retry(redis_url: str, q: Queue) -> None:
    """Attempt 1 reports progress and fails; attempt 2 reports none and completes: the record
    keeps attempt 1's (Job.progress: 'the latest a run of it reported, any attempt'); an
    attempt that reports replaces it."""
    from scheduler import Backoff

    registry = Registry()

    @registry.task("flaky")
    async def flaky(payload: dict[str, Any], ctx: JobContext) -> None:
        if ctx.attempt == 1:
            ctx.set_progress({"attempt": 1})
            raise RuntimeError("first time")
        if payload.get("report"):
            ctx.set_progress({"attempt": ctx.attempt})

    quick = Backoff(base_ms=10, factor=1, cap_ms=10, jitter=0)
    silent = q.enqueue("flaky", {}, max_attempts=2, backoff=quick)
    loud = q.enqueue("flaky", {"report": True}, max_attempts=2, backoff=quick)
    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=50, lease_ms=30_000, grace_s=0)
    assert run_until(
        redis_url, registry, settings, lambda: {q.status(silent), q.status(loud)} == {"done"}
    )
    assert q.get_job(silent).progress == {"attempt": 1}
    assert q.get_job(loud).progress == {"attempt": 2}


def test_progress_set_after_a_cancel_is_not_written(redis_url: str, q: Queue) -> None:
    """The job is cancelled while its sync handler runs; what the handler reports after that
    (it saw ctx.stopped) is refused by the server: the record keeps the value from before."""
    registry = Registry()
    go_on = threading.Event()

    @registry.task("long")
    def long(payload: dict[str, Any], ctx: JobContext) -> None:
        ctx.set_progress("before")
        assert go_on.wait(20)
        assert _poll(lambda: ctx.stopped.is_set())
        ctx.set_progress("after the cancel")

    job = q.enqueue("long", {})
    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=50, lease_ms=30_000, grace_s=5)

    def step() -> bool:
        got = q.get_job(job)
        if got.state == "leased" and got.progress == "before":
            q.cancel(job)
            go_on.set()
        return go_on.is_set() and q.status(job) == "cancelled"

    with worker_thread(redis_url, registry, settings) as w:
        assert _poll(step)
        # The handler has ended once the worker runs nothing.
        assert _poll(lambda: not w.running)
    assert q.get_job(job).progress == "before"


def _stopped_after_progress(redis_url: str, q: Queue, job: str) -> None:
    """A worker runs `job` (its async handler reports progress, then works on) and is stopped
    gracefully (grace 0) between two heartbeats: the run is given back."""
    registry = Registry()
    started = threading.Event()

    @registry.task("digest")
    async def digest(payload: dict[str, Any], ctx: JobContext) -> None:
        ctx.set_progress({"sent": 3})
        started.set()
        await asyncio.sleep(60)  # stopped by the shutdown

    # Heartbeats far apart: the progress is set between two of them, as most are.
    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=20_000, lease_ms=60_000, grace_s=0)
    with worker_thread(redis_url, registry, settings):
        assert started.wait(15)
    assert _poll(lambda: q.status(job) == "due")  # given back at the stop


def test_progress_set_before_a_graceful_stop_reaches_the_job_it_gives_back(
    redis_url: str, q: Queue
) -> None:
    job = q.enqueue("digest", {"n": 1})
    _stopped_after_progress(redis_url, q, job)
    assert q.get_job(job).progress == {"sent": 3}


def test_a_run_that_set_progress_before_a_graceful_stop_is_not_debounced_away(
    redis_url: str, q: Queue
) -> None:
    job = q.enqueue("digest", {"n": 1}, key="g", debounce=True)
    _stopped_after_progress(redis_url, q, job)
    again = q.enqueue("digest", {"n": 2}, key="g", debounce=True)
    assert again != job
    assert _payload(q, job) == {"n": 1}


def test_a_run_whose_progress_a_heartbeat_carried_is_not_debounced_away_at_a_stop(
    redis_url: str, q: Queue
) -> None:
    """The same stop once a heartbeat has written the progress: the run counts as started."""
    registry = Registry()

    @registry.task("digest")
    async def digest(payload: dict[str, Any], ctx: JobContext) -> None:
        ctx.set_progress({"sent": 3})
        await asyncio.sleep(60)  # stopped by the shutdown

    job = q.enqueue("digest", {"n": 1}, key="g", debounce=True)
    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=50, lease_ms=30_000, grace_s=0)
    with worker_thread(redis_url, registry, settings):
        assert _poll(lambda: q.get_job(job).progress == {"sent": 3})
    assert _poll(lambda: q.status(job) == "due")
    again = q.enqueue("digest", {"n": 2}, key="g", debounce=True)
    assert again != job
    assert (_payload(q, job), _payload(q, again)) == ({"n": 1}, {"n": 2})
