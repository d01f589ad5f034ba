"""/workers counts a worker of a partitioned queue once: it beats on every partition, so each
partition's workers set has an entry for it, and the page counted (and paged through) each
entry: one worker on 3 partitions was 3 entries, and 150 such workers took three pages that
listed each worker again. Now a partitioned queue's entries are its partitions' merged, each
worker once (at its newest beat); its row still names the partition it was read in."""

from __future__ import annotations

import re

import pytest
import redis
from starlette.testclient import TestClient

from scheduler.client.partitioned import PartitionedQueue
from scheduler.dashboard import Auth, create_app
from scheduler.dashboard.store import WORKERS_SHOWN
from tests.test_dashboard_workers_scale import register, rows


def page(client: redis.Redis, pq: PartitionedQueue, path: str) -> str:
    with TestClient(create_app(client=client, queues=[pq.name], auth=Auth())) as web:
        got = web.get(path)
    assert got.status_code == 200
    return got.text


def note(html: str) -> str:
    m = re.search(r'<p class="hint" id="workers-page">(.*?)</p>', html, re.S)
    assert m is not None, "no note of the entries"
    return m.group(1)


def test_one_worker_of_every_partition_is_one_entry(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    for part in pq.parts:
        register(client, part.name, ["w-all"])
    assert [wid for wid, _ in rows(page(client, pq, "/workers"))] == ["w-all"]
    # Past its one entry: the note counts the queue's entries. Before: "Entries 2-3 of 3".
    assert "Entries 1-1 of 1 in" in note(page(client, pq, "/workers?from=1"))


@pytest.mark.pq(partitions=4)
def test_workers_of_every_partition_take_one_page_each_once(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    everywhere = [f"all-{i:03d}" for i in range(150)]  # x 4 partitions > WORKERS_SHOWN
    for part in pq.parts:
        register(client, part.name, everywhere)
    register(client, pq.parts[2].name, ["only-p2"])
    html = page(client, pq, "/workers")
    ids = [wid for wid, _ in rows(html)]
    assert sorted(ids) == sorted([*everywhere, "only-p2"])  # each once
    assert 'id="workers-next"' not in html  # before: 601 entries, three more pages
    assert f"of {len(everywhere) + 1} in" in note(page(client, pq, "/workers?from=1"))
    assert rows(page(client, pq, f"/workers?from={WORKERS_SHOWN}")) == []


def test_a_worker_is_read_in_the_partition_it_beat_last(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    """Its newest entry decides its place in the queue's order and where its row is read."""
    register(client, pq.parts[0].name, ["w-old", "w-new"])  # w-old newest on p0
    register(client, pq.parts[1].name, ["w-new"])  # ... w-new newer still on p1
    client.zadd(pq.parts[1].keys.workers, {"w-new": 10**13})
    got = rows(page(client, pq, "/workers"))
    assert got == [("w-new", pq.parts[1].name), ("w-old", pq.parts[0].name)]
