"""The app developer's extension points around a job's run, from a review: outcome hooks
(`@registry.on_outcome`), middleware (`@registry.middleware`), progress (`ctx.set_progress`)
and the JobContext a run is given (docs/guide/workers.md "Outcome hooks", "Middleware",
"Reporting progress"). Each scenario is run through a real worker on a real Redis, sync and async
handlers alike, on a plain Queue and on a PartitionedQueue where the path differs. The strict
xfails are the defects found."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from scheduler import (
    AsyncPartitionedQueue,
    AsyncQueue,
    Backoff,
    InvalidPayload,
    JobContext,
    JobOutcome,
    PartitionedQueue,
    Queue,
    Registry,
    RetryLater,
)
from scheduler.core.connection import connect_async
from scheduler.worker import Worker, WorkerSettings
from tests.embedded_worker import run_until, worker_thread
from tests.redis_server import is_cluster_run

NOW = Backoff(base_ms=0, factor=1.0, cap_ms=0, jitter=0.0)
KINDS = ("sync", "async")
ONE_SLOT: dict[str, Any] = {"concurrency": 1, "prefetch": 0}


def _settings(queue: str, **kw: Any) -> WorkerSettings:
    opts: dict[str, Any] = {"heartbeat_ms": 50, "lease_ms": 2_000, "grace_s": 0}
    return WorkerSettings(queues=(queue,), **(opts | kw))


def _wait(cond: Callable[[], bool], bound_s: float = 20.0) -> bool:
    """Poll cond until it holds or a liveness bound passes (the verdict is asserted after)."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


@dataclass
class Seen:
    """One hook call, copied out when it was made (the ctx is the run's, mutable)."""

    word: str
    job_id: str
    attempt: int
    token: str
    fence: int
    queue: str
    stop_reason: str | None
    progress: Any
    error: BaseException | None
    error_type: str | None
    error_message: str | None
    retry_at_ms: int | None
    dead_reason: str | None
    ctx: JobContext


class Hooks:
    """An outcome hook recording every call (thread-safe: read from the test's thread)."""

    def __init__(self, registry: Registry) -> None:
        self.calls: list[Seen] = []
        self._lock = threading.Lock()
        registry.on_outcome(self)

    def __call__(self, o: JobOutcome) -> None:
        c = o.ctx
        seen = Seen(
            o.outcome, c.job_id, c.attempt, c.token, c.fence, c.queue, c.stop_reason,
            c.progress, o.error, o.error_type, o.error_message, o.retry_at_ms, o.dead_reason, c,
        )  # fmt: skip
        with self._lock:
            self.calls.append(seen)

    def of(self, job_id: str) -> list[Seen]:
        with self._lock:
            return [s for s in self.calls if s.job_id == job_id]

    def words(self, job_id: str) -> list[str]:
        return [s.word for s in self.of(job_id)]


# --- one queue or a partitioned queue: the same worker paths ---------------------------------


@pytest.fixture(params=["queue", "partitioned"])
def anyq(request: pytest.FixtureRequest, q: Queue, make_pq: Callable[..., PartitionedQueue]) -> Any:
    if request.param == "queue":
        return q
    if is_cluster_run():
        pytest.skip("the partitioned variant runs on the single server")
    return make_pq(partitions=2, suffix="-pq")


def _part(queue: Any, job_id: str) -> Queue:
    """The plain queue holding job_id (a partitioned queue's partition)."""
    return queue.part_of(job_id) if isinstance(queue, PartitionedQueue) else queue


# --- every outcome's words, attempts, tokens and errors: sync and async alike -----------------


class Boom(Exception):
    pass


def _lifecycle_registry(tokens: dict[tuple[str, int], str]) -> Registry:
    registry = Registry()
    for kind in KINDS:

        def record(payload: Any, ctx: JobContext) -> None:
            tokens[(ctx.job_id, ctx.attempt)] = ctx.token
            ctx.set_progress({"attempt": ctx.attempt})

        if kind == "sync":

            @registry.task("sync.work", max_attempts=2, backoff=NOW, timeout_s=0.3)
            def sync_work(payload: Any, ctx: JobContext, record: Any = record) -> Any:
                record(payload, ctx)
                if (payload == "flaky" and ctx.attempt == 1) or payload == "broken":
                    raise Boom(f"{payload} {ctx.attempt}")
                if payload == "slow":
                    ctx.stopped.wait(10)
                    return "late"
                return payload

        else:

            @registry.task("async.work", max_attempts=2, backoff=NOW, timeout_s=0.3)
            async def async_work(payload: Any, ctx: JobContext, record: Any = record) -> Any:
                record(payload, ctx)
                if (payload == "flaky" and ctx.attempt == 1) or payload == "broken":
                    raise Boom(f"{payload} {ctx.attempt}")
                if payload == "slow":
                    await asyncio.sleep(10)
                    return "late"
                return payload

    return registry


