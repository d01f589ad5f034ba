"""A job written to a partition's own queue (`pq.parts[k]`, or `scheduler enqueue -q
<name>.p<k>`) has an untagged id that may route to another partition. These still went where
the id routes, not where the job is: `requeue_order` (the order `dead requeue` sends its chunks
in) read no parents for such a child, so it came before its parent; `jobs show`, `jobs
reschedule` and `jobs cancel ID` said the job was not there (exit 1); PartitionedQueue.complete
and .result (sync and asyncio) raised JobNotFound. Each acts where the job is now."""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner

from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue, requeue_order
from scheduler.client.partitioned_aio import AsyncPartitionedQueue, open_queue_async
from scheduler.core.errors import JobNotFound

pytestmark = pytest.mark.pq(partitions=4)


def stray_id(pq: PartitionedQueue, k: int, stem: str) -> str:
    """A caller's id (untagged) that routes to another partition than k."""
    return next(f"{stem}-{n}" for n in range(100) if pq.layout.partition_of_id(f"{stem}-{n}") != k)


def _stray(pq: PartitionedQueue, delay_ms: int | None = None) -> str:
    """A job in partition 0 whose id routes to another partition."""
    return pq.parts[0].enqueue("t", {"n": 1}, job_id=stray_id(pq, 0, "stray"), delay_ms=delay_ms)


def test_requeue_order_puts_a_stray_parent_before_its_child(pq: PartitionedQueue) -> None:
    part = pq.parts[0]
    parent = part.enqueue("t", None, job_id=stray_id(pq, 0, "parent"), max_attempts=1)
    child = part.enqueue("t", None, job_id=stray_id(pq, 0, "child"), after=[parent])
    (job,) = part.claim("w", limit=5).jobs
    part.fail(job.id, job.token, ("E", "m", ""))  # its child is parked with it
    assert set(part.dead_ids()) == {parent, child}
    assert requeue_order(pq, [child, parent]) == [parent, child]


def _cli(redis_url: str, pq: PartitionedQueue, *args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, [*args, "-q", pq.name, "--url", redis_url])
    return res.exit_code, res.stdout, res.stderr


def test_cli_show_finds_the_job_where_it_is(pq: PartitionedQueue, redis_url: str) -> None:
    job_id = _stray(pq, delay_ms=60_000)
    code, out, err = _cli(redis_url, pq, "jobs", "show", "--json", job_id)
    assert code == 0, err
    data = json.loads(out)
    assert (data["id"], data["state"], data["partition"]) == (job_id, "scheduled", pq.parts[0].name)


def test_cli_reschedule_finds_the_job_where_it_is(pq: PartitionedQueue, redis_url: str) -> None:
    job_id = _stray(pq, delay_ms=60_000)
    code, out, err = _cli(redis_url, pq, "jobs", "reschedule", "--now", job_id)
    assert code == 0, err
    assert out.strip() == f"{job_id}: rescheduled"
    assert str(pq.parts[0].status(job_id)) == "due"


def test_cli_cancel_by_id_finds_each_job_where_it_is(pq: PartitionedQueue, redis_url: str) -> None:
    stray = _stray(pq, delay_ms=60_000)
    tagged = pq.enqueue("t", None, delay_ms=60_000)
    code, out, err = _cli(redis_url, pq, "jobs", "cancel", "--json", stray, tagged, "nowhere")
    assert code == 1, err  # "nowhere" is missing
    assert json.loads(out)["jobs"] == {
        stray: "scheduled",
        tagged: "scheduled",
        "nowhere": "missing",
    }
    assert str(pq.parts[0].status(stray)) == "cancelled"
    assert str(pq.status(tagged)) == "cancelled"


def test_complete_and_result_find_the_job_where_it_is(pq: PartitionedQueue) -> None:
    job_id = _stray(pq)
    (job,) = pq.parts[0].claim("w").jobs
    pq.complete(job_id, job.token, {"ok": 1})
    assert pq.result(job_id, timeout_s=1) == {"ok": 1}
    with pytest.raises(JobNotFound):
        pq.result("nowhere", timeout_s=1)


def test_complete_and_result_asyncio(pq: PartitionedQueue, redis_url: str) -> None:
    job_id = _stray(pq)
    (job,) = pq.parts[0].claim("w").jobs

    async def run() -> object:
        aq = await open_queue_async(redis_url, pq.name)
        assert isinstance(aq, AsyncPartitionedQueue)
        async with aq:
            await aq.complete(job_id, job.token, {"ok": 2})
            with pytest.raises(JobNotFound):
                await aq.complete("nowhere", job.token)
            return await aq.result(job_id, timeout_s=1)

    assert asyncio.run(run()) == {"ok": 2}
    assert str(pq.parts[0].status(job_id)) == "done"
