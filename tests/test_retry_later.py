"""`raise RetryLater(delay_ms)` in a handler (worker/retry_later.py): the attempt fails and the
job is retried after that delay instead of its backoff (a webhook's 429 Retry-After); it counts
as an attempt and the job is parked after its last; retried even when `non_retryable` covers
it; a delay out of range is refused where it is built. Through a real worker on a real Redis."""

from __future__ import annotations

import copy
import multiprocessing
import pickle
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

from scheduler import BadArgument, JobContext, Queue, Registry, RetryLater
from scheduler.core.backoff import Backoff
from scheduler.worker import WorkerSettings
from tests.embedded_worker import run_until

HOUR = Backoff(base_ms=3_600_000, factor=1.0, cap_ms=3_600_000, jitter=0.0)


def _settings(q: Queue) -> WorkerSettings:
    return WorkerSettings(queues=(q.name,), heartbeat_ms=50, lease_ms=1_000, grace_s=0)


def _failed_times(q: Queue, job_id: str, n: int) -> Callable[[], bool]:
    return lambda: len(q.get_job(job_id).errors) >= n


def test_the_retry_waits_the_asked_delay_not_the_backoff(redis_url: str, q: Queue) -> None:
    registry = Registry()

    @registry.task("webhook", backoff=HOUR)
    async def webhook(payload: Any, ctx: JobContext) -> None:
        raise RetryLater(90_000, "429 Too Many Requests")

    job_id = webhook.enqueue(q, {"url": "https://example.invalid"})
    assert run_until(redis_url, registry, _settings(q), _failed_times(q, job_id, 1))
    j = q.get_job(job_id)
    assert j.state == "scheduled" and j.attempts == 1
    (err,) = j.errors
    assert err["type"] == "RetryLater"
    assert err["message"] == "retry in 90000 ms: 429 Too Many Requests"
    assert j.run_at_ms is not None
    assert j.run_at_ms - int(err["at_ms"]) == 90_000  # not the hour of its backoff


def test_it_counts_as_an_attempt_and_the_last_one_parks_the_job(redis_url: str, q: Queue) -> None:
    registry = Registry()
    runs: list[int] = []

    @registry.task("poll", max_attempts=3, backoff=HOUR, non_retryable=(Exception,))
    def poll(payload: Any, ctx: JobContext) -> None:  # sync: run in a thread
        runs.append(ctx.attempt)
        raise RetryLater(0)  # at once, though Exception is non_retryable and the backoff 1 h

    job_id = poll.enqueue(q, None)
    assert run_until(redis_url, registry, _settings(q), lambda: q.status(job_id) == "dead")
    j = q.get_job(job_id)
    assert runs == [1, 2, 3]
    assert (j.dead_reason, j.attempts) == ("attempts exhausted", 3)
    assert [e["message"] for e in j.errors] == ["retry in 0 ms"] * 3


@pytest.mark.parametrize("bad", [-1, 3650 * 86_400_000 + 1, 1.5, True, "5"])
def test_a_delay_out_of_range_is_refused_where_it_is_built(bad: Any) -> None:
    with pytest.raises(BadArgument, match="delay_ms"):
        RetryLater(bad)


def test_a_bad_delay_in_a_handler_fails_the_attempt_by_the_backoff(
    redis_url: str, q: Queue
) -> None:
    registry = Registry()

    @registry.task("oops", backoff=HOUR)
    async def oops(payload: Any, ctx: JobContext) -> None:
        raise RetryLater(-5)

    job_id = oops.enqueue(q, None)
    assert run_until(redis_url, registry, _settings(q), _failed_times(q, job_id, 1))
    j = q.get_job(job_id)
    (err,) = j.errors
    assert err["type"] == "BadArgument" and "delay_ms" in err["message"]
    assert j.run_at_ms is not None
    assert j.run_at_ms - int(err["at_ms"]) == 3_600_000  # its backoff


def test_a_middleware_may_ask_for_later_too(redis_url: str, q: Queue) -> None:
    """A middleware (an async one, around async handlers) that turns the partner's
    rate-limit error into RetryLater: the run's outcome, as if the handler had raised it."""
    registry = Registry()

    class RateLimited(Exception):
        pass

    @registry.middleware
    async def retry_after(call_next: Callable[..., Any], payload: Any, ctx: JobContext) -> Any:
        try:
            return await call_next(payload, ctx)
        except RateLimited as exc:
            raise RetryLater(45_000, str(exc)) from exc

    @registry.task("sync_crm", backoff=HOUR, non_retryable=(RateLimited,))
    async def sync_crm(payload: Any, ctx: JobContext) -> None:
        raise RateLimited("retry-after 45")

    job_id = sync_crm.enqueue(q, None)
    assert run_until(redis_url, registry, _settings(q), _failed_times(q, job_id, 1))
    j = q.get_job(job_id)
    (err,) = j.errors
    assert (j.state, err["type"]) == ("scheduled", "RetryLater")
    assert j.run_at_ms is not None
    assert j.run_at_ms - int(err["at_ms"]) == 45_000