EXPECTED = {
    "ok": ["done"],
    "flaky": ["retry", "done"],
    "broken": ["retry", "dead"],
    "slow": ["timeout", "retry", "timeout", "dead"],
}


@pytest.mark.parametrize("kind", KINDS)
def test_each_outcome_reaches_the_hook_once_with_its_run_s_attempt_and_token(
    redis_url: str, anyq: Any, kind: str
) -> None:
    """Per job, the words in order; each call carries the ctx of the run it is about (its
    attempt, its claim's token, the progress it set), the handler's own exception on a retry
    and dead, none on a timeout's; a timed-out handler's late return is no `done`."""
    tokens: dict[tuple[str, int], str] = {}
    registry = _lifecycle_registry(tokens)
    hooks = Hooks(registry)
    ids = {p: anyq.enqueue(f"{kind}.work", p, max_attempts=2, backoff=NOW) for p in EXPECTED}

    def settled() -> bool:
        return all(len(hooks.words(i)) >= len(EXPECTED[p]) for p, i in ids.items()) and all(
            anyq.status(i) in ("done", "dead") for i in ids.values()
        )

    assert run_until(redis_url, registry, _settings(anyq.name), settled, timeout_s=20)
    for p, i in ids.items():
        seen = hooks.of(i)
        assert [s.word for s in seen] == EXPECTED[p], p
        for s in seen:
            assert s.token == tokens[(i, s.attempt)], (p, s.word)  # the run it is about
            assert s.progress == {"attempt": s.attempt}
            assert s.queue == _part(anyq, i).name
            assert s.ctx.job_id == i
        for s in seen:
            if s.word in ("retry", "dead") and p != "slow":
                assert isinstance(s.error, Boom) and str(s.error) == f"{p} {s.attempt}"
                assert s.error_type == "Boom"
            elif s.word in ("retry", "dead"):
                assert s.error is None and s.error_type == "JobTimeout"
            else:
                assert s.error is None
            if s.word == "retry":
                assert s.retry_at_ms is not None and s.dead_reason is None
            if s.word == "dead":
                assert s.dead_reason and s.retry_at_ms is None
            if s.word == "timeout":
                assert s.stop_reason == "timeout"
            if s.word == "done":
                assert s.stop_reason is None
    assert [s.attempt for s in hooks.of(ids["slow"])] == [1, 1, 2, 2]
    assert [s.attempt for s in hooks.of(ids["flaky"])] == [1, 2]
    # The last run's progress, written ahead of its complete or fail, kept on the record.
    for p in ("flaky", "broken", "slow"):
        assert anyq.get_job(ids[p]).progress == {"attempt": 2}, p


