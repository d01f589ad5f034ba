"""Task handles: `@registry.task` returns a callable handle that enqueues with the task's
defaults (issue 13); a typed payload is checked at enqueue and decoded for the handler."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, TypedDict

import pytest
import redis.asyncio as aredis

from scheduler import Queue
from scheduler.client.aio import AsyncQueue
from scheduler.core.backoff import Backoff
from scheduler.core.errors import BadArgument
from scheduler.worker import WorkerSettings
from scheduler.worker.registry import Registry, TaskHandle
from tests.embedded_worker import worker_thread
from tests.workers.procs import wait_for

registry = Registry()
SLOW = Backoff(base_ms=2_000, factor=3.0, cap_ms=60_000, jitter=0.0)


@registry.task("handles.remind", max_attempts=2, backoff=SLOW, timeout_s=7.5)
def remind(payload: Any, ctx: Any) -> str:
    return f"reminded {payload['user']}"


@dataclass
class Charge:
    user: int
    cents: int


class Greeting(TypedDict):
    name: str
    times: int


seen: list[Any] = []


@registry.task("handles.charge", payload_type=Charge)
def charge(payload: Charge, ctx: Any) -> int:
    seen.append(payload)
    return payload.cents


@registry.task("handles.greet", payload_type=Greeting)
async def greet(payload: Greeting, ctx: Any) -> str:
    return payload["name"] * payload["times"]


@registry.task("handles.pinned", queue="elsewhere")
def pinned(payload: Any, ctx: Any) -> None:
    return None


def test_the_handle_is_still_the_function_and_the_registry_still_finds_it() -> None:
    assert isinstance(remind, TaskHandle)
    assert remind({"user": 1}, None) == "reminded 1"
    assert remind.name == "handles.remind"
    assert registry.get("handles.remind").max_attempts == 2


def test_enqueue_applies_the_task_defaults(q: Queue) -> None:
    job = q.get_job(remind.enqueue(q, {"user": 42}))
    assert (job.task, job.max_attempts, job.fields["timeout_ms"]) == ("handles.remind", 2, "7500")
    assert job.fields["backoff"].split(",")[:3] == ["2000", "3.0", "60000"]
    # By name, without the handle, the defaults are not known to the producer.
    plain = q.get_job(q.enqueue("handles.remind", {"user": 42}))
    assert (plain.max_attempts, plain.fields.get("timeout_ms", "0")) == (5, "0")


def test_overrides_win_over_the_defaults(q: Queue) -> None:
    other = Backoff(base_ms=10, factor=1.0, cap_ms=10, jitter=0.0)
    job_id = remind.enqueue(
        q, {"user": 1}, max_attempts=9, backoff=other, timeout_ms=100, delay_ms=60_000
    )
    job = q.get_job(job_id)
    assert (job.max_attempts, job.fields["timeout_ms"]) == (9, "100")
    assert job.fields["backoff"].split(",")[:3] == ["10", "1.0", "10"]
    assert job.state == "scheduled"


def test_aenqueue_applies_the_defaults(redis_url: str, q: Queue) -> None:
    async def go() -> str:
        client = aredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            return await remind.aenqueue(AsyncQueue(client, q.name), {"user": 3})
        finally:
            await client.aclose()

    job = q.get_job(asyncio.run(go()))
    assert (job.max_attempts, job.fields["timeout_ms"]) == (2, "7500")


@pytest.mark.parametrize(
    ("handle", "bad"),
    [
        (charge, {"user": 1, "cents": 5}),  # a dict is not the dataclass
        (charge, None),
        (greet, {"name": "x"}),  # missing key
        (greet, {"name": "x", "times": 1, "extra": 0}),  # unknown key
        (greet, {"name": "x", "times": "1"}),  # wrong value type
        (greet, ["x", 1]),
    ],
)
def test_a_wrong_typed_payload_is_refused_and_nothing_is_enqueued(
    q: Queue, handle: TaskHandle[Any], bad: Any
) -> None:
    with pytest.raises(BadArgument):
        handle.enqueue(q, bad)
    assert q.counts().due == 0


def test_a_pinned_task_refuses_another_queue(q: Queue) -> None:
    with pytest.raises(BadArgument, match="elsewhere"):
        pinned.enqueue(q, {})
    assert q.counts().due == 0


def test_a_bad_payload_type_is_refused_at_registration() -> None:
    with pytest.raises(BadArgument, match="payload_type"):
        Registry().task("x", payload_type=int)


def test_typed_payloads_travel_as_json_and_are_decoded_for_the_handler(
    redis_url: str, q: Queue
) -> None:
    seen.clear()
    charge_id = charge.enqueue(q, Charge(user=7, cents=250))
    greet_id = greet.enqueue(q, {"name": "ab", "times": 2})
    assert json.loads(q.get_job(charge_id).payload_json) == {"user": 7, "cents": 250}
    with worker_thread(redis_url, registry, WorkerSettings(queues=(q.name,))):
        wait_for(lambda: q.status(charge_id) == "done" and q.status(greet_id) == "done",
                 what="typed jobs done")  # fmt: skip
    assert seen == [Charge(user=7, cents=250)]
    assert q.get_job(charge_id).result_json == "250"
    assert q.get_job(greet_id).result_json == '"abab"'


def test_a_pydantic_model_is_checked_and_decoded(redis_url: str, q: Queue) -> None:
    pydantic = pytest.importorskip("pydantic")

    class Order(pydantic.BaseModel):  # type: ignore[misc, name-defined]
        order_id: int
        note: str = ""

    r = Registry()
    got: list[Any] = []

    @r.task("handles.order", payload_type=Order)
    def order(payload: Any, ctx: Any) -> None:
        got.append(payload)

    with pytest.raises(BadArgument):
        order.enqueue(q, {"order_id": 1})  # a dict is not the model
    job_id = order.enqueue(q, Order(order_id=5, note="x"))
    assert json.loads(q.get_job(job_id).payload_json) == {"order_id": 5, "note": "x"}
    (job,) = q.claim("w1", limit=1).jobs
    # What the worker runs: the registered function decodes the JSON into the model.
    r.get("handles.order").fn(json.loads(job.payload_json), None)  # type: ignore[arg-type]
    assert got == [Order(order_id=5, note="x")]
