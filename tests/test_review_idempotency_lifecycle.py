"""Review: idempotency keys and debounce across a job's whole life (enqueue, claim, release,
complete, fail, cancel, dead, purge, retention, `scheduler queue move`, flow control).

Each test below asserts the behaviour a user of the key expects and is a strict xfail naming
what is wrong today. What held (not repeated here): a key names its job through completion,
retries, dead, purge, cancel and result expiry for its whole window (README: "even once the job
has run"); a debounced call after cancel / purge / expiry makes a new job; re-sent debounced
calls (the last 8) are answered with their own job under random lifecycles; concurrent
enqueues of one key (threads, the asyncio batcher, AsyncPartitionedQueue) write one job; keys
carried by a move into plain and partitioned destinations answer with the moved job."""

from __future__ import annotations

import hashlib
import json

import pytest
import redis
from click.testing import CliRunner

from scheduler import JobSpec, Queue
from scheduler.admin.queue_move import QueueMove, move_queue
from scheduler.cli.main import main
from tests.conftest import Clock
from tests.fixtures.move_queues import made_queues, waiting_in
from tests.fixtures.partitioned import MakePq

T0 = 1_000_000
DAY_MS = 86_400_000


def _idem(q: Queue, key: str) -> str:
    return q.keys.idem(hashlib.sha256(key.encode()).hexdigest())


def test_a_debounced_call_replaces_a_job_released_unstarted(tq: tuple[Queue, Clock]) -> None:
    """README: "while the job the key names has not been claimed, the call replaces it" (the
    CLI: "while it has not started"). A worker's graceful stop releases the jobs it claimed
    ahead (prefetch) or could not start, and a lost claim answer is released too: such a job
    waits in due again with its attempt given back, never run. The next debounced call of
    its key makes a second job beside it (enqueue.lua: a hash that is not bare is "claimed"),
    and both digests run, one with the data the latest call replaced."""
    q, clock = tq
    clock.set_ms(T0)
    first = q.enqueue("digest", {"n": 1}, key="digest:7", debounce=True)
    (got,) = q.claim("w", limit=1, lease_ms=10_000).jobs
    assert q.release([(got.id, got.token)]) == ["released"]  # back in due, never run
    again = q.enqueue("digest", {"n": 2}, key="digest:7", debounce=True)
    runs = q.claim("w", limit=10, lease_ms=10_000).jobs
    assert [json.loads(j.payload_json) for j in runs] == [{"n": 2}]
    assert again == first