# --- a stale worker: its refused complete is reported as stale, never done -------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_whose_job_another_claim_took_reports_stale_not_done(
    redis_url: str, anyq: Any, kind: str
) -> None:
    """A worker that stalled past its lease (here: its lease is made to lapse, as a GC pause
    would) and whose job another claim took finishes its run: its complete is refused; the hook
    says `stale` with this run's token, and neither its result nor its last progress lands on
    the job the new holder owns."""
    registry = Registry()
    hooks = Hooks(registry)
    started, go = threading.Event(), threading.Event()

    if kind == "sync":

        @registry.task("stall")
        def stall(payload: Any, ctx: JobContext) -> str:
            started.set()
            go.wait(20)
            ctx.set_progress("stale run")
            return "stale result"

    else:

        @registry.task("stall")
        async def astall(payload: Any, ctx: JobContext) -> str:
            started.set()
            while not go.is_set():
                await asyncio.sleep(0.01)
            ctx.set_progress("stale run")
            return "stale result"

    job_id = anyq.enqueue("stall", None, max_attempts=3)
    part = _part(anyq, job_id)
    # Heartbeats far apart: the stalled run's complete goes before the next one would notice.
    # One slot, no prefetch: this worker claims nothing more while the run holds it.
    settings = _settings(anyq.name, heartbeat_ms=20_000, lease_ms=60_000, **ONE_SLOT)
    with worker_thread(redis_url, registry, settings):
        assert started.wait(20)
        part.client.zadd(part.keys.leased, {job_id: 1})  # its lease lapsed in the stall
        (thief,) = part.claim("thief", limit=1, lease_ms=60_000).jobs
        assert thief.id == job_id
        assert part.set_progress(job_id, thief.token, "new holder") == "held"
        go.set()
        assert _wait(lambda: bool(hooks.words(job_id)))
        part.complete(job_id, thief.token, "thief's result")
    (seen,) = hooks.of(job_id)
    assert seen.word == "stale"
    assert seen.token != thief.token and seen.attempt == thief.attempts - 1
    assert anyq.result(job_id, timeout_s=5) == "thief's result"
    assert anyq.get_job(job_id).progress == "new holder"


# --- cancelled while it runs: one `cancelled`, nothing after --------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_job_cancelled_while_it_runs_gets_one_cancelled_and_no_late_progress(
    redis_url: str, anyq: Any, kind: str
) -> None:
    registry = Registry()
    hooks = Hooks(registry)
    started, ended = threading.Event(), threading.Event()
    late: list[str] = []

    if kind == "sync":

        @registry.task("long")
        def long(payload: Any, ctx: JobContext) -> str:
            ctx.set_progress("before")
            started.set()
            ctx.stopped.wait(20)
            ctx.set_progress("after the cancel")
            late.append(str(ctx.stop_reason))
            ended.set()
            return "late"

    else:

        @registry.task("long")
        async def along(payload: Any, ctx: JobContext) -> str:
            ctx.set_progress("before")
            started.set()
            try:
                await asyncio.sleep(20)
            finally:
                ctx.set_progress("after the cancel")
                late.append(str(ctx.stop_reason))
                ended.set()
            return "late"

    @registry.task("marker")
    async def marker(payload: Any, ctx: JobContext) -> None:
        return None

    job_id = anyq.enqueue("long", None)
    with worker_thread(redis_url, registry, _settings(anyq.name)):
        assert started.wait(20)
        assert _wait(lambda: anyq.get_job(job_id).progress == "before")
        assert anyq.cancel(job_id) == "leased"
        assert ended.wait(20)
        assert _wait(lambda: bool(hooks.words(job_id)))
        # A later job run to its end: the worker went on past the late return.
        mark = anyq.enqueue("marker", None)
        assert _wait(lambda: hooks.words(mark) == ["done"])
    assert hooks.words(job_id) == ["cancelled"]
    (seen,) = hooks.of(job_id)
    assert seen.stop_reason == "cancelled" and seen.ctx.cancelled and seen.error is None
    assert late == ["cancelled"]
    assert anyq.status(job_id) == "cancelled"
    assert anyq.get_job(job_id).progress == "before"


# --- shutdown: `released` once, the attempt given back, a late return is no outcome --------


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_given_back_at_shutdown_is_released_once_and_its_attempt_returned(
    redis_url: str, anyq: Any, kind: str
) -> None:
    registry = Registry()
    hooks = Hooks(registry)
    started = threading.Event()
    attempts: list[int] = []
    returned = threading.Event()

    if kind == "sync":

        @registry.task("held")
        def held(payload: Any, ctx: JobContext) -> str:
            attempts.append(ctx.attempt)
            if len(attempts) > 1:
                return "second run"
            started.set()
            ctx.stopped.wait(20)
            returned.set()
            return "late"

    else:

        @registry.task("held")
        async def aheld(payload: Any, ctx: JobContext) -> str:
            attempts.append(ctx.attempt)
            if len(attempts) > 1:
                return "second run"
            started.set()
            try:
                await asyncio.sleep(20)
            finally:
                returned.set()
            return "late"

    job_id = anyq.enqueue("held", None, max_attempts=3)
    with worker_thread(redis_url, registry, _settings(anyq.name)):
        assert started.wait(20)
    assert returned.wait(20)
    assert hooks.words(job_id) == ["released"]
    (seen,) = hooks.of(job_id)
    assert seen.stop_reason == "shutdown" and seen.attempt == 1
    assert anyq.status(job_id) in ("due", "scheduled")
    assert run_until(
        redis_url, registry, _settings(anyq.name), lambda: anyq.status(job_id) == "done"
    )
    assert attempts == [1, 1]  # the release gave the attempt back
    assert hooks.words(job_id) == ["released", "done"]


