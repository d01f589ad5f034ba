"""The one reader of a connection URL, and what the rest of the package needs to know about a
client: is it a Redis Cluster, which node owns a key, one plain client per primary.

URL forms (every entry point: `Queue.from_url`, `AsyncQueue.from_url`, `scheduler worker`, every
CLI command, `doctor`):

    redis://host:port/0, rediss://..., unix:///path.sock     one server
    redis+cluster://host:port,host:port/                     a Redis Cluster (any node(s) of it)
    rediss+cluster://...                                     the same over TLS
    redis://host:port/?cluster=1  (also rediss://)           the same, one seed node

User and password go in the URL as usual (`redis+cluster://user:pw@h:p,h:p/`). A cluster has
only database 0 and needs TCP: `unix://` with cluster, or `/1`, is refused (BadArgument)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterNode, RedisCluster

from scheduler.core.errors import BadArgument
from scheduler.core.safety import redact

__all__ = [
    "Target",
    "connect",
    "connect_async",
    "is_cluster",
    "parse_url",
    "primaries",
]

_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


@dataclass(frozen=True)
class Target:
    """A parsed URL. `url` is a plain single-server URL (for a cluster: its first seed node,
    without the cluster marker), `seeds` the cluster's seed nodes (empty: not a cluster)."""

    url: str
    seeds: tuple[tuple[str, int], ...] = ()

    @property
    def cluster(self) -> bool:
        return bool(self.seeds)


def _fail(url: str, why: str) -> BadArgument:
    return BadArgument(f"invalid Redis URL {redact(url)}: {why}")


def parse_url(url: str) -> Target:
    """Read one URL (module docstring); BadArgument when it cannot name a server."""
    if not isinstance(url, str) or "://" not in url:
        raise BadArgument(f"invalid Redis URL {redact(str(url))}: expected scheme://...")
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    cluster = scheme in _SCHEMES
    plain = _SCHEMES.get(scheme, scheme)
    if plain not in ("redis", "rediss", "unix"):
        raise _fail(url, f"unknown scheme {scheme!r} (redis, rediss, unix, redis+cluster)")
    parts = urlsplit(f"{plain}://{rest}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    flag = [v.strip().lower() for k, v in query if k == "cluster"]
    for value in flag:
        if value not in _TRUE + _FALSE:
            raise _fail(url, f"cluster={value!r}: expected 1 or 0")
    cluster = cluster or any(v in _TRUE for v in flag)
    query_text = urlencode([(k, v) for k, v in query if k != "cluster"])
    if not cluster:  # passed on as given, unless it said cluster=0
        return Target(urlunsplit(parts._replace(query=query_text)) if flag else url)
    if plain == "unix":
        raise _fail(url, "a Redis Cluster needs TCP (redis+cluster://host:port,...)")
    creds, _, hosts = parts.netloc.rpartition("@")
    seeds = tuple(_host_port(url, h) for h in hosts.split(",") if h.strip())
    if not seeds:
        raise _fail(url, "no host:port given")
    db = parts.path.strip("/")
    if db not in ("", "0") or any(k == "db" and v not in ("", "0") for k, v in query):
        raise _fail(url, "a Redis Cluster has only database 0")
    host, port = seeds[0]
    netloc = (creds + "@" if creds else "") + (f"[{host}]" if ":" in host else host) + f":{port}"
    return Target(urlunsplit((plain, netloc, "/0", query_text, "")), seeds)


def _host_port(url: str, text: str) -> tuple[str, int]:
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = text, "6379"
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise _fail(url, f"bad node {text!r}: expected host:port")
    return host, int(port)


def connect(url: str, **kwargs: Any) -> redis.Redis:
    """A blocking client for `url`: redis.Redis, or RedisCluster (typed as redis.Redis: it
    answers the same commands; the driver routes scripts by slot). Replies decoded unless
    `decode_responses=False` is given."""
    target = parse_url(url)
    kwargs.setdefault("decode_responses", True)
    if not target.cluster:
        return redis.Redis.from_url(target.url, **kwargs)
    others = [ClusterNode(h, p) for h, p in target.seeds[1:]]  # type: ignore[no-untyped-call]
    rc = RedisCluster.from_url(target.url, startup_nodes=others, **kwargs)
    return rc  # type: ignore[return-value]  # a RedisCluster answers the commands we send


def connect_async(url: str, **kwargs: Any) -> aredis.Redis:
    """The asyncio counterpart of connect()."""
    target = parse_url(url)
    kwargs.setdefault("decode_responses", True)
    if not target.cluster:
        return aredis.Redis.from_url(target.url, **kwargs)
    others = [AsyncClusterNode(h, p) for h, p in target.seeds[1:]]
    rc = AsyncRedisCluster.from_url(target.url, startup_nodes=others, **kwargs)
    return rc  # type: ignore[return-value]


# Per client class: the isinstance check costs ~3 us (AsyncRedisCluster's ABC/typing
# instancecheck) and the driver asks it on every call (issue 16: single enqueue).
_CLUSTER_TYPES: dict[type, bool] = {}


def is_cluster(client: Any) -> bool:
    """True for a redis-py RedisCluster (blocking or asyncio)."""
    kind = type(client)
    known = _CLUSTER_TYPES.get(kind)
    if known is None:
        known = _CLUSTER_TYPES[kind] = isinstance(client, (RedisCluster, AsyncRedisCluster))
    return known


def primaries(client: redis.Redis) -> list[redis.Redis]:
    """One plain client per primary of a cluster (for SCAN, INFO, CONFIG: per-node commands),
    or [client] for a single server. The clients belong to the cluster client (not closed)."""
    if not isinstance(client, RedisCluster):
        return [client]
    return [client.get_redis_connection(n) for n in client.get_primaries()]


def node_for_key(client: redis.Redis, key: str) -> redis.Redis:
    """The plain client of the primary owning `key`'s slot (the client itself on one server)."""
    if not isinstance(client, RedisCluster):
        return client
    return client.get_redis_connection(client.get_node_from_key(key))
