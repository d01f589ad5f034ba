"""A typed task's payload (a dataclass, a pydantic model) enqueued by name is refused at the
producer boundary with InvalidPayload saying how to fix it, writing nothing: sync, async, bulk,
partitioned and schedule paths. It is not converted silently (json_text.not_json says why)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import pydantic
import pytest
import redis

from scheduler import AsyncQueue, InvalidPayload, JobContext, JobSpec, Queue, Registry
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import connect_async
from tests.conftest import dump_queue


@dataclasses.dataclass
class EmailArgs:
    to: str


class EmailModel(pydantic.BaseModel):
    to: str


registry = Registry()


@registry.task("send_email", payload_type=EmailArgs)
def send_email(payload: EmailArgs, ctx: JobContext) -> None:
    pass


HINTS = ("EmailArgs is a dataclass", "dataclasses.asdict(value)", "task.enqueue(q, value)")

BY_NAME: dict[str, Callable[[Queue], Any]] = {
    "enqueue": lambda q: q.enqueue("send_email", EmailArgs(to="a@b")),
    "nested": lambda q: q.enqueue("send_email", {"args": [EmailArgs(to="a@b")]}),
    "enqueue_many": lambda q: q.enqueue_many(
        [JobSpec("send_email", {"to": "ok@b"}), JobSpec("send_email", EmailArgs(to="a@b"))]
    ),
    "schedule": lambda q: q.schedule("mail", "send_email", EmailArgs(to="a@b"), every_ms=60_000),
}


@pytest.mark.parametrize("call", BY_NAME.values(), ids=BY_NAME.keys())
def test_a_dataclass_by_name_is_refused_with_the_fix(
    q: Queue, client: redis.Redis, call: Callable[[Queue], Any]
) -> None:
    before = dump_queue(client, q)
    with pytest.raises(InvalidPayload) as err:
        call(q)
    assert all(hint in str(err.value) for hint in HINTS), str(err.value)
    assert dump_queue(client, q) == before  # nothing written, the good job of the batch neither


def test_the_async_paths_refuse_it_too(redis_url: str, q: Queue, client: redis.Redis) -> None:
    async def main() -> list[str]:
        aq = AsyncQueue(connect_async(redis_url), q.name)
        messages = []
        try:
            for call in (
                aq.enqueue("send_email", EmailArgs(to="a@b")),
                aq.enqueue_many([JobSpec("t"), JobSpec("send_email", EmailArgs(to="a@b"))]),
            ):
                try:
                    await call
                except InvalidPayload as exc:
                    messages.append(str(exc))
        finally:
            await aq.aclose()
        return messages

    messages = asyncio.run(main())
    assert len(messages) == 2 and all("dataclasses.asdict(value)" in m for m in messages)
    assert dump_queue(client, q) == {}


@pytest.mark.pq(partitions=2)
def test_a_partitioned_queue_refuses_it(pq: PartitionedQueue) -> None:
    with pytest.raises(InvalidPayload, match=r"dataclasses\.asdict"):
        pq.enqueue("send_email", EmailArgs(to="a@b"))
    assert sum(part.counts().due for part in pq.parts) == 0


def test_a_pydantic_model_is_told_model_dump(q: Queue) -> None:
    with pytest.raises(InvalidPayload, match=r"EmailModel is a pydantic model.*model_dump"):
        q.enqueue("send_email", EmailModel(to="a@b"))
    assert q.counts().due == 0


def test_the_fixes_it_names_work(q: Queue) -> None:
    by_name = q.enqueue("send_email", dataclasses.asdict(EmailArgs(to="a@b")))
    by_handle = send_email.enqueue(q, EmailArgs(to="a@b"))
    assert q.get_job(by_name).payload() == q.get_job(by_handle).payload() == {"to": "a@b"}


def test_other_values_keep_jsons_own_message(q: Queue) -> None:
    with pytest.raises(InvalidPayload, match="Object of type set is not JSON serializable"):
        q.enqueue("t", {1, 2})
    with pytest.raises(InvalidPayload, match="Object of type type is not JSON serializable"):
        q.enqueue("t", EmailArgs)  # the class, not an instance


def test_a_result_or_progress_is_not_told_to_enqueue_by_handle() -> None:
    """The typed-task hint fits a payload only: a handler's result or progress that is a
    dataclass gets the asdict fix alone (it named task.enqueue before)."""
    from scheduler.core import codec
    from scheduler.core.progress import encode_progress
    from scheduler.worker.failures import result_text

    value = EmailArgs(to="a@b")
    encoders: tuple[Callable[[], object], ...] = (
        lambda: result_text(value),
        lambda: encode_progress(value),
    )
    for encode in encoders:
        with pytest.raises(InvalidPayload) as err:
            encode()
        assert "dataclasses.asdict(value)" in str(err.value)
        assert "task.enqueue" not in str(err.value), str(err.value)
    with pytest.raises(InvalidPayload, match=r"task\.enqueue\(q, value\)"):
        codec.encode_json(EmailArgs(to="a@b"), "payload", 1000)


class _Raising(dict):  # type: ignore[type-arg]
    """A mapping whose own method raises while the encoder reads it."""

    def items(self) -> Any:
        raise RuntimeError("items boom")

    def keys(self) -> Any:
        raise RuntimeError("keys boom")


def test_a_value_whose_own_method_raises_is_invalid_payload(q: Queue, client: redis.Redis) -> None:
    """InvalidPayload, as enqueue, complete and set_progress document (and as the worker says of
    such a result): before, the object's own RuntimeError came out of the call."""
    from scheduler.core.progress import encode_progress

    before = dump_queue(client, q)
    with pytest.raises(InvalidPayload, match="payload could not be encoded: RuntimeError"):
        q.enqueue("t", _Raising(a=1))
    assert dump_queue(client, q) == before
    with pytest.raises(InvalidPayload, match="progress could not be encoded: RuntimeError"):
        encode_progress(_Raising(a=1))
    with pytest.raises(InvalidPayload, match="result could not be encoded: RuntimeError"):
        q.complete("some-job-id-0001", "1-x", _Raising(a=1))