# --- a report whose answer was lost is sent again: still one hook call ----------------------


def _lose_first_report_answer(w: Worker) -> None:
    """The first report call reaches Redis, its answer is lost (a dropped connection)."""
    orig = w._run_by_node
    lost: list[bool] = []

    async def run_by_node(calls: Any, send: Any = None) -> list[Any]:
        got = await orig(calls, send)
        if send is None and not lost:
            lost.append(True)
            raise redis.ConnectionError("answer lost")
        return got

    w._run_by_node = run_by_node  # type: ignore[method-assign]


@pytest.mark.parametrize("kind", KINDS)
def test_a_report_sent_again_after_its_answer_was_lost_calls_the_hook_once(
    redis_url: str, q: Queue, kind: str
) -> None:
    registry = Registry()
    hooks = Hooks(registry)
    if kind == "sync":

        @registry.task("once")
        def once(payload: Any, ctx: JobContext) -> Any:
            if payload == "fail":
                raise Boom("x")
            return payload

    else:

        @registry.task("once")
        async def aonce(payload: Any, ctx: JobContext) -> Any:
            if payload == "fail":
                raise Boom("x")
            return payload

    ok = q.enqueue("once", "ok")
    bad = q.enqueue("once", "fail", max_attempts=1)

    def settled() -> bool:
        return q.status(ok) == "done" and q.status(bad) == "dead" and len(hooks.calls) >= 2

    assert run_until(
        redis_url, registry, _settings(q.name), settled, setup=_lose_first_report_answer
    )
    assert hooks.words(ok) == ["done"]
    assert hooks.words(bad) == ["dead"]
    assert q.get_job(bad).attempts == 1


# --- middleware: a slow one is timed out, a RetryLater it raises keeps its delay --------------


@pytest.mark.parametrize("kind", KINDS)
def test_the_timeout_covers_a_slow_middleware(redis_url: str, q: Queue, kind: str) -> None:
    registry = Registry()
    hooks = Hooks(registry)
    ran: list[str] = []
    if kind == "sync":

        @registry.middleware
        def slow(call_next: Any, payload: Any, ctx: JobContext) -> Any:
            ctx.stopped.wait(10)
            return call_next(payload, ctx)

        @registry.task("quick", timeout_s=0.2, max_attempts=1)
        def quick(payload: Any, ctx: JobContext) -> str:
            ran.append(ctx.job_id)
            return "ran"

    else:

        @registry.middleware
        async def aslow(call_next: Any, payload: Any, ctx: JobContext) -> Any:
            await asyncio.sleep(10)
            return await call_next(payload, ctx)

        @registry.task("quick", timeout_s=0.2, max_attempts=1)
        async def aquick(payload: Any, ctx: JobContext) -> str:
            ran.append(ctx.job_id)
            return "ran"

    job_id = q.enqueue("quick", None, max_attempts=1)
    assert run_until(redis_url, registry, _settings(q.name), lambda: len(hooks.calls) >= 2)
    assert hooks.words(job_id) == ["timeout", "dead"]
    assert [e["type"] for e in q.get_job(job_id).errors] == ["JobTimeout"]
    assert ran == [] or kind == "sync"  # a sync middleware's thread goes on after the timeout


