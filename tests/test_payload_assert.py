"""A payload dataclass that validates with `assert` in __post_init__ refuses a stored payload
with AssertionError: that is the type's own validation, as its ValueError / TypeError are, so
the job is parked at its first attempt as InvalidPayload. It was taken for a handler failure
and retried until its attempts ran out. An AssertionError of the handler body stays an
ordinary failure, retried."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from scheduler import Backoff, BadArgument, JobContext, Queue, Registry
from scheduler._spawn import RedisProcess
from scheduler.worker import WorkerSettings
from scheduler.worker.payloads import decode_payload
from tests.embedded_worker import run_until


@dataclasses.dataclass
class Asserted:
    user: int

    def __post_init__(self) -> None:
        assert self.user > 0, f"user must be positive, got {self.user}"


@dataclasses.dataclass
class Bare:
    user: int

    def __post_init__(self) -> None:
        if self.user < 0:
            raise AssertionError  # what a bare `assert` raises outside pytest: no message


registry = Registry()
seen: list[Any] = []


@registry.task("assert.checked", payload_type=Asserted)
def checked(payload: Asserted, ctx: JobContext) -> None:
    seen.append(payload)


@registry.task("assert.body", payload_type=Asserted)
def body(payload: Asserted, ctx: JobContext) -> None:
    assert payload.user == 1, "the handler's own check"  # a failure of the run, not the payload


def test_decode_names_an_assert_of_post_init_as_a_misfit() -> None:
    assert decode_payload(Asserted, {"user": 2}) == Asserted(2)
    with pytest.raises(BadArgument, match="does not fit Asserted: user must be positive, got -1"):
        decode_payload(Asserted, {"user": -1})
    with pytest.raises(BadArgument, match=r"does not fit Bare: AssertionError in __post_init__$"):
        decode_payload(Bare, {"user": -1})


def test_a_payload_its_post_init_asserts_against_is_parked_at_once(
    module_server: RedisProcess,
) -> None:
    q = Queue.from_url(module_server.url, "assert-post-init")
    fast = Backoff(base_ms=0, cap_ms=0)
    bad = q.enqueue("assert.checked", {"user": -1}, max_attempts=4, backoff=fast)  # by name
    fine = q.enqueue("assert.checked", {"user": 7}, max_attempts=4, backoff=fast)
    seen.clear()
    run_until(
        module_server.url,
        registry,
        WorkerSettings(queues=(q.name,), grace_s=0),
        lambda: q.status(bad) == "dead" and q.status(fine) == "done",
    )
    job = q.get_job(bad)
    assert job is not None
    assert job.attempts == 1  # before: 4, each attempt failing with AssertionError
    assert job.dead_reason == "non-retryable error"
    assert job.fields["last_error_type"] == "InvalidPayload"
    error = job.fields["last_error"]
    assert "user must be positive, got -1" in error and "not retried" in error, error
    assert seen == [Asserted(7)]  # the good job ran


def test_an_assert_in_the_handler_body_is_still_retried(module_server: RedisProcess) -> None:
    q = Queue.from_url(module_server.url, "assert-body")
    fast = Backoff(base_ms=0, cap_ms=0)
    job_id = q.enqueue("assert.body", {"user": 3}, max_attempts=3, backoff=fast)
    run_until(
        module_server.url,
        registry,
        WorkerSettings(queues=(q.name,), grace_s=0),
        lambda: q.status(job_id) == "dead",
    )
    job = q.get_job(job_id)
    assert job is not None and job.attempts == 3
    assert job.dead_reason == "attempts exhausted"
    assert job.fields["last_error_type"] == "AssertionError"
    assert "the handler's own check" in job.fields["last_error"]
