"""The cap on the connections result waits hold is a connection pool's (client/result_slots.py
`pool_of`): clients made on one pool share it, on both clients. Each client object used to get
its own half of the pool, so two clients' waits took all of it (tests/test_review_session_diff5.py
shows the enqueue that then failed). No server: no call is sent."""

from __future__ import annotations

import asyncio

import redis
import redis.asyncio
import redis.asyncio.cluster

from scheduler.client import result_slots, result_waiting


def test_blocking_clients_on_one_pool_share_its_slots() -> None:
    pool = redis.ConnectionPool(max_connections=4)
    a, b = redis.Redis(connection_pool=pool), redis.Redis(connection_pool=pool)
    own = redis.Redis(connection_pool=redis.ConnectionPool(max_connections=4))
    slots = result_slots._sync_slots(a)
    assert (slots is result_slots._sync_slots(b), slots.free) == (True, 2)
    assert result_slots._sync_slots(own) is not slots


def test_asyncio_clients_on_one_pool_share_its_slots() -> None:
    async def shared() -> tuple[object, object, object, bool]:
        pool = redis.asyncio.ConnectionPool(max_connections=4)
        a, b = redis.asyncio.Redis(connection_pool=pool), redis.asyncio.Redis(connection_pool=pool)
        own = redis.asyncio.Redis(connection_pool=redis.asyncio.ConnectionPool(max_connections=4))
        got = result_waiting._shared(a)
        await got.slots.acquire()  # one of the pool's 2 wait slots, taken by a's wait
        await got.slots.acquire()
        return got, result_waiting._shared(b), result_waiting._shared(own), got.slots.locked()

    a, b, own, full = asyncio.run(shared())
    assert (a is b, a is own, full) == (True, False, True)


class _Manager:  # a blocking cluster's NodesManager: a plain object
    pass


class _SlotsManager:  # redis.asyncio's NodesManager: __slots__, no __weakref__
    __slots__ = ("nodes",)


class _Cluster:  # a cluster client: no connection_pool, a nodes_manager
    def __init__(self, manager: object) -> None:
        self.nodes_manager = manager


def test_a_cluster_client_shares_its_nodes_managers_slots_or_keeps_its_own() -> None:
    """A RedisCluster has no one pool: its nodes manager (each node's pool's size), else, one
    that takes no weak reference (redis.asyncio's), the client itself."""
    assert "__weakref__" not in dir(redis.asyncio.cluster.NodesManager)  # why the fallback
    manager = _Manager()
    a, b = _Cluster(manager), _Cluster(manager)
    assert result_slots.pool_of(a) is result_slots.pool_of(b) is manager
    assert result_slots._sync_slots(a) is result_slots._sync_slots(b)
    aio = _Cluster(_SlotsManager())
    assert result_slots.pool_of(aio) is aio