@pytest.mark.parametrize("kind", KINDS)
def test_a_retry_later_a_middleware_raises_keeps_its_delay_and_reaches_the_hook(
    redis_url: str, q: Queue, kind: str
) -> None:
    registry = Registry()
    hooks = Hooks(registry)
    if kind == "sync":

        @registry.middleware
        def gate(call_next: Any, payload: Any, ctx: JobContext) -> Any:
            raise RetryLater(60_000, "partner down")

        @registry.task("gated", non_retryable=(RetryLater,))
        def gated(payload: Any, ctx: JobContext) -> None:
            return None

    else:

        @registry.middleware
        async def agate(call_next: Any, payload: Any, ctx: JobContext) -> Any:
            raise RetryLater(60_000, "partner down")

        @registry.task("gated", non_retryable=(RetryLater,))
        async def agated(payload: Any, ctx: JobContext) -> None:
            return None

    job_id = q.enqueue("gated", None, max_attempts=3, backoff=NOW)
    assert run_until(redis_url, registry, _settings(q.name), lambda: bool(hooks.calls))
    (seen,) = hooks.of(job_id)
    assert seen.word == "retry" and isinstance(seen.error, RetryLater)
    assert seen.retry_at_ms is not None
    assert seen.retry_at_ms >= seen.ctx.claimed_ms + 60_000
    assert q.status(job_id) == "scheduled"


# --- a middleware that re-types the handler's failure: the hooks and retries see its type ---


@pytest.mark.parametrize("kind", KINDS)
def test_a_middleware_that_wraps_the_failure_is_what_the_hook_and_non_retryable_see(
    redis_url: str, q: Queue, kind: str
) -> None:
    class Wrapped(Exception):
        pass

    registry = Registry()
    hooks = Hooks(registry)
    if kind == "sync":

        @registry.middleware
        def wrap(call_next: Any, payload: Any, ctx: JobContext) -> Any:
            try:
                return call_next(payload, ctx)
            except Boom as exc:
                raise Wrapped("wrapped") from exc

        @registry.task("wrapped", non_retryable=(Wrapped,))
        def handler(payload: Any, ctx: JobContext) -> None:
            raise Boom("inner")

    else:

        @registry.middleware
        async def awrap(call_next: Any, payload: Any, ctx: JobContext) -> Any:
            try:
                return await call_next(payload, ctx)
            except Boom as exc:
                raise Wrapped("wrapped") from exc

        @registry.task("wrapped", non_retryable=(Wrapped,))
        async def ahandler(payload: Any, ctx: JobContext) -> None:
            raise Boom("inner")

    job_id = q.enqueue("wrapped", None, max_attempts=3)
    assert run_until(redis_url, registry, _settings(q.name), lambda: bool(hooks.calls))
    (seen,) = hooks.of(job_id)
    assert seen.word == "dead" and seen.error_type == "Wrapped"
    assert isinstance(seen.error, Wrapped) and isinstance(seen.error.__cause__, Boom)
    assert q.get_job(job_id).attempts == 1


# --- progress: limits in bytes, refusals typed, an earlier value kept ------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_progress_raises_in_the_handler_and_keeps_the_last_good_one(
    redis_url: str, anyq: Any, kind: str
) -> None:
    """Over 4,096 bytes (counted in UTF-8: 'é' is two), NaN, a lone surrogate or an object:
    InvalidPayload where it is set; the value set before stays and is written."""
    at_limit = "é" * 2047  # '"' + 4,094 bytes + '"': exactly 4,096
    bad_values: list[Any] = ["é" * 2048, float("nan"), "\ud800", object(), {1: "a", "1": "b"}]
    refused: list[str] = []

    def body(ctx: JobContext) -> str:
        ctx.set_progress(at_limit)
        for v in bad_values:
            try:
                ctx.set_progress(v)
            except InvalidPayload:
                refused.append(type(v).__name__)
        assert ctx.progress == at_limit
        return "ok"

    registry = Registry()
    if kind == "sync":

        @registry.task("p")
        def p(payload: Any, ctx: JobContext) -> str:
            return body(ctx)

    else:

        @registry.task("p")
        async def ap(payload: Any, ctx: JobContext) -> str:
            return body(ctx)

    job_id = anyq.enqueue("p", None)
    assert run_until(
        redis_url, registry, _settings(anyq.name), lambda: anyq.status(job_id) == "done"
    )
    assert len(refused) == len(bad_values)
    assert anyq.get_job(job_id).progress == at_limit