def _ask_later_in_a_child(delay_ms: int) -> None:
    raise RetryLater(delay_ms, "429 from the partner")


def test_a_retry_later_from_a_process_pool_keeps_its_delay(redis_url: str, q: Queue) -> None:
    """A sync handler that runs its work in a process pool: the child's RetryLater comes back
    pickled. It did not unpickle (RetryLater(message) is a bad delay), which broke the pool
    (BrokenProcessPool) and failed the job by its backoff."""
    registry = Registry()

    @registry.task("crunch", backoff=HOUR)
    def crunch(payload: Any, ctx: JobContext) -> None:
        spawn = multiprocessing.get_context("spawn")  # not a fork of the worker
        with ProcessPoolExecutor(1, mp_context=spawn) as pool:
            pool.submit(_ask_later_in_a_child, 70_000).result()

    job_id = crunch.enqueue(q, None)
    assert run_until(redis_url, registry, _settings(q), _failed_times(q, job_id, 1), timeout_s=60)
    j = q.get_job(job_id)
    (err,) = j.errors
    assert err["type"] == "RetryLater", err
    assert j.run_at_ms is not None
    assert j.run_at_ms - int(err["at_ms"]) == 70_000


def test_a_retry_later_survives_pickle_and_copy() -> None:
    e = RetryLater(5_000, "later")
    for twin in (pickle.loads(pickle.dumps(e)), copy.copy(e), copy.deepcopy(e)):
        assert type(twin) is RetryLater
        assert (twin.delay_ms, twin.message, str(twin)) == (5_000, "later", str(e))
    sub = pickle.loads(pickle.dumps(_Later("7")))  # an app's subclass, its own __init__
    assert (type(sub), sub.delay_ms, sub.why, str(sub)) == (_Later, 7_000, "7", "retry in 7000 ms")


class _Later(RetryLater):
    def __init__(self, retry_after_s: str) -> None:
        super().__init__(int(retry_after_s) * 1000)
        self.why = retry_after_s


class _Throttled(RetryLater):
    """An app's subclass that sets the delay itself from a Retry-After header, as a float."""

    def __init__(self, retry_after_s: str) -> None:
        super().__init__(0, "throttled")
        self.delay_ms = float(retry_after_s) * 1000  # type: ignore[assignment]


def test_a_bad_delay_set_after_it_was_built_fails_only_its_own_job(
    redis_url: str, q: Queue
) -> None:
    """A delay_ms that is no int in range (set by a subclass after the checks): its job fails
    by the backoff. It was sent as is to fail, whose BadArgument was taken for a report to send
    again: every outcome of the worker queued behind it for ever."""
    registry = Registry()

    @registry.task("hook", backoff=HOUR)
    async def hook(payload: Any, ctx: JobContext) -> None:
        raise _Throttled("1.5")

    @registry.task("fine")
    async def fine(payload: Any, ctx: JobContext) -> str:
        return "ok"

    bad = hook.enqueue(q, None)
    good = fine.enqueue(q, None)
    done = lambda: q.status(good) == "done" and len(q.get_job(bad).errors) >= 1  # noqa: E731
    assert run_until(redis_url, registry, _settings(q), done)
    j = q.get_job(bad)
    (err,) = j.errors
    assert err["type"] == "_Throttled"
    assert j.run_at_ms is not None
    assert j.run_at_ms - int(err["at_ms"]) == 3_600_000  # its backoff


def test_a_delay_past_the_start_deadline_parks_the_job_at_once(redis_url: str, q: Queue) -> None:
    """As a retry whose backoff ends after the job's start deadline (README): parked now, with
    attempts left, not left to wait for a claim to park it then."""
    registry = Registry()

    @registry.task("remind", max_attempts=5)
    async def remind(payload: Any, ctx: JobContext) -> None:
        raise RetryLater(120_000, "the partner is down")

    job_id = q.enqueue("remind", None, max_attempts=5, start_within_ms=60_000)
    assert run_until(redis_url, registry, _settings(q), lambda: q.status(job_id) == "dead")
    j = q.get_job(job_id)
    assert (j.dead_reason, j.attempts) == ("start deadline passed", 1)
    assert [e["type"] for e in j.errors] == ["RetryLater"]
