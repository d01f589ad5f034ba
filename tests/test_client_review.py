"""The application developer's API, from a review (client, operations, codec, models, the
registry): each test failed on the code as reviewed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from scheduler import AsyncQueue, Backoff, BadArgument, InvalidPayload, Queue
from scheduler.client.chain import achain, chain
from scheduler.core.connection import connect_async
from scheduler.worker.registry import Registry


# Queue settings --------------------------------------------------------------------------------
@pytest.mark.parametrize(("replicas", "timeout_ms"), [(1, -1), (1, 500.0), (1.0, 500)])
def test_a_bad_durability_setting_is_refused_before_a_job_is_written(
    q: Queue, client: redis.Redis, replicas: Any, timeout_ms: Any
) -> None:
    """Queue(wait_replicas=, wait_timeout_ms=) are not checked: enqueue writes the job, then
    WAIT fails with Redis's own ResponseError, so the caller gets neither a typed error nor
    the id (a float like `timeout_s * 1000` is enough), and a retry enqueues it again."""
    with pytest.raises(BadArgument):
        durable = Queue(client, q.name, wait_replicas=replicas, wait_timeout_ms=timeout_ms)
        durable.enqueue("t", {"n": 1})
    assert q.counts().due == 0, "a refused enqueue left a job behind (its id never returned)"


# chain -----------------------------------------------------------------------------------------
def test_chain_with_a_bad_step_writes_no_step(q: Queue) -> None:
    """A bad payload in a later step must refuse the whole chain, not leave the first steps
    enqueued (they would run, and a retried chain() would enqueue them a second time)."""
    with pytest.raises(InvalidPayload):
        chain(q, [("a", {"n": 1}), ("b", {"n": 2}), ("c", object())])
    assert q.counts().due == 0, "chain() enqueued its first steps before refusing a later one"


@pytest.mark.parametrize("option", ["key", "after", "job_id"])
def test_chain_refuses_an_option_that_names_one_job(q: Queue, option: str) -> None:
    """`options` apply to every step: an idempotency key made every step after the first
    return the first step's id (b and c never enqueued); `after` raised a bare TypeError."""
    value: Any = [q.enqueue("p", {})] if option == "after" else "x"
    with pytest.raises(BadArgument, match=option):
        chain(q, [("a", 1), ("b", 2), ("c", 3)], **{option: value})
    assert q.counts().due == (1 if option == "after" else 0)


def test_a_chain_runs_its_steps_in_order(q: Queue) -> None:
    ids = chain(q, [("a", 1), ("b", 2)], priority=3)
    assert q.get_job(ids[1]).payload() == {"payload": 2, "parent": ids[0]}
    assert [j.id for j in q.claim("w", limit=10).jobs] == [ids[0]]  # b waits for a


def test_chain_on_an_async_queue_enqueues_or_refuses(redis_url: str, q: Queue) -> None:
    """chain() has no asyncio twin; given an AsyncQueue it returns un-awaited coroutines as
    the "ids" and enqueues nothing, without an error."""

    async def go() -> list[Any]:
        aq = AsyncQueue(connect_async(redis_url), q.name)
        try:
            with pytest.raises(BadArgument, match="achain"):
                chain(aq, [("a", 1), ("b", 2)])  # type: ignore[arg-type]
            return await achain(aq, [("a", 1), ("b", 2)])
        finally:
            await aq.aclose()

    ids = asyncio.run(go())
    assert all(isinstance(i, str) for i in ids), f"achain() returned {ids!r}, not job ids"
    assert q.counts().held_waiting == 1 and q.get_job(ids[1]).fields.get("waiting_for") == "1"


# untyped errors at the boundary ----------------------------------------------------------------
def test_a_huge_integer_backoff_factor_is_a_bad_argument() -> None:
    """Backoff(factor=10**400): math.isfinite raises OverflowError instead of BadArgument."""
    with pytest.raises(BadArgument):
        Backoff(factor=10**400)


@pytest.mark.parametrize("error", [("E", "message"), ("E", None, "tb"), "E: message"])
def test_fail_with_a_malformed_error_is_a_bad_argument(q: Queue, error: Any) -> None:
    """fail(error=...) unpacks and slices the tuple unchecked: ValueError / TypeError leak."""
    job_id = q.enqueue("t", {})
    (job,) = q.claim("w", limit=1).jobs
    with pytest.raises(BadArgument):
        q.fail(job_id, job.token, error)
    assert q.status(job_id) == "leased"


@pytest.mark.parametrize("call", ["complete", "fail", "release"])
def test_a_worker_call_with_no_job_id_is_a_bad_argument(q: Queue, call: str) -> None:
    """complete / fail / release send the id unchecked: redis-py's DataError leaks, where
    cancel, get_job and result raise BadArgument for a malformed id."""
    no_id: Any = None
    calls: dict[str, Callable[[], object]] = {
        "complete": lambda: q.complete(no_id, "1-abc", None),
        "fail": lambda: q.fail(no_id, "1-abc", ("E", "m", "")),
        "release": lambda: q.release([(no_id, "1-abc")]),
    }
    with pytest.raises(BadArgument):
        calls[call]()


# task handles and the registry -----------------------------------------------------------------
def test_an_infinite_task_timeout_is_refused_typed(q: Queue) -> None:
    """@registry.task(timeout_s=inf) is accepted (inf > 0); its handle's enqueue then raises
    OverflowError from round(inf * 1000)."""
    reg = Registry()
    with pytest.raises(BadArgument):

        @reg.task("review.forever", timeout_s=float("inf"))
        def forever(payload: Any, ctx: Any) -> None:
            return None

        forever.enqueue(q, {})
    assert q.counts().due == 0


@dataclass
class Reminder:
    user: int


def test_registry_job_spec_checks_and_encodes_the_payload_type(q: Queue) -> None:
    """README: payload_type is checked at enqueue, and `registry.job_spec(...)` is the way to
    enqueue many jobs with the task's defaults. registry.job_spec skips payload_type: a
    Reminder is refused as not JSON, and a dict that does not fit is accepted (the worker
    then parks the job at its first attempt, InvalidPayload: tests/test_payload_misfit.py)."""
    reg = Registry()

    @reg.task("review.remind", payload_type=Reminder)
    def remind(payload: Reminder, ctx: Any) -> None:
        return None

    (job_id,) = q.enqueue_many([reg.job_spec("review.remind", Reminder(user=42))])
    assert q.get_job(job_id).payload() == {"user": 42}
    with pytest.raises(BadArgument):
        reg.job_spec("review.remind", {"who": "not a Reminder"})
