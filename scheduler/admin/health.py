"""Server settings that break the product's promises, checked at worker / CLI start-up and by
`scheduler doctor`. Each finding says what is wrong and the command that fixes it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from redis.exceptions import RedisError

from scheduler.core.connection import UNREACHABLE, is_cluster

MIN_VERSION = (7, 0)
SAFE_EVICTION = "noeviction"


@dataclass(frozen=True)
class Finding:
    code: str  # stable identifier, e.g. 'eviction-policy'
    severity: str  # 'error' breaks "never lost"; 'warning' weakens it
    message: str
    fix: str  # the command an operator types
    node: str | None = None  # the cluster node it was read from ("host:port"; None: one server)


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for p in text.split(".")[:3]:
        try:
            parts.append(int(p))
        except ValueError:
            break
    return tuple(parts)


def check_server(info: dict[str, Any], config: dict[str, str]) -> list[Finding]:
    """Pure check of INFO (server, persistence, memory sections) and CONFIG GET values.
    `config` may be empty when CONFIG is not allowed (managed Redis, ACL users)."""
    out: list[Finding] = []
    version = str(info.get("redis_version", "0"))
    if _version(version) < MIN_VERSION:
        out.append(
            Finding(
                "server-version",
                "error",
                f"Redis {version} is older than 7.0 (scripts rely on "
                "effects replication and ZRANGE BYSCORE)",
                "upgrade Redis to 7.0 or newer",
            )
        )
    policy = config.get("maxmemory-policy") or str(info.get("maxmemory_policy", ""))
    if policy and policy != SAFE_EVICTION:
        out.append(
            Finding(
                "eviction-policy",
                "error",
                f"maxmemory-policy is {policy}: Redis may evict job keys under memory pressure",
                "redis-cli CONFIG SET maxmemory-policy noeviction",
            )
        )
    aof = int(info.get("aof_enabled", 0) or 0)
    rdb_save = config.get("save")
    if not aof and not config:
        # CONFIG refused (an ACL user): RDB snapshots cannot be seen, so "off" is not proven.
        out.append(
            Finding(
                "persistence-unknown",
                "warning",
                "AOF is off and CONFIG is not allowed to this user, so RDB snapshots cannot be "
                "checked: a restart may lose every job",
                "redis-cli CONFIG SET appendonly yes (as an admin)",
            )
        )
    elif not aof and not rdb_save:
        out.append(
            Finding(
                "persistence-off",
                "error",
                "persistence is off (no AOF, no RDB snapshots): a restart loses every job",
                "redis-cli CONFIG SET appendonly yes && redis-cli CONFIG SET appendfsync always",
            )
        )
    elif not aof:
        out.append(
            Finding(
                "aof-off",
                "warning",
                "only RDB snapshots: a crash loses the jobs accepted since the last snapshot",
                "redis-cli CONFIG SET appendonly yes",
            )
        )
    elif config.get("appendfsync") and config.get("appendfsync") != "always":
        out.append(
            Finding(
                "fsync-relaxed",
                "warning",
                f"appendfsync is {config['appendfsync']}: a power loss or kernel crash may lose up "
                "to about a second of accepted jobs (a Redis process crash alone loses nothing)",
                "redis-cli CONFIG SET appendfsync always",
            )
        )
    return out


INFO_SECTIONS = ("server", "persistence", "memory")
CONFIG_NAMES = ("maxmemory-policy", "appendfsync", "save")


def _on(node: Any) -> dict[str, Any]:
    return {} if node is None else {"target_nodes": node}


def read_server(client: Any, node: Any = None) -> tuple[dict[str, Any], dict[str, str]]:
    """INFO and the few CONFIG values we need; CONFIG may be refused to a least-privilege user.
    `node`: on a RedisCluster, the node to read (else the client's default node)."""
    info: dict[str, Any] = {}
    for section in INFO_SECTIONS:
        info.update(client.info(section, **_on(node)))
    config: dict[str, str] = {}
    try:
        for name in CONFIG_NAMES:
            config.update({k: str(v) for k, v in client.config_get(name, **_on(node)).items()})
    except RedisError:  # NOPERM for ACL users without CONFIG; INFO still answers
        config = {}
    return info, config


NODE_UNREACHABLE = "node-unreachable"
NODE_BACK = "restart the node, or let its replica take over (CLUSTER FAILOVER on the replica)"


def unreachable_finding(exc: Exception) -> Finding:
    """A cluster node that does not answer (the others are read): its queues wait for it."""
    message = f"does not answer ({exc}): its queues' jobs wait until it is back"
    return Finding(NODE_UNREACHABLE, "error", message, NODE_BACK)


def server_nodes(client: Any) -> list[Any]:
    """The primaries of a cluster client (None: the one server of a plain client)."""
    return list(client.get_primaries()) if is_cluster(client) else [None]


def at_node(node: Any, found: list[Finding]) -> list[Finding]:
    """On a cluster, each finding names the node it was read from."""
    if node is None:
        return found
    return [replace(f, message=f"node {node.name}: {f.message}", node=node.name) for f in found]


def check_servers(client: Any, *, down_ok: bool = False) -> list[Finding]:
    """check_server on every primary of a cluster (the one server otherwise); RedisError
    propagates (the doctor reports it). With `down_ok`, a cluster node that does not answer
    is a finding of its own and the others are read."""
    out: list[Finding] = []
    for node in server_nodes(client):
        try:
            found = check_server(*read_server(client, node))
        except UNREACHABLE as exc:
            if node is None or not down_ok:
                raise
            found = [unreachable_finding(exc)]
        out += at_node(node, found)
    return out


async def read_server_async(client: Any, node: Any = None) -> tuple[dict[str, Any], dict[str, str]]:
    """read_server for a redis.asyncio client."""
    info: dict[str, Any] = {}
    for section in INFO_SECTIONS:
        info.update(await client.info(section, **_on(node)))
    config: dict[str, str] = {}
    try:
        for name in CONFIG_NAMES:
            got = await client.config_get(name, **_on(node))
            config.update({k: str(v) for k, v in got.items()})
    except RedisError:
        config = {}
    return info, config
