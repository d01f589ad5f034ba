"""A job page's live workers (Store.live_workers: the 'no live worker' reason) counted a
worker of a partitioned queue once a partition, as /workers did: it beats on every one, so a
worker of 4 partitions was 4 live workers; and it read each partition with two round trips of
its own (a ZRANGE, an EXISTS). Now each distinct live worker counts once, read in two
pipelines a server whatever the number of partitions."""

from __future__ import annotations

import pytest
import redis

from scheduler.client.partitioned import PartitionedQueue
from scheduler.dashboard.store import Store
from tests.fixtures.partitioned import MakePq
from tests.test_dashboard_workers_round_trips import count_sends
from tests.test_dashboard_workers_scale import register


@pytest.mark.pq(partitions=4)
def test_a_worker_of_every_partition_is_one_live_worker(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    for part in pq.parts:
        register(client, part.name, ["w-all"])
    register(client, pq.parts[1].name, ["w-p1"])
    register(client, pq.parts[2].name, ["w-gone"], live=False)  # its hash expired
    assert Store(client).live_workers(pq.name)[0] == 2  # before: 5


def test_the_round_trips_do_not_grow_with_the_partitions(
    private: redis.Redis, make_pq: MakePq, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted = []
    for n in (2, 8):
        pq = make_pq(partitions=n, suffix=f"-{n}", client="private")
        for part in pq.parts:
            register(private, part.name, ["w-all", f"w-{part.name}"])
        store = Store(private)
        store.view(pq.name)  # its partition record: read once, kept
        with monkeypatch.context() as mp:
            sent = count_sends(mp)
            assert store.live_workers(pq.name)[0] == n + 1
            counted.append(len(sent))
    assert counted[0] == counted[1] <= 2  # before: 4 and 16