def test_one_job_s_progress_at_the_byte_limit_does_not_hold_back_another_s(
    redis_url: str, q: Queue
) -> None:
    """Two runs' progress go in one heartbeat's call: the one at the limit is written, and so
    is the other (a call the script refused would hold back both)."""
    registry = Registry()
    gate = threading.Event()
    at_limit = "€" * 1364  # 3 bytes each: 4,092 + 2 quotes = 4,094 bytes

    @registry.task("two")
    def two(payload: Any, ctx: JobContext) -> str:
        ctx.set_progress(at_limit if payload == "big" else {"small": True})
        gate.wait(20)
        return "ok"

    big, small = q.enqueue("two", "big"), q.enqueue("two", "small")
    with worker_thread(redis_url, registry, _settings(q.name)):
        ok = _wait(lambda: q.get_job(big).progress is not None)
        ok = ok and _wait(lambda: q.get_job(small).progress is not None)
        gate.set()
    assert ok
    assert q.get_job(big).progress == at_limit
    assert q.get_job(small).progress == {"small": True}


# --- the ctx a handler, a middleware and the hooks get is one object --------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_middleware_handler_and_hook_share_the_run_s_context(
    redis_url: str, anyq: Any, kind: str
) -> None:
    registry = Registry()
    hooks = Hooks(registry)
    ctxs: list[JobContext] = []
    if kind == "sync":

        @registry.middleware
        def mw(call_next: Any, payload: Any, ctx: JobContext) -> Any:
            ctxs.append(ctx)
            ctx.set_progress("from the middleware")
            return call_next(payload, ctx)

        @registry.task("t")
        def t(payload: Any, ctx: JobContext) -> Any:
            ctxs.append(ctx)
            return ctx.progress

    else:

        @registry.middleware
        async def amw(call_next: Any, payload: Any, ctx: JobContext) -> Any:
            ctxs.append(ctx)
            ctx.set_progress("from the middleware")
            return await call_next(payload, ctx)

        @registry.task("t")
        async def at(payload: Any, ctx: JobContext) -> Any:
            ctxs.append(ctx)
            return ctx.progress

    job_id = anyq.enqueue("t", None)
    assert run_until(redis_url, registry, _settings(anyq.name), lambda: bool(hooks.calls))
    (seen,) = hooks.of(job_id)
    assert seen.word == "done"
    assert len(ctxs) == 2 and ctxs[0] is ctxs[1] is seen.ctx
    assert anyq.result(job_id, timeout_s=5) == "from the middleware"
    assert anyq.get_job(job_id).progress == "from the middleware"


# --- a hook that raises or exits on one word still gets the next ----------------------------


def test_a_hook_that_raises_on_retry_still_sees_the_dead_and_the_job_is_parked(
    redis_url: str, q: Queue
) -> None:
    registry = Registry()
    words: list[str] = []

    @registry.on_outcome
    def flaky_hook(o: JobOutcome) -> None:
        words.append(o.outcome)
        if o.outcome == "retry":
            raise SystemExit(2)

    @registry.task("bad", max_attempts=2, backoff=NOW)
    def bad(payload: Any, ctx: JobContext) -> None:
        raise Boom("x")

    job_id = q.enqueue("bad", None, max_attempts=2, backoff=NOW)
    assert run_until(redis_url, registry, _settings(q.name), lambda: len(words) >= 2)
    assert words == ["retry", "dead"]
    assert q.status(job_id) == "dead" and q.get_job(job_id).attempts == 2


# --- a hook may start a task on the loop, as the guide says --------------------------------


def test_a_hook_can_hand_slow_work_to_a_task_on_the_loop(redis_url: str, q: Queue) -> None:
    registry = Registry()
    done: list[str] = []
    tasks: set[asyncio.Task[None]] = set()

    async def slow_report(job_id: str) -> None:
        await asyncio.sleep(0.01)
        done.append(job_id)

    @registry.on_outcome
    def report(o: JobOutcome) -> None:
        t = asyncio.get_running_loop().create_task(slow_report(o.ctx.job_id))
        tasks.add(t)
        t.add_done_callback(tasks.discard)

    @registry.task("x")
    async def x(payload: Any, ctx: JobContext) -> None:
        return None

    ids = [q.enqueue("x", None) for _ in range(3)]
    assert run_until(redis_url, registry, _settings(q.name), lambda: len(done) >= 3)
    assert sorted(done) == sorted(ids)


