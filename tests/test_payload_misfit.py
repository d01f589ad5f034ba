"""A stored payload that does not fit its task's payload_type (enqueued by name with the wrong
shape, or by another client) can never run: every attempt decodes it the same way. It was
retried by the job's backoff until its attempts ran out; it is now parked at its first attempt
as InvalidPayload, saying which type refused what, and the task's other jobs still run."""

from __future__ import annotations

import dataclasses
from typing import Any, TypedDict

import pydantic
import pytest

from scheduler import Backoff, JobContext, Queue, Registry
from scheduler._spawn import RedisProcess
from scheduler.worker import WorkerSettings
from tests.embedded_worker import run_until


@dataclasses.dataclass
class Reminder:
    user: int


class ReminderDict(TypedDict):
    user: int


class ReminderModel(pydantic.BaseModel):
    user: int


@dataclasses.dataclass
class Checked:
    """Its own validation refuses a negative user: ValueError, or TypeError for a bool."""

    user: int

    def __post_init__(self) -> None:
        if self.user < 0:
            raise ValueError(f"user must not be negative, got {self.user}")
        if self.user == 0:
            raise TypeError("user 0 is nobody")


class CheckedModel(pydantic.BaseModel):
    user: int

    @pydantic.field_validator("user")
    @classmethod
    def known(cls, user: int) -> int:
        if user < 0:  # a TypeError is not pydantic's to wrap: it passes through model_validate
            raise TypeError(f"user must not be negative, got {user}")
        return user


registry = Registry()
seen: list[Any] = []


@registry.task("misfit.dc", payload_type=Reminder)
def dc(payload: Reminder, ctx: JobContext) -> None:
    seen.append(payload)


@registry.task("misfit.td", payload_type=ReminderDict)
async def td(payload: ReminderDict, ctx: JobContext) -> None:
    seen.append(payload)


@registry.task("misfit.pd", payload_type=ReminderModel)
def pd(payload: ReminderModel, ctx: JobContext) -> None:
    seen.append(payload)


@registry.task("misfit.dc_checked", payload_type=Checked)
def dc_checked(payload: Checked, ctx: JobContext) -> None:
    seen.append(payload)


@registry.task("misfit.pd_checked", payload_type=CheckedModel)
async def pd_checked(payload: CheckedModel, ctx: JobContext) -> None:
    seen.append(payload)


@registry.task("misfit.own_value", payload_type=Checked)
def own_value(payload: Checked, ctx: JobContext) -> None:
    raise ValueError("the handler's own ValueError")  # after the decode: retried as before


@registry.task("misfit.own")
def own(payload: Any, ctx: JobContext) -> None:
    from scheduler import BadArgument

    raise BadArgument("the handler's own error")  # not a payload misfit: retried as before


CASES = {
    "dataclass, unknown field": ("misfit.dc", {"who": 1}, "Reminder"),
    "dataclass, wrong type": ("misfit.dc", {"user": "x"}, "payload['user'] must be int"),
    "TypedDict, missing key": ("misfit.td", {}, "ReminderDict"),
    "pydantic, not an int": ("misfit.pd", {"user": "abc"}, "does not fit ReminderModel"),
    "not an object": ("misfit.pd", [1], "must be a JSON object"),
    "dataclass __post_init__ ValueError": ("misfit.dc_checked", {"user": -1}, "negative"),
    "dataclass __post_init__ TypeError": ("misfit.dc_checked", {"user": 0}, "user 0 is nobody"),
    "pydantic validator TypeError": ("misfit.pd_checked", {"user": -1}, "negative, got -1"),
}


@pytest.mark.parametrize(("task", "payload", "says"), CASES.values(), ids=CASES.keys())
def test_a_payload_its_type_refuses_is_parked_at_once(
    module_server: RedisProcess, task: str, payload: Any, says: str
) -> None:
    q = Queue.from_url(module_server.url, "misfit-" + task)
    fast = Backoff(base_ms=0, cap_ms=0)
    bad = q.enqueue(task, payload, max_attempts=4, backoff=fast)  # by name: not checked
    fine = q.enqueue(task, {"user": 7}, max_attempts=4, backoff=fast)
    seen.clear()
    run_until(
        module_server.url,
        registry,
        WorkerSettings(queues=(q.name,), grace_s=0),
        lambda: q.status(bad) == "dead" and q.status(fine) == "done",
    )
    job = q.get_job(bad)
    assert job is not None
    assert job.attempts == 1  # before: 4, one per attempt, each refused the same way
    assert job.dead_reason == "non-retryable error"
    assert job.fields["last_error_type"] == "InvalidPayload"
    error = job.fields["last_error"]
    assert says in error and "payload_type" in error and "not retried" in error, error
    assert len(seen) == 1  # the good job ran


def test_a_handlers_own_bad_argument_is_still_retried(module_server: RedisProcess) -> None:
    q = Queue.from_url(module_server.url, "misfit-own")
    job_id = q.enqueue("misfit.own", {}, max_attempts=3, backoff=Backoff(base_ms=0, cap_ms=0))
    run_until(
        module_server.url,
        registry,
        WorkerSettings(queues=(q.name,), grace_s=0),
        lambda: q.status(job_id) == "dead",
    )
    job = q.get_job(job_id)
    assert job is not None and job.attempts == 3
    assert job.fields["last_error_type"] == "BadArgument"


def test_a_typed_handlers_own_value_error_is_still_retried(module_server: RedisProcess) -> None:
    q = Queue.from_url(module_server.url, "misfit-own-value")
    fast = Backoff(base_ms=0, cap_ms=0)
    job_id = q.enqueue("misfit.own_value", {"user": 3}, max_attempts=3, backoff=fast)
    run_until(
        module_server.url,
        registry,
        WorkerSettings(queues=(q.name,), grace_s=0),
        lambda: q.status(job_id) == "dead",
    )
    job = q.get_job(job_id)
    assert job is not None and job.attempts == 3
    assert job.fields["last_error_type"] == "ValueError"