def test_the_replaced_released_job_runs_once_with_the_last_call_and_never_early(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    """The replacement takes the later call's run time, budget and options (claim reads its
    hash's copies over the spec), keeps its id, and a re-sent release is still answered."""
    q, clock = tq
    clock.set_ms(T0)
    first = q.enqueue("digest", {"n": 1}, key="digest:9", debounce=True, max_attempts=3)
    (got,) = q.claim("w", limit=1, lease_ms=10_000).jobs
    assert q.release([(got.id, got.token)]) == ["released"]
    again = q.enqueue(
        "digest2", {"n": 2}, key="digest:9", debounce=True, delay_ms=60_000, keep_payload=True
    )
    assert again == first
    assert q.release([(got.id, got.token)]) == ["released"]  # the re-sent release's answer
    assert q.claim("w", limit=10, lease_ms=10_000).jobs == []  # not before the later run time
    clock.set_ms(T0 + 60_000)
    (run,) = q.claim("w", limit=10, lease_ms=10_000).jobs
    assert (run.id, run.task, run.max_attempts, run.attempts) == (first, "digest2", 5, 1)
    assert (json.loads(run.payload_json), run.run_at_ms) == ({"n": 2}, T0 + 60_000)
    assert client.hget(q.keys.job(first), "keep_payload") == "1"
    assert client.zcard(q.keys.due) == 0


@pytest.mark.parametrize("trace", ["progress", "retry"])
def test_a_released_job_whose_run_began_is_not_replaced(
    tq: tuple[Queue, Clock], trace: str
) -> None:
    """A run's trace (its progress; a failed attempt, so attempts stay above 0 once released)
    means the job started: the debounced call makes a new job, as once claimed."""
    q, clock = tq
    clock.set_ms(T0)
    first = q.enqueue("digest", {"n": 1}, key="digest:10", debounce=True)
    (got,) = q.claim("w", limit=1, lease_ms=10_000).jobs
    if trace == "progress":
        q.set_progress(got.id, got.token, {"done": 1})
    else:
        q.fail(got.id, got.token, ("E", "boom", ""))
        clock.set_ms(T0 + 3_600_000)
        (got,) = q.claim("w", limit=1, lease_ms=10_000).jobs
    assert q.release([(got.id, got.token)]) == ["released"]
    again = q.enqueue("digest", {"n": 2}, key="digest:10", debounce=True)
    assert again != first
    assert json.loads(q.get_job(first).payload_json) == {"n": 1}


def test_a_chained_keyed_child_in_one_call_holds_its_key_from_its_parents_start(
    client: redis.Redis, q: Queue
) -> None:
    """Parent (in 2 days) -> middle -> child, one call: the child waits for the middle, which
    waits for the parent; the child's key lasts from the parent's run time too."""
    p = JobSpec("pay", job_id="ridl-p", delay_ms=2 * DAY_MS)
    m = JobSpec("pack", job_id="ridl-m", after=["ridl-p"])
    c = JobSpec("ship", job_id="ridl-c", key="ship:2", after=["ridl-m"])
    q.enqueue_many([p, m, c])
    assert q.status("ridl-c") == "held"
    assert client.pttl(_idem(q, "ship:2")) > 2 * DAY_MS


def test_a_move_does_not_silently_leave_two_jobs_of_one_key(client: redis.Redis) -> None:
    """docs/cluster.md's procedure points the producers at the destination (step 2) before the
    move (step 4). A request first enqueued into the source and re-sent (its answer lost) after
    the switch makes a job in the destination under the same key. The move then writes the
    source's job beside it (its key copy is refused, SET NX) and reports `moved 1, keys 0`, no
    conflict: the destination holds two waiting jobs of one key and both run."""
    with made_queues(client, "ridl-a-", "ridl-b-") as (a, b):
        first = a.enqueue("charge", {"order": 7}, key="order-7", delay_ms=60_000)
        resent = b.enqueue("charge", {"order": 7}, key="order-7", delay_ms=60_000)
        assert resent != first
        report = move_queue(client, a.name, b.name)
        waiting = a.counts().scheduled + b.counts().scheduled
        # Either one job of the key is left to run, or the move says it left two.
        assert waiting == 1 or report.stays["conflict"] == 1, (report, waiting)


def test_the_cli_names_both_jobs_of_a_key_conflict_and_exits_1(
    client: redis.Redis, redis_url: str
) -> None:
    with made_queues(client, "ridl-a-", "ridl-b-") as (a, b):
        first = a.enqueue("charge", {"order": 9}, key="order-9", delay_ms=60_000)
        other = a.enqueue("charge", {"order": 10}, key="order-10", delay_ms=60_000)
        resent = b.enqueue("charge", {"order": 9}, key="order-9", delay_ms=60_000)
        base = ["queue", "move", "--url", redis_url, "--from", a.name, "--to", b.name]
        run = CliRunner().invoke(main, [*base, "--json"])
        assert run.exit_code == 1, run.output
        got = json.loads(run.output)
        assert (got["moved"], got["stays"]["conflict"], got["keys"]) == (1, 1, 1)
        assert got["key_conflicts"] == {
            "count": 1, "jobs": [{"id": first, "other": resent, "in": "source"}]
        }  # fmt: skip
        assert waiting_in(client, first, a, b) == [a.name]
        assert waiting_in(client, other, a, b) == [b.name]
        table = CliRunner().invoke(main, base)  # again: it stays, and is named again
        assert table.exit_code == 1 and first in table.output and resent in table.output


def test_a_key_clash_found_at_the_copy_is_reported_with_both_jobs_in_the_destination(
    client: redis.Redis,
) -> None:
    """The destination's key taken after the check, before the batch's keys are copied (an
    enqueue there while the batch is in flight): the job is there already, so it is reported."""
    with made_queues(client, "ridl-a-", "ridl-b-") as (a, b):
        first = a.enqueue("charge", {"order": 11}, key="order-11", delay_ms=60_000)
        m = QueueMove(client, a.name, b.name)
        entries = m.take(m.src[0], [first])
        assert m.batch_keys.clashes(m.src[0], [first], resumed=False) == {}
        assert m.put(entries) == "c"
        resent = b.enqueue("charge", {"order": 11}, key="order-11", delay_ms=60_000)
        assert m.finish(m.src[0], [first]) == 1
        assert m.report.conflicts.listed == [(first, resent, "destination")]


def test_a_rerun_keeps_a_job_its_stopped_run_put_even_when_its_key_clashes(
    client: redis.Redis,
) -> None:
    """Stopped between its put and its finish (the key not copied yet), then the key taken in
    the destination: sent back into the source's due the job would run in both queues, so the
    rerun finishes it and reports the clash."""
    with made_queues(client, "ridl-a-", "ridl-b-") as (a, b):
        first = a.enqueue("charge", {"order": 12}, key="order-12", delay_ms=60_000)
        m = QueueMove(client, a.name, b.name)
        assert m.put(m.take(m.src[0], [first])) == "c"  # then stopped
        resent = b.enqueue("charge", {"order": 12}, key="order-12", delay_ms=60_000)
        report = move_queue(client, a.name, b.name)
        assert (report.resumed, report.already, report.stays["conflict"]) == (1, 1, 0)
        assert report.conflicts.listed == [(first, resent, "destination")]
        assert waiting_in(client, first, a, b) == [b.name]


def test_a_partitioned_destination_key_conflict_stays_in_the_source(
    client: redis.Redis, make_pq: MakePq
) -> None:
    b = make_pq(partitions=3, suffix="-b")
    with made_queues(client, "ridl-a-") as (a,):
        first = a.enqueue("charge", {"order": 13}, key="order-13", delay_ms=60_000)
        resent = b.enqueue("charge", {"order": 13}, key="order-13", delay_ms=60_000)
        report = move_queue(client, a.name, b.name)
        assert (report.moved, report.stays["conflict"]) == (0, 1)
        assert report.conflicts.listed == [(first, resent, "source")]
        assert waiting_in(client, first, a, *b.parts) == [a.name]


def test_a_move_carries_the_keys_of_jobs_left_in_the_source_but_not_of_an_id_held_there(
    client: redis.Redis,
) -> None:
    """A dead job's key (and a running one's) answers in the destination too; a key naming an
    id the destination holds (a caller's job_id used in both queues) is not copied: it would
    name that other job."""
    with made_queues(client, "ridl-a-", "ridl-b-") as (a, b):
        dead = a.enqueue("charge", {"n": 1}, key="dead-1", max_attempts=1)
        (got,) = a.claim("w", limit=1, lease_ms=60_000).jobs
        a.fail(got.id, got.token, ("E", "boom", ""))
        running = a.enqueue("charge", {"n": 2}, key="run-1")
        a.claim("w", limit=1, lease_ms=60_000)
        a.enqueue("charge", {"n": 3}, key="same-1", job_id="shared")
        (done,) = a.claim("w", limit=1, lease_ms=60_000).jobs
        a.complete(done.id, done.token, None)
        b.enqueue("other", {"n": 4}, job_id="shared", delay_ms=60_000)
        a.enqueue("other", {"n": 5}, delay_ms=60_000)  # something to move
        report = move_queue(client, a.name, b.name)
        assert (report.moved, report.keys) == (1, 2)
        assert b.enqueue("charge", {"n": 1}, key="dead-1") == dead
        assert b.enqueue("charge", {"n": 2}, key="run-1") == running
        assert client.get(_idem(b, "same-1")) is None


def test_a_move_carries_the_key_of_a_job_that_finished_in_the_source(
    client: redis.Redis,
) -> None:
    """Within its window a key answers with its job even once that job ran (README). After
    the move the producers use the destination, which has no copy of the key of a job that
    finished in the source (docs/cluster.md: "each key of the source naming a job the run
    moved is copied"): a re-sent keyed enqueue there makes a new job and the work (a charge,
    an e-mail) runs a second time. The id is in no queue of the destination, so carrying the
    key (as for a moved job, NX with its time left) names no other job."""
    with made_queues(client, "ridl-a-", "ridl-b-") as (a, b):
        done = a.enqueue("charge", {"order": 8}, key="order-8")
        (got,) = a.claim("w", limit=1, lease_ms=10_000).jobs
        a.complete(got.id, got.token, None)
        assert a.enqueue("charge", {"order": 8}, key="order-8") == done  # the source's answer
        a.enqueue("other", {"n": 1}, delay_ms=60_000)  # something to move
        report = move_queue(client, a.name, b.name)
        assert report.moved == 1
        assert b.enqueue("charge", {"order": 8}, key="order-8") == done
        assert b.counts().due == 0


def test_the_key_of_a_held_child_lasts_until_it_can_run(client: redis.Redis, q: Queue) -> None:
    """A child enqueued with a key, after=[a parent due in 2 days], waits (held) for the
    parent. Its key is held 24 h past the child's own run time (now), so from day 1 to day 2
    a re-sent enqueue of the child makes a second child beside the first, still waiting, and
    both run once the parent is done (README: "a second enqueue with it returns the first id";
    the job has not even run)."""
    parent = q.enqueue("pay", delay_ms=2 * DAY_MS)
    child = q.enqueue("ship", {"order": 1}, key="ship:1", after=[parent])
    assert q.status(child) == "held"
    assert client.pttl(_idem(q, "ship:1")) > 2 * DAY_MS
