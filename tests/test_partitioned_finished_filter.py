"""A partitioned queue's finished page filtered by task (the dashboard's `?task=`) is merged in
the order of the unfiltered page: the finished index's, latest to expire first (ties by id, as
one ZSET), not by when each job finished (they differ when jobs are kept for different
times)."""

from __future__ import annotations

import re
import time

import pytest
import redis
from starlette.testclient import TestClient

from scheduler.client.partitioned import PartitionedQueue
from scheduler.dashboard import Auth, create_app

HOUR_MS = 3_600_000
pytestmark = pytest.mark.pq(partitions=2)


def shown(html: str, ids: list[str]) -> list[str]:
    """The ids of `ids` in the order the page shows them (first mention)."""
    at = {i: m.start() for i in ids if (m := re.search(re.escape(i), html))}
    return sorted(at, key=at.__getitem__)


def test_task_filtered_finished_page_is_in_the_unfiltered_order(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    # Finished one after another, kept 10 h, 1 h, 10 h, 1 h...: the index (by expiry) and the
    # finish order disagree, across both partitions.
    ttls = [10 * HOUR_MS, HOUR_MS, 9 * HOUR_MS, 2 * HOUR_MS, 8 * HOUR_MS, 3 * HOUR_MS]
    ids = [pq.enqueue("a" if n % 3 else "b", {"n": n}, result_ttl_ms=t) for n, t in enumerate(ttls)]
    assert {pq.layout.partition_of_id(i) for i in ids} == {0, 1}
    for job_id in ids:
        part = pq.parts[pq.layout.partition_of_id(job_id)]
        (job,) = part.claim("w", limit=1).jobs
        assert job.id == job_id
        part.complete(job.id, job.token, "ok")
        time.sleep(0.003)  # a later finished_ms for each
    index_order = [j.id for j in pq.list_jobs("finished")]
    assert index_order != ids[::-1]  # the finish order differs from the index's
    want = [i for i in index_order if pq.get_job(i).task == "a"]
    with TestClient(create_app(client=client, queues=(pq.name,), auth=Auth())) as t:
        whole = t.get(f"/queues/{pq.name}?state=finished").text
        filtered = t.get(f"/queues/{pq.name}?state=finished&task=a").text
        two = t.get(f"/queues/{pq.name}?state=finished&task=a&limit=2").text
    assert shown(whole, ids) == index_order
    assert shown(filtered, ids) == want
    assert shown(two, ids) == want[:2]