# --- a stolen job the heartbeat finds: `expired`, the handler told, no `done` -----------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_whose_heartbeat_finds_another_holder_is_expired_and_told(
    redis_url: str, q: Queue, kind: str
) -> None:
    registry = Registry()
    hooks = Hooks(registry)
    started, told = threading.Event(), threading.Event()
    if kind == "sync":

        @registry.task("stall")
        def stall(payload: Any, ctx: JobContext) -> str:
            started.set()
            if ctx.stopped.wait(20):
                told.set()
            ctx.set_progress("stale run")
            return "stale result"

    else:

        @registry.task("stall")
        async def astall(payload: Any, ctx: JobContext) -> str:
            started.set()
            try:
                await asyncio.sleep(20)
            finally:
                told.set()
                ctx.set_progress("stale run")
            return "stale result"

    job_id = q.enqueue("stall", None, max_attempts=3)
    with worker_thread(redis_url, registry, _settings(q.name, **ONE_SLOT)):
        assert started.wait(20)
        q.client.zadd(q.keys.leased, {job_id: 1})  # its lease lapsed in a stall
        (thief,) = q.claim("thief", limit=1, lease_ms=60_000).jobs
        assert told.wait(20)
        assert _wait(lambda: bool(hooks.words(job_id)))
        q.complete(job_id, thief.token, "thief's result")
    (seen,) = hooks.of(job_id)
    assert seen.word == "expired" and seen.ctx.lease_expired
    assert seen.token != thief.token
    assert q.result(job_id, timeout_s=5) == "thief's result"
    assert q.get_job(job_id).progress is None


# --- a graceful stop: a run that ends within the grace is done, not released ----------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_that_ends_within_the_grace_is_done_the_other_released(
    redis_url: str, q: Queue, kind: str
) -> None:
    registry = Registry()
    hooks = Hooks(registry)
    started = threading.Barrier(3, timeout=20)
    finish = threading.Event()
    if kind == "sync":

        @registry.task("g")
        def g(payload: Any, ctx: JobContext) -> str:
            started.wait()
            if payload == "quick":
                finish.wait(20)
                ctx.set_progress("finished in the grace")
                return "quick"
            ctx.stopped.wait(20)
            return "late"

    else:

        @registry.task("g")
        async def ag(payload: Any, ctx: JobContext) -> str:
            await asyncio.get_running_loop().run_in_executor(None, started.wait)
            if payload == "quick":
                while not finish.is_set():
                    await asyncio.sleep(0.01)
                ctx.set_progress("finished in the grace")
                return "quick"
            await asyncio.sleep(20)
            return "late"

    quick, long = q.enqueue("g", "quick"), q.enqueue("g", "long")
    settings = _settings(q.name, grace_s=1.5, concurrency=2)
    with worker_thread(redis_url, registry, settings) as w:
        started.wait()
        assert w._loop is not None
        w._loop.call_soon_threadsafe(w.request_stop)
        assert _wait(lambda: w._stop_claiming.is_set())
        finish.set()
    assert hooks.words(quick) == ["done"]
    assert hooks.words(long) == ["released"]
    assert q.result(quick, timeout_s=5) == "quick"
    assert q.get_job(quick).progress == "finished in the grace"
    assert q.status(long) in ("due", "scheduled")


# --- a large payload (decoded off the loop) reaches the middleware decoded --------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_large_payload_reaches_the_middleware_decoded(
    redis_url: str, q: Queue, kind: str
) -> None:
    registry = Registry()
    types_seen: list[str] = []
    if kind == "sync":

        @registry.middleware
        def look(call_next: Any, payload: Any, ctx: JobContext) -> Any:
            types_seen.append(type(payload).__name__)
            return call_next(payload, ctx)

        @registry.task("big")
        def big(payload: Any, ctx: JobContext) -> int:
            return len(payload["blob"])

    else:

        @registry.middleware
        async def alook(call_next: Any, payload: Any, ctx: JobContext) -> Any:
            types_seen.append(type(payload).__name__)
            return await call_next(payload, ctx)

        @registry.task("big")
        async def abig(payload: Any, ctx: JobContext) -> int:
            return len(payload["blob"])

    job_id = q.enqueue("big", {"blob": "x" * 200_000})
    assert run_until(redis_url, registry, _settings(q.name), lambda: q.status(job_id) == "done")
    assert types_seen == ["dict"]
    assert q.result(job_id, timeout_s=5) == 200_000


