"""Dead letters, from an audit (operations/dead_letters.py, dead_filter.py, partitioned
routing): each test failed on the code as audited."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import JobSpec, Queue
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.operations.dead_letters import scan_dead
from tests.conftest import Clock
from tests.fixtures.partitioned import delete_partitioned

Run = Callable[..., Result]
MIN_MS = 60_000
T0 = 1_000 * MIN_MS + 1  # the first run of an every-minute schedule is at SLOT1
SLOT1 = 1_001 * MIN_MS


@pytest.fixture
def cli(redis_url: str) -> Run:
    runner = CliRunner(env={"COLUMNS": "200"})

    def run(*args: str) -> Result:
        return runner.invoke(main, [*args, "--url", redis_url])

    return run


@pytest.mark.pq(_clock="test")
def test_a_partitioned_queue_requeues_and_purges_a_dead_schedule_run(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    """A schedule's runs ('schedule:<name>:<slot>') live in the schedule's partition; their
    ids were routed by their hash, so requeue_dead / purge_dead (and get_job) of a dead run
    went to another partition: 0 requeued, 0 purged, the run parked for good."""
    # A name whose first run's id hashes to another partition than the schedule's name.
    name = next(
        n
        for n in (f"nightly{i}" for i in range(100))
        if zlib.crc32(f"schedule:{n}:{SLOT1}".encode()) % 3 != pq.layout.partition_of_schedule(n)
    )
    home = pq.parts[pq.layout.partition_of_schedule(name)]
    clock = Clock(client, home)
    clock.set_ms(T0)
    assert pq.schedule(name, "t", {"k": 1}, every_ms=MIN_MS, max_attempts=1) == "created"
    run = f"schedule:{name}:{SLOT1}"
    assert home.get_schedule(name).pending == run

    def park() -> None:
        [job] = home.claim("w", limit=1, lease_ms=10_000).jobs
        assert job.id == run
        assert home.fail(run, job.token, ("E", "boom", ""), delay_ms=0).status == "dead"

    clock.set_ms(SLOT1)
    park()
    assert pq.dead_ids() == [run]
    assert pq.get_job(run).state == "dead"
    assert pq.requeue_dead([run]) == 1
    assert pq.get_job(run).state == "due"
    park()
    assert pq.purge_dead([run]) == 1
    assert pq.dead_ids() == []


def test_a_dead_id_whose_key_is_not_a_hash_leaves_the_filters_working(
    client: redis.Redis, q: Queue
) -> None:
    """claim parks an id whose job key is of another type by its id alone; the task /
    error-type filter read it with the others in one HMGET pipeline, and its WRONGTYPE failed
    the whole read: dead_ids(task=...), `dead list / requeue / purge --task` refused for every
    dead job of the queue."""
    died = []
    for n in range(2):
        q.enqueue("t", {"n": n}, max_attempts=1)
        [job] = q.claim("w", limit=1, lease_ms=10_000).jobs
        assert q.fail(job.id, job.token, ("E", "boom", ""), delay_ms=0).status == "dead"
        died.append(job.id)
    client.set(q.keys.job("odd"), "x")
    client.zadd(q.keys.dead, {"odd": 1})
    assert set(q.dead_ids()) == {*died, "odd"}
    assert set(q.dead_ids(task="t")) == set(died)
    assert set(q.dead_ids(error_type="E")) == set(died)
    assert q.dead_ids(task="other") == []


def _park_flow(q: Queue, parent: str) -> None:
    [job] = q.claim("w", limit=1, lease_ms=10_000).jobs
    assert job.id == parent
    assert q.fail(parent, job.token, ("E", "boom", ""), delay_ms=0).status == "dead"


def test_a_requeue_in_several_calls_puts_each_parent_before_its_children(q: Queue) -> None:
    """requeue_dead sends its ids in calls of batch_size: a parked child sent in an earlier
    call than its parent found the parent still dead and ran at once, beside it (a grandchild
    likewise), while docs/flow-control.md promises a parent and its parked subtree requeued
    together run in their order again."""
    p = q.enqueue("parent", None, max_attempts=1, job_id="a-parent")
    c = q.enqueue("child", None, after=[p], job_id="b-child")
    g = q.enqueue("grandchild", None, after=[c], job_id="c-grandchild")
    _park_flow(q, p)
    assert sorted(q.dead_ids()) == [p, c, g]
    assert q._run(q.ops.requeue_dead([g, c, p], batch_size=1)) == 3
    assert [j.id for j in q.claim("w", limit=10, lease_ms=10_000).jobs] == [p]


def test_the_cli_requeues_a_parent_before_its_parked_children(cli: Run, q: Queue) -> None:
    """`scheduler dead requeue` sends 100 ids a call, newest first: a parent's 100 children,
    parked at its ms with ids after its own, all went before it and ran beside it."""
    p = q.enqueue("parent", None, max_attempts=1, job_id="a-parent")
    kids = q.enqueue_many([JobSpec("child", n, after=[p], job_id=f"b-{n:03}") for n in range(100)])
    _park_flow(q, p)
    assert q.dead_ids()[-1] == p and len(q.dead_ids()) == 101
    out = cli("dead", "requeue", "-y", "-q", q.name)
    assert out.exit_code == 0, out.output
    assert "101 of 101" in out.output
    assert [j.id for j in q.claim("w", limit=200, lease_ms=10_000).jobs] == [p]
    assert q.counts().dead == 0 and len(kids) == 100


def test_the_cli_requeues_a_partitioned_parent_before_its_children(
    cli: Run, client: redis.Redis, queue_name: str
) -> None:
    """The same through a partitioned queue (the flow in the parent's partition)."""
    pq = PartitionedQueue.create(client, queue_name, partitions=3)
    try:
        p = pq.enqueue("parent", None, max_attempts=1, job_id="a-parent")
        pq.enqueue_many([JobSpec("child", n, after=[p]) for n in range(100)])
        home = pq.part_of(p)
        _park_flow(home, p)
        assert pq.dead_ids()[-1] == p
        out = cli("dead", "requeue", "-y", "-q", queue_name)
        assert out.exit_code == 0 and "101 of 101" in out.output, out.output
        assert [j.id for j in home.claim("w", limit=200, lease_ms=10_000).jobs] == [p]
    finally:
        delete_partitioned(client, pq)


def test_a_scan_returns_no_id_twice_when_many_die_at_its_cursors_ms(
    client: redis.Redis, q: Queue
) -> None:
    """scan_dead pages by a (dead_ms, id) cursor; ids that died at the cursor's very ms between
    two pages (sorting above it: more than a page of them) pushed the cursor's entry below the
    next page, whose last entry then became the cursor, above ids already returned: those
    came back (dead_ids listed them twice; a requeue counted the second ones skipped)."""
    client.zadd(q.keys.dead, {f"a{n:03}": 1000 for n in range(100)})
    op = scan_dead(q.keys, page=1)
    reply = q._execute(next(op))
    client.zadd(q.keys.dead, {f"b{n:03}": 1000 for n in range(100)})  # dying at that ms
    try:
        while True:
            reply = q._execute(op.send(reply))
    except StopIteration as done:
        found = [i for _, i in done.value]
    assert len(found) == len(set(found))
    assert set(found) >= {f"a{n:03}" for n in range(100)}


def test_dead_list_shows_an_entry_whose_record_was_deleted_by_hand(
    cli: Run, client: redis.Redis, q: Queue
) -> None:
    """An id on the dead list whose hash and spec were deleted by hand (redis-cli DEL) was
    counted ('3 match') but left out of the rows, text and JSON: the operator could not see
    which entry it was, nor that `dead purge --id` removes it."""
    ids = [q.enqueue("parent", None, max_attempts=1, job_id=f"j{n}") for n in range(3)]
    for jid in ids:
        _park_flow(q, jid)
    client.delete(q.keys.job("j1"), q.keys.spec("j1"))
    out = cli("dead", "list", "-q", q.name)
    assert out.exit_code == 0, out.output
    assert "3 match" in out.output and "j0" in out.output and "j2" in out.output
    assert "j1  record gone" in out.output
    assert "scheduler dead purge --id j1" in out.output
    js = json.loads(cli("dead", "list", "-q", q.name, "--json").output)
    assert [r["id"] for r in js["jobs"]] == ["j2", "j0"] and js["gone"] == ["j1"]
    assert js["total"] == 3
    assert cli("dead", "purge", "-q", q.name, "--id", "j1", "-y").exit_code == 0
    js = json.loads(cli("dead", "list", "-q", q.name, "--json").output)
    assert js["total"] == 2 and js["gone"] == []
