"""`cancel` answers the state the job was in, in the words of docs/glossary.md and the CLI's
`jobs list --state`: 'due' (run time reached), 'scheduled' (run time later), 'held' (set aside
by flow control: parents not done, a concurrency key full, a rate window), 'leased'; the same
from Queue, AsyncQueue, the partitioned twins and `scheduler jobs cancel`. Before, each waiting
one answered 'due' (lua/cancel.lua)."""

from __future__ import annotations

import asyncio
import json

import redis
from click.testing import CliRunner

from scheduler import AsyncQueue, PartitionedQueue, Queue
from scheduler.cli.main import main
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.core.connection import connect_async
from tests.conftest import delete_queue
from tests.fixtures.partitioned import delete_partitioned
from tests.test_dashboard import csrf_of, make_client

HOUR_MS = 3_600_000


def _one_of_each(q: Queue) -> dict[str, str]:
    """A job in each state cancel can stop, by that state's word."""
    leased = q.enqueue("t", None)
    claimed = q.claim("w1", limit=1).jobs
    assert [j.id for j in claimed] == [leased]
    parent = q.enqueue("t", None, delay_ms=HOUR_MS)
    waiting = q.enqueue("t", None, after=[parent])
    q.enqueue("c", None, concurrency_key="k", concurrency_limit=1)
    limited = q.enqueue("c", None, concurrency_key="k", concurrency_limit=1)
    assert len(q.claim("w1", limit=10).jobs) == 1  # the other of key k is set aside
    due = q.enqueue("t", None)
    return {"due": due, "scheduled": parent, "held": waiting, "held-by-key": limited,
            "leased": leased}  # fmt: skip


def test_cancel_answers_the_state_the_job_was_in(q: Queue) -> None:
    jobs = _one_of_each(q)
    assert q.status(jobs["scheduled"]) == "scheduled"
    # The parent's children are parked when it is cancelled: cancel the child first.
    order = ["held", "held-by-key", "due", "scheduled", "leased"]
    got = {name: q.cancel(jobs[name]) for name in order}
    assert got == {"held": "held", "held-by-key": "held", "due": "due",
                   "scheduled": "scheduled", "leased": "leased"}  # fmt: skip
    assert {q.status(j) for j in jobs.values()} == {"cancelled"}
    assert q.cancel(jobs["scheduled"]) == "cancelled"  # a re-sent call


def test_the_async_and_partitioned_clients_answer_alike(
    client: redis.Redis, redis_url: str, queue_name: str
) -> None:
    pq = PartitionedQueue.create(client, queue_name, partitions=2)
    try:
        later = pq.enqueue("t", None, delay_ms=HOUR_MS, key="a")
        child = pq.enqueue("t", None, after=[later])
        assert pq.cancel(child) == "held" and pq.cancel(later) == "scheduled"

        async def main() -> tuple[str, ...]:
            ac = connect_async(redis_url)
            try:
                apq = await AsyncPartitionedQueue.open(ac, queue_name)
                later = await apq.enqueue("t", None, delay_ms=HOUR_MS, key="b")
                child = await apq.enqueue("t", None, after=[later])
                aq = AsyncQueue(ac, queue_name + "-plain")
                plain = await aq.enqueue("t", None, delay_ms=HOUR_MS)
                try:
                    return (await apq.cancel(child), await apq.cancel(later),
                            await aq.cancel(plain))  # fmt: skip
                finally:
                    delete_queue(client, Queue(client, queue_name + "-plain"))
            finally:
                await ac.aclose()

        assert asyncio.run(main()) == ("held", "scheduled", "scheduled")
    finally:
        delete_partitioned(client, pq)


def test_the_cli_says_the_state_and_counts_it_cancelled(redis_url: str, q: Queue) -> None:
    jobs = _one_of_each(q)
    ids = [jobs[n] for n in ("held", "held-by-key", "due", "scheduled", "leased")]
    got = CliRunner().invoke(
        main, ["jobs", "cancel", "--url", redis_url, "--queue", q.name, *ids, "--json"]
    )
    assert got.exit_code == 0, got.output
    assert json.loads(got.stdout)["jobs"] == {
        jobs["held"]: "held", jobs["held-by-key"]: "held", jobs["due"]: "due",
        jobs["scheduled"]: "scheduled", jobs["leased"]: "leased",
    }  # fmt: skip
    assert {q.status(j) for j in ids} == {"cancelled"}


def test_the_dashboard_says_cancelled_for_each_waiting_state(client: redis.Redis, q: Queue) -> None:
    jobs = _one_of_each(q)
    with make_client(client, q) as web:
        token = csrf_of(web.get(f"/queues/{q.name}").text)
        for name in ("held", "scheduled"):
            r = web.post(f"/queues/{q.name}/jobs/{jobs[name]}/cancel", data={"csrf": token})
            assert f"Cancelled the job (it was {name})." in r.text
    assert q.status(jobs["held"]) == q.status(jobs["scheduled"]) == "cancelled"
