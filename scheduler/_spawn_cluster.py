"""A private local Redis Cluster (tests, the failover test, bench/cluster*.py): N primaries with
one replica each, on free 127.0.0.1 ports, built from scheduler._spawn.RedisProcess (the one
spawner) and joined with CLUSTER MEET / ADDSLOTSRANGE / REPLICATE, so no redis-cli is needed.
About 8 s for 3 + 3 nodes, most of it waiting for every node to agree on the slots."""

from __future__ import annotations

import contextlib
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from scheduler._spawn import RedisProcess

SLOTS = 16384


def _free_cluster_port() -> int:
    """A port free with its cluster-bus port (+10000) on 127.0.0.1, below 55536."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port == 6379 or port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


@dataclass
class LocalCluster:
    """`primaries` primaries + as many replicas. start() returns self; `with` works too."""

    binary: str
    primaries: int = 3
    node_timeout_ms: int = 5000
    nodes: list[RedisProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The scheduler's cluster URL over every node (scheduler.core.connection)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes) + "/"

    def node_client(self, node: RedisProcess) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=node.port, decode_responses=True)

    def start(self, timeout_s: float = 60.0) -> LocalCluster:
        extra = (
            "--cluster-enabled", "yes",
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--cluster-config-file", "nodes.conf",
        )  # fmt: skip
        try:
            for _ in range(self.primaries * 2):
                node = RedisProcess(self.binary, extra, tcp=True, port=_free_cluster_port())
                self.nodes.append(node.start())
            self._join(timeout_s)
        except BaseException:
            self.cleanup()
            raise
        return self

    def _join(self, timeout_s: float) -> None:
        clients = [self.node_client(n) for n in self.nodes]
        try:
            ids = [str(_cmd(c, "CLUSTER", "MYID")) for c in clients]
            for c in clients[1:]:
                _cmd(c, "CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port)
            per = SLOTS // self.primaries
            for i in range(self.primaries):
                last = SLOTS - 1 if i == self.primaries - 1 else (i + 1) * per - 1
                _cmd(clients[i], "CLUSTER", "ADDSLOTSRANGE", i * per, last)
            deadline = time.monotonic() + timeout_s
            self._until(deadline, lambda: all(_known(c) >= len(clients) for c in clients))
            for r in range(self.primaries):
                replica = clients[self.primaries + r]
                _cmd(replica, "CLUSTER", "REPLICATE", ids[r])
            self._until(deadline, lambda: all(_ok(c) for c in clients))
        finally:
            for c in clients:
                c.close()

    @staticmethod
    def _until(deadline: float, check: object) -> None:
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                if check():  # type: ignore[operator]
                    return
            time.sleep(0.05)
        raise RuntimeError("the local cluster did not come up in time")

    def primary_for(self, key: str) -> RedisProcess:
        """The node serving `key`'s slot as primary, as the first live node answering sees it."""
        for node in self.nodes:
            if not node.running:
                continue
            with contextlib.suppress(redis.RedisError), self.node_client(node) as c:
                slot = int(_cmd(c, "CLUSTER", "KEYSLOT", key))
                for start, end, primary, *_ in _cmd(c, "CLUSTER", "SLOTS"):
                    if int(start) <= slot <= int(end):
                        return next(n for n in self.nodes if n.port == int(primary[1]))
        raise LookupError(f"no primary serves {key!r}")

    def cleanup(self) -> None:
        # kill -9: the data is thrown away. A SHUTDOWN command closed the connection under
        # redis-py 8, which re-tried it for ~4 s per node (23 s for six).
        for node in self.nodes:
            node.kill()
            node.cleanup()
        self.nodes.clear()

    def __enter__(self) -> LocalCluster:
        return self if self.nodes else self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _cmd(client: redis.Redis, *args: object) -> Any:
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def _known(c: redis.Redis) -> int:
    return sum(1 for line in str(_cmd(c, "CLUSTER", "NODES")).splitlines() if line)


def _ok(c: redis.Redis) -> bool:
    """The cluster is ok as this node sees it, and its replication link is up."""
    if "cluster_state:ok" not in str(_cmd(c, "CLUSTER", "INFO")):
        return False
    role = _cmd(c, "ROLE")
    if str(role[0]) == "master":
        return len(role[2]) >= 1
    return str(role[3]) == "connected"
