"""Bad arguments an outside audit found accepted (breaking something later) or answered with a
bare Python / redis error: each is now a typed error at the boundary, and nothing is written."""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from scheduler import Backoff, BadArgument, JobSpec, Queue, Registry
from scheduler.cli.worker_pool_start import pool_size
from scheduler.schedules.cron_slots import cron_slots_after
from scheduler.worker import SettingsError, Worker, WorkerSettings
from tests.conftest import dump_queue

NAN = float("nan")


@pytest.mark.parametrize(
    "bad",
    [
        {"concurrency": NAN},
        {"concurrency": 1.5},
        {"concurrency": "4"},
        {"concurrency": None},
        {"concurrency": True},
        {"batch_size": 1.5},
        {"heartbeat_ms": NAN},
        {"heartbeat_ms": 10.5},
        {"prefetch": NAN},
        {"prefetch": 1.5},
        {"max_abandoned_threads": NAN},
        {"max_abandoned_threads": 2.0},
        {"grace_s": "5"},
        {"grace_s": True},
        {"queues": None},
        {"queues": 7},
    ],
)
def test_worker_settings_of_the_wrong_type_are_refused_at_check(bad: dict[str, Any]) -> None:
    """A nan passed every `<` check: max_abandoned_threads=nan claimed jobs it never started."""
    with pytest.raises(SettingsError):
        WorkerSettings(**bad).check()


@pytest.mark.parametrize("worker_id", ["x" * 201, "", 7, "\ud800"])
def test_a_bad_worker_id_is_refused_when_the_worker_is_made(worker_id: Any) -> None:
    """It failed at the first claim (exit 1, "crashed"), or with a bare UnicodeEncodeError."""
    with pytest.raises(SettingsError, match="worker_id"):
        Worker(aredis.Redis(), Registry(), WorkerSettings(), worker_id=worker_id)


def test_the_pool_names_its_own_worker_id_rule() -> None:
    with pytest.raises(BadArgument, match="--worker-id"):
        pool_size(1, "x" * 201)


@pytest.mark.parametrize(
    "kw",
    [
        {"max_attempts": 10**7},
        {"backoff": Backoff(factor=2000.0)},
        {"backoff": Backoff(base_ms=2**63)},
        {"queue": "{x}"},
        {"queue": "x" * 65},
    ],
)
def test_registration_refuses_what_its_first_enqueue_would(kw: dict[str, Any]) -> None:
    registry = Registry()
    with pytest.raises(BadArgument):
        registry.task("a.b", **kw)(lambda payload, ctx: None)
    assert registry.names() == []


def test_a_cron_expression_too_long_to_parse_on_every_refill_is_refused() -> None:
    huge = ",".join(["0"] * 300_000) + " * * * *"
    with pytest.raises(BadArgument, match="over 512"):
        cron_slots_after(huge, "UTC", 0, 10)  # a stored one edited by hand: unreadable


def test_a_huge_cron_schedule_is_refused_before_anything_is_written(
    client: redis.Redis, q: Queue
) -> None:
    before = dump_queue(client, q)
    with pytest.raises(BadArgument, match="over 512"):
        q.schedule("s", "t", cron=",".join(["0"] * 300) + " * * * *")
    assert dump_queue(client, q) == before


def _leased(q: Queue) -> tuple[str, str]:
    job_id = q.enqueue("t", 1)
    (job,) = q.claim("w", limit=1).jobs
    return job_id, job.token


def test_lease_lists_that_are_not_lists_of_pairs_are_refused_before_sending(
    client: redis.Redis, q: Queue
) -> None:
    """A generator was read twice (the arguments, then the reply): the leases were extended,
    then a bare ValueError; a bare id was read letter by letter as pairs."""
    job_id, token = _leased(q)
    before = dump_queue(client, q)
    for leases in ((p for p in [(job_id, token)]), [job_id], job_id, {job_id: token}, None):
        with pytest.raises(BadArgument):
            q.heartbeat(leases, lease_ms=60_000)  # type: ignore[arg-type]
    for odd in ([(job_id,)], [(job_id, token, 1)]):
        with pytest.raises(BadArgument):
            q.release(odd)  # type: ignore[arg-type]
    with pytest.raises(BadArgument):
        q.complete_many([(job_id, token)])  # type: ignore[list-item]
    for bad_id, bad_token in (("\ud800", token), (job_id, "\udfff")):
        with pytest.raises(BadArgument, match="Unicode"):
            q.heartbeat([(bad_id, bad_token)], lease_ms=60_000)
        with pytest.raises(BadArgument, match="Unicode"):
            q.complete(bad_id, bad_token, 1)
    assert dump_queue(client, q) == before


@pytest.mark.parametrize("nonce", ["", "x" * 65, "\ud800", "a-b", 1.5, [1], b"ab"])
def test_a_bad_claim_nonce_is_named(client: redis.Redis, q: Queue, nonce: Any) -> None:
    q.enqueue("t", 1)
    before = dump_queue(client, q)
    with pytest.raises(BadArgument, match="nonce must be 1-64"):
        q.claim("w", limit=1, nonce=nonce)
    assert dump_queue(client, q) == before


def test_dead_id_lists_with_a_none_or_a_surrogate_are_refused(q: Queue) -> None:
    for ids in ([None], ["ok-id", None], ["\ud800"]):
        with pytest.raises(BadArgument):
            q.requeue_dead(ids)  # type: ignore[arg-type]
        with pytest.raises(BadArgument):
            q.purge_dead(ids)  # type: ignore[arg-type]


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_fail_records_an_exception_whose_message_cannot_be_read(q: Queue) -> None:
    job_id, token = _leased(q)
    with pytest.raises(BadArgument, match="retryable must be a bool"):
        q.fail(job_id, token, ValueError("x"), retryable=None)  # type: ignore[arg-type]
    out = q.fail(job_id, token, _Unprintable(), retryable=False)
    assert out.status == "dead"
    assert "message could not be read" in (q.get_job(job_id).fields.get("last_error") or "")


def test_a_negative_zero_jitter_is_sent_as_zero(q: Queue) -> None:
    """It passed the range check (-0.0 == 0.0) and was written '-0.0', which the server
    refused."""
    job_id = q.enqueue("t", 1, backoff=Backoff(jitter=-0.0))
    assert q.get_job(job_id).task == "t"


def test_enqueue_many_refuses_what_is_no_iterable_of_specs(q: Queue) -> None:
    for specs in (None, 5, "abc", JobSpec("t", 1)):
        with pytest.raises(BadArgument):
            q.enqueue_many(specs)  # type: ignore[arg-type]
    assert q.counts().due == 0


def test_rate_limits_take_ascii_digits_only(q: Queue) -> None:
    with pytest.raises(BadArgument, match="rate_limit"):
        q.enqueue("t", 1, rate_limit="\u0661\u0660/s")  # Arabic-Indic 10
    assert q.counts().due == 0


def test_dead_filters_of_the_wrong_kind_are_refused(q: Queue) -> None:
    parked = q.enqueue("t", 1, max_attempts=1)
    (job,) = q.claim("w", limit=1).jobs
    q.fail(parked, job.token, ("E", "m", ""))
    with pytest.raises(BadArgument, match="older_than_ms"):
        q.dead_ids(older_than_ms=-1)
    for kw in ({"task": 1}, {"error_type": ["E"]}):
        with pytest.raises(BadArgument):
            q.dead_ids(**kw)
    assert q.dead_ids(task="t", error_type="E") == [parked]
