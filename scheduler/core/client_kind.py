"""The client a queue or worker is given is of the kind it drives: a URL, or a blocking client
given where a redis.asyncio one is needed (or the reverse), failed only at the first call."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from scheduler.core.errors import BadArgument

# What a user may hand a queue: a Redis Cluster client as well as one server's (the driver
# routes each script by slot), typed as the one server's client inside.
SyncClient = redis.Redis | RedisCluster
AsyncClient = aredis.Redis | AsyncRedisCluster


class Unpicklable:
    """A queue holds a Redis connection: pickle (and deepcopy) refuse it saying what to pass
    instead, not with pickle's "cannot pickle '_thread.lock' object" from inside redis-py."""

    def __reduce__(self) -> str:
        kind = type(self).__name__
        article = "an" if kind[0] in "AEIOU" else "a"
        raise TypeError(
            f"{article} {kind} holds a Redis connection and cannot be pickled: pass the URL and "
            f"the queue's name, and open the {kind} in the process that uses it "
            "(docs/guide/manual.md 'Threads, forks and pickling')"
        )

    def __copy__(self) -> Any:
        """copy.copy, as before: a queue on the same connection."""
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        return twin


def check_client(
    client: object,
    owner: str,
    *,
    is_async: bool,
    twin: str = "AsyncQueue",
    from_url: str | None = None,
) -> None:
    """BadArgument for a URL or a client of the other kind given to `owner`'s constructor:
    each failed only at the first call, with a TypeError (a coroutine never awaited, or an
    int awaited after the call had already run). Other objects (wrappers, fakes) pass.
    `twin`: the blocking owner's asyncio counterpart; `from_url`: what opens one from a URL."""
    kind = f"{type(client).__module__}.{type(client).__name__}"
    if isinstance(client, str | bytes):
        hint = from_url or f"{owner}.from_url(url)"
        raise BadArgument(f"{owner} takes a redis client, not a URL: use {hint}")
    if hasattr(client, "ops") and hasattr(client, "client"):  # a Queue: its client was meant
        raise BadArgument(f"{owner} takes a redis client, not a {kind}: pass q.client")
    if is_async and isinstance(client, redis.Redis | RedisCluster):
        raise BadArgument(f"{owner} needs a redis.asyncio client, got a blocking {kind}")
    if not is_async and isinstance(client, aredis.Redis | AsyncRedisCluster):
        raise BadArgument(f"{owner} needs a blocking client ({twin} takes a {kind})")
