"""Debounce (`enqueue(..., key=k, debounce=True)`, lua/enqueue.lua's 'b' flag): while the job the
key names has never been claimed, a call replaces it (payload, run time, options; the same id);
once it was claimed, the call's job is new and the key names it. The digest case: a job 5 min
after the last activity, carrying the latest data."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler import BadArgument, JobSpec, Queue
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core import codec
from scheduler.core.codec import enqueue_args
from scheduler.operations.ops import Script
from tests.conftest import Clock
from tests.fixtures.partitioned import delete_partitioned

T0 = 1_000_000


def _due_ms(client: redis.Redis, q: Queue, job_id: str) -> int:
    score = client.zscore(q.keys.due, job_id)
    assert score is not None
    return int(score)


def test_a_debounced_call_replaces_the_unstarted_job(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    first = q.enqueue("digest", {"n": 1}, key="digest:7", debounce=True, delay_ms=300_000)
    clock.set_ms(T0 + 60_000)
    again = q.enqueue("digest", {"n": 2}, key="digest:7", debounce=True, delay_ms=300_000,
                      max_attempts=2)  # fmt: skip
    assert again == first
    assert _due_ms(client, q, first) == T0 + 360_000  # 5 min after the last call
    assert client.zcard(q.keys.due) == 1
    job = q.get_job(first)
    assert json.loads(job.payload_json) == {"n": 2} and job.max_attempts == 2
    # The key is held from the new run time.
    ttl = client.pttl(q.keys.idem(hashlib.sha256(b"digest:7").hexdigest()))
    assert ttl > 300_000 + 86_000_000
    clock.set_ms(T0 + 360_000)
    (got,) = q.claim("w", limit=5, lease_ms=10_000).jobs
    assert (got.id, json.loads(got.payload_json)) == (first, {"n": 2})


def test_once_claimed_the_next_call_makes_a_new_job_and_the_key_follows(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    first = q.enqueue("digest", {"n": 1}, key="digest:8", debounce=True)
    (got,) = q.claim("w", limit=5, lease_ms=10_000).jobs
    second = q.enqueue("digest", {"n": 2}, key="digest:8", debounce=True, delay_ms=1_000)
    assert second != first
    third = q.enqueue("digest", {"n": 3}, key="digest:8", debounce=True, delay_ms=1_000)
    assert third == second  # the key names the new job, which is replaced in turn
    q.complete(first, got.token, None)
    assert q.status(first) == "done"
    assert json.loads(q.get_job(second).payload_json) == {"n": 3}


def test_without_debounce_the_key_still_answers_with_the_first_job(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    first = q.enqueue("t", {"n": 1}, key="plain", delay_ms=1_000)
    assert q.enqueue("t", {"n": 2}, key="plain", delay_ms=9_000) == first
    assert json.loads(q.get_job(first).payload_json) == {"n": 1}


def test_a_job_of_the_key_that_has_a_hash_is_not_replaced(tq: tuple[Queue, Clock]) -> None:
    """A flow job (its hash holds its flow fields) or one claimed and released is not a bare
    pending spec: the debounced call writes a new job."""
    q, clock = tq
    clock.set_ms(T0)
    first = q.enqueue("t", {"n": 1}, key="k", priority=3, delay_ms=1_000)
    second = q.enqueue("t", {"n": 2}, key="k", debounce=True, delay_ms=1_000)
    assert second != first
    assert {q.status(first), q.status(second)} == {"scheduled"}


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"key": "k", "priority": 1}, {"key": "k", "after": ["x"]},
     {"key": "k", "concurrency_key": "c", "concurrency_limit": 1},
     {"key": "k", "job_id": "mine"}],  # a fixed id: every call would be a re-send
)  # fmt: skip
def test_debounce_needs_a_key_and_no_flow_options(
    client: redis.Redis, q: Queue, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(BadArgument, match="debounce"):
        q.enqueue("t", debounce=True, **kwargs)
    with pytest.raises(BadArgument, match="debounce"):
        q.enqueue("t", debounce="yes", key="k")  # type: ignore[arg-type]
    assert list(client.scan_iter(match=q.keys.prefix + "*")) == []


def test_the_script_refuses_debounce_without_a_key(client: redis.Redis, q: Queue) -> None:
    """The boundary holds on the server too (a client of its own sending the flag)."""
    args = enqueue_args([JobSpec("t", key="k", debounce=True)], 1024)
    args[9] = ""  # no key digest
    with pytest.raises(BadArgument, match="debounce"):
        q._execute(Script("enqueue", args))
    assert list(client.scan_iter(match=q.keys.prefix + "*")) == []


def test_the_cli_debounces(redis_url: str, client: redis.Redis, q: Queue) -> None:
    runner = CliRunner()
    base = ["enqueue", "--url", redis_url, "-q", q.name, "digest", "--key", "d", "--debounce",
            "--in", "5m"]  # fmt: skip
    first = runner.invoke(main, [*base, "--payload", '{"n": 1}'])
    again = runner.invoke(main, [*base, "--payload", '{"n": 2}'])
    assert first.exit_code == 0 and again.exit_code == 0, first.output + again.output
    job_id = first.output.strip().splitlines()[-1]  # after the server-settings warning
    assert again.output.strip().splitlines()[-1] == job_id
    assert json.loads(q.get_job(job_id).payload_json) == {"n": 2}
    assert client.zcard(q.keys.due) == 1


def test_a_resent_debounced_call_is_answered_with_the_job_it_replaced(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    """Its answer lost, a call is sent again (redis-py's retry) after the job it replaced was
    claimed: it is answered with that job and writes nothing (it made a second job with the
    same payload, run twice)."""
    q, clock = tq
    clock.set_ms(T0)
    first = q.enqueue("digest", {"n": 1}, key="d", debounce=True)
    call = Script("enqueue", enqueue_args([JobSpec("digest", {"n": 2}, key="d", debounce=True)],
                                          1024))  # fmt: skip
    assert codec.parse_enqueue(q._execute(call), call.args) == [first]  # replaced it
    (got,) = q.claim("w", limit=5, lease_ms=10_000).jobs
    assert json.loads(got.payload_json) == {"n": 2}
    assert codec.parse_enqueue(q._execute(call), call.args) == [first]  # the re-send
    assert client.zcard(q.keys.due) == 0 and q.counts().leased == 1
    # A later call of its own still makes a new job, the key then names it.
    later = q.enqueue("digest", {"n": 3}, key="d", debounce=True)
    assert later != first and q.status(later) == "due"


def test_a_key_debounced_twice_in_one_call_is_refused(client: redis.Redis, q: Queue) -> None:
    """Which of two would win is no order a caller could rely on: refused, nothing written,
    also across the batches of one call, and by the script for a client of its own."""
    two = [JobSpec("t", {"n": i}, key="same", debounce=True) for i in (1, 2)]
    with pytest.raises(BadArgument, match="debounced once per call"):
        q.enqueue_many(two)
    with pytest.raises(BadArgument, match="debounced once per call"):
        q.enqueue_many(two, batch_size=1)
    with pytest.raises(BadArgument, match="one key twice"):
        q._execute(Script("enqueue", enqueue_args(two, 1024)))
    assert list(client.scan_iter(match=q.keys.prefix + "*")) == []
    # Not debounced, the second is answered with the first, as before.
    ids = q.enqueue_many([JobSpec("t", {"n": i}, key="same") for i in (1, 2)])
    assert ids[0] == ids[1]


def test_a_stale_resend_does_not_undo_a_newer_call(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    """Call B replaced the job, then call C; B re-sent late (its answer lost) was taken for a
    new call and put B's data back over C's. The key keeps the last 8 replacing calls' ids."""
    q, clock = tq
    clock.set_ms(T0)
    first = q.enqueue("digest", {"n": 1}, key="d", debounce=True, delay_ms=60_000)
    specs = [
        JobSpec("digest", {"n": n}, key="d", debounce=True, delay_ms=60_000) for n in range(2, 12)
    ]
    calls = [Script("enqueue", enqueue_args([spec], 1024)) for spec in specs]
    for call in calls:
        assert codec.parse_enqueue(q._execute(call), call.args) == [first]
    assert codec.parse_enqueue(q._execute(calls[5]), calls[5].args) == [first]  # stale re-send
    assert json.loads(q.get_job(first).payload_json) == {"n": 11}  # the newest call's
    value = client.get(q.keys.idem(hashlib.sha256(b"d").hexdigest()))
    assert isinstance(value, str)
    assert value.split() == [first, *(c.args[1] for c in calls[-8:])]  # the last 8 kept


def test_a_resent_call_that_made_a_job_is_not_applied_to_the_next_one(
    tq: tuple[Queue, Clock],
) -> None:
    """Call A made the job, a worker claimed it, call B made the next one; A re-sent late (its
    answer lost) replaced B's job with A's older data (and A's data ran twice): it is answered
    with A's own job and writes nothing."""
    q, clock = tq
    clock.set_ms(T0)
    a = Script("enqueue", enqueue_args([JobSpec("d", {"n": 1}, key="d", debounce=True)], 1024))
    (first,) = codec.parse_enqueue(q._execute(a), a.args)
    q.claim("w", limit=5, lease_ms=10_000)
    b = q.enqueue("d", {"n": 2}, key="d", debounce=True, delay_ms=1_000)
    assert b != first
    assert codec.parse_enqueue(q._execute(a), a.args) == [first]
    assert json.loads(q.get_job(b).payload_json) == {"n": 2}
    # Also once A's job is gone: the key remembers the calls of the jobs it named before.
    q.client.delete(q.keys.job(first), q.keys.spec(first))
    assert codec.parse_enqueue(q._execute(a), a.args) == [first]
    assert json.loads(q.get_job(b).payload_json) == {"n": 2}


def test_a_resent_call_that_replaced_a_job_is_not_applied_to_the_next_one(
    tq: tuple[Queue, Clock],
) -> None:
    """Call C replaced the job, a worker claimed it, call D made the next one; C re-sent late
    replaced D's job with C's older data: it is answered with the job it replaced."""
    q, clock = tq
    clock.set_ms(T0)
    first = q.enqueue("d", {"n": 1}, key="d", debounce=True)
    c = Script("enqueue", enqueue_args([JobSpec("d", {"n": 2}, key="d", debounce=True)], 1024))
    assert codec.parse_enqueue(q._execute(c), c.args) == [first]
    q.claim("w", limit=5, lease_ms=10_000)
    d = q.enqueue("d", {"n": 3}, key="d", debounce=True, delay_ms=1_000)
    assert d != first
    assert codec.parse_enqueue(q._execute(c), c.args) == [first]
    assert json.loads(q.get_job(d).payload_json) == {"n": 3}
    # A call of the key's own job is still answered with it, and new calls still replace it.
    assert q.enqueue("d", {"n": 4}, key="d", debounce=True) == d
    assert json.loads(q.get_job(d).payload_json) == {"n": 4}


def test_a_partitioned_queue_debounces(client: redis.Redis, queue_name: str) -> None:
    """Its client gives every job an id tagged with its partition: debounce was refused there
    as if the caller had chosen the id ('debounce takes no job_id'), on every call."""
    pq = PartitionedQueue.create(client, queue_name, partitions=3)
    try:
        first = pq.enqueue("d", {"n": 1}, key="d", debounce=True, delay_ms=60_000)
        assert pq.enqueue("d", {"n": 2}, key="d", debounce=True, delay_ms=60_000) == first
        assert json.loads(pq.get_job(first).payload_json) == {"n": 2}
        with pytest.raises(BadArgument, match="debounce"):  # the caller's own id still is
            pq.enqueue("d", key="e", debounce=True, job_id=f"p{pq.layout.partition_of_key('e')}.x")
    finally:
        delete_partitioned(client, pq)