# --- the hand-driven set_progress: the same answers on every client ---------------------------


def test_set_progress_answers_alike_on_every_client(redis_url: str, anyq: Any) -> None:
    """Queue / PartitionedQueue and their asyncio twins: 'held' and read back while leased;
    InvalidPayload for a value over the limit; 'cancelled' once cancelled and 'missing' once
    done, nothing written either way."""
    held_id, cancel_id, done_id = (anyq.enqueue("t", n) for n in range(3))
    jobs = {j.id: j for j in anyq.claim("hand", limit=3, lease_ms=60_000).jobs}
    assert set(jobs) == {held_id, cancel_id, done_id}
    anyq.cancel(cancel_id)
    anyq.complete(done_id, jobs[done_id].token, None)
    sync_answers = [
        anyq.set_progress(i, jobs[i].token, {"by": "sync"}) for i in (held_id, cancel_id, done_id)
    ]
    with pytest.raises(InvalidPayload):
        anyq.set_progress(held_id, jobs[held_id].token, "x" * 5_000)

    async def from_async() -> list[str]:
        client = connect_async(redis_url)
        try:
            aq: Any = (
                await AsyncPartitionedQueue.open(client, anyq.name)
                if isinstance(anyq, PartitionedQueue)
                else AsyncQueue(client, anyq.name)
            )
            with pytest.raises(InvalidPayload):
                await aq.set_progress(held_id, jobs[held_id].token, "x" * 5_000)
            return [
                await aq.set_progress(i, jobs[i].token, {"by": "async"})
                for i in (held_id, cancel_id, done_id)
            ]
        finally:
            await client.aclose()

    async_answers = asyncio.run(from_async())
    assert sync_answers == async_answers == ["held", "cancelled", "missing"]
    assert anyq.get_job(held_id).progress == {"by": "async"}
    assert anyq.get_job(cancel_id).progress is None
    assert anyq.get_job(done_id).progress is None


# --- an async middleware that swallows the cancel: still one `cancelled`, the worker goes on ---


def test_a_middleware_that_swallows_the_cancel_changes_no_outcome(redis_url: str, q: Queue) -> None:
    registry = Registry()
    hooks = Hooks(registry)
    started = threading.Event()
    swallowed: list[str] = []

    @registry.middleware
    async def stubborn(call_next: Any, payload: Any, ctx: JobContext) -> Any:
        try:
            return await call_next(payload, ctx)
        except asyncio.CancelledError:
            swallowed.append(str(ctx.stop_reason))
            return "swallowed"

    @registry.task("long")
    async def long(payload: Any, ctx: JobContext) -> Any:
        if payload == "long":
            started.set()
            await asyncio.sleep(20)
        return payload

    job_id = q.enqueue("long", "long")
    with worker_thread(redis_url, registry, _settings(q.name, concurrency=1)):
        assert started.wait(20)
        q.cancel(job_id)
        assert _wait(lambda: bool(swallowed))
        after = [q.enqueue("long", n) for n in range(3)]
        assert _wait(lambda: all(q.status(i) == "done" for i in after))
    assert swallowed == ["cancelled"]
    assert hooks.words(job_id) == ["cancelled"]
    assert q.status(job_id) == "cancelled"
    assert [q.result(i, timeout_s=5) for i in after] == [0, 1, 2]


# --- the hook's error_message is the stored one: redacted; the exception is the handler's ----


def test_the_hook_s_error_message_is_redacted_its_error_is_the_handler_s(
    redis_url: str, q: Queue
) -> None:
    registry = Registry()
    hooks = Hooks(registry)
    secret = "s3cr3t-pw"

    @registry.task("leak")
    def leak(payload: Any, ctx: JobContext) -> None:
        raise ConnectionError(f"cannot reach redis://app:{secret}@cache:6379/0")

    job_id = q.enqueue("leak", None, max_attempts=1)
    assert run_until(redis_url, registry, _settings(q.name), lambda: bool(hooks.calls))
    (seen,) = hooks.of(job_id)
    assert seen.word == "dead" and seen.error_message is not None
    assert secret not in seen.error_message and "cache:6379" in seen.error_message
    assert secret in str(seen.error)  # the exception itself, for the app's error tracker
    assert all(secret not in e["message"] for e in q.get_job(job_id).errors)
