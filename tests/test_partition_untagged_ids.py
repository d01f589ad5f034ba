"""A dead job written to a partition's own queue (an ordinary queue: `scheduler enqueue -q
<name>.p1.4`, or `pq.parts[1]`) has an untagged id that Layout.partition_of_id routes to another
partition about 3 times in 4. `scheduler dead requeue` / `dead purge` (--all, --id) and
PartitionedQueue.requeue_dead / purge_dead (sync and asyncio) acted where the id routes, so
such a job was skipped: not found dead there. Each must be acted on in the partition whose
dead list holds it."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis
from click.testing import CliRunner

from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.partitioned_aio import AsyncPartitionedQueue, open_queue_async
from scheduler.core.errors import JobNotFound
from scheduler.core.ids import new_job_id
from tests.fixtures.partitioned import delete_partitioned


def _dead_in_each(pq: PartitionedQueue, per: int = 3) -> list[str]:
    """`per` dead jobs written to each partition's own queue; most route elsewhere."""
    ids: list[str] = []
    for k, part in enumerate(pq.parts):
        names = [new_job_id() for _ in range(per)]
        while k == 0 and pq.layout.partition_of_id(names[0]) == 0:  # one stray for certain:
            names[0] = new_job_id()  # left to chance, none was about 1 run in 4^(4 * per)
        ids += [part.enqueue("t", {"n": n}, job_id=j) for n, j in enumerate(names)]
        for job in part.claim("w", limit=10).jobs:
            part.fail(job.id, job.token, ("Boom", "it broke", ""), retryable=False)
    strays = [i for k in range(4) for i in ids[per * k : per * (k + 1)]
              if pq.layout.partition_of_id(i) != k]  # fmt: skip
    assert strays  # the premise: some ids route to another partition than theirs
    return ids


@pytest.fixture
def pq(client: redis.Redis, queue_name: str):  # type: ignore[no-untyped-def]
    q = PartitionedQueue.create(client, queue_name, partitions=4)
    yield q
    delete_partitioned(client, q)


def _dead(pq: PartitionedQueue) -> int:
    return sum(p.counts().dead for p in pq.parts)


@pytest.mark.parametrize("verb", ["requeue", "purge"])
def test_cli_without_filter_acts_on_every_dead_job(
    pq: PartitionedQueue, redis_url: str, verb: str
) -> None:
    ids = _dead_in_each(pq)
    args = ["dead", verb, "-y", "-q", pq.name, "--url", redis_url, "--json"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert (out["matched"], out["done"], out["skipped"]) == (12, 12, 0)
    assert _dead(pq) == 0
    assert sum(p.counts().due for p in pq.parts) == (12 if verb == "requeue" else 0)
    assert len(ids) == 12


@pytest.mark.parametrize("verb", ["requeue", "purge"])
def test_cli_by_id_finds_each_in_its_partition(
    pq: PartitionedQueue, redis_url: str, verb: str
) -> None:
    ids = _dead_in_each(pq, per=1)
    args = ["dead", verb, "-y", "-q", pq.name, "--url", redis_url, "--json"]
    res = CliRunner().invoke(main, [*args, *(a for i in ids for a in ("--id", i))])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["done"] == 4
    assert _dead(pq) == 0


def test_cli_list_by_id_reads_each_from_its_partition(pq: PartitionedQueue, redis_url: str) -> None:
    ids = _dead_in_each(pq, per=1)
    args = ["dead", "list", "-q", pq.name, "--url", redis_url, "--json"]
    res = CliRunner().invoke(main, [*args, *(a for i in ids for a in ("--id", i))])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["gone"] == []
    assert sorted(j["id"] for j in data["jobs"]) == sorted(ids)


@pytest.mark.parametrize("verb", ["requeue_dead", "purge_dead"])
def test_library_acts_on_every_id(pq: PartitionedQueue, verb: str) -> None:
    ids = _dead_in_each(pq)
    assert getattr(pq, verb)([*ids, "never-was"]) == 12
    assert _dead(pq) == 0


@pytest.mark.parametrize("verb", ["requeue_dead", "purge_dead"])
def test_asyncio_acts_on_every_id(pq: PartitionedQueue, redis_url: str, verb: str) -> None:
    ids = _dead_in_each(pq)

    async def run() -> int:
        aq = await open_queue_async(redis_url, pq.name)
        assert isinstance(aq, AsyncPartitionedQueue)
        async with aq:
            return int(await getattr(aq, verb)(ids))

    assert asyncio.run(run()) == 12
    assert _dead(pq) == 0


def _strays(pq: PartitionedQueue) -> list[str]:
    """Jobs enqueued straight into each partition (untagged, random ids) until one's id routes
    to another partition: one per partition left none such about 1 run in n^n (a flaky test)."""
    for _ in range(20):
        ids = [p.enqueue("t", delay_ms=60_000) for p in pq.parts]
        stray = [i for k, i in enumerate(ids) if pq.layout.partition_of_id(i) != k]
        if stray:
            return stray
    raise AssertionError("no id routed outside its partition in 20 rounds")


def test_one_job_calls_find_a_job_outside_its_ids_partition(pq: PartitionedQueue) -> None:
    """status / get_job / cancel / reschedule with such an id asked only the partition it routes
    to: JobNotFound. They ask the others when that one does not have it."""
    stray = _strays(pq)
    for i in stray:
        assert pq.get_job(i).id == i
        assert str(pq.status(i)) == "scheduled"
        assert pq.reschedule(i, delay_ms=0) == "rescheduled"  # due now: 1 ms could still be ahead
        assert pq.cancel(i) == "due"  # the state before: now cancelled
        assert str(pq.status(i)) == "cancelled"
    with pytest.raises(JobNotFound):
        pq.status("never-was")


def test_one_job_calls_asyncio(pq: PartitionedQueue, redis_url: str) -> None:
    stray = _strays(pq)

    async def run() -> list[str]:
        aq = await open_queue_async(redis_url, pq.name)
        assert isinstance(aq, AsyncPartitionedQueue)
        async with aq:
            return [str(await aq.status(i)) + (await aq.get_job(i)).id + await aq.cancel(i)
                    + str(await aq.status(i)) for i in stray]  # fmt: skip

    assert stray
    assert asyncio.run(run()) == [f"scheduled{i}scheduledcancelled" for i in stray]
