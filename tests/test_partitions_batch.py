"""core/cluster_io.py: an asyncio batch over several primaries that loses one node raises only
after the other nodes' pipelines ended, and marks the topology stale. The failure is injected
with stub nodes (a dropped connection on cue is what a real cluster cannot give on demand)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from scheduler.core import cluster_io
from scheduler.core.scripts import Batch


class _Node:
    def __init__(self, name: str, *, fail: bool, delay_s: float) -> None:
        self.name, self.fail, self.delay_s = name, fail, delay_s
        self.finished = False

    async def execute_command(self, *args: Any) -> Any:
        return "OK"

    async def execute_pipeline(self, cmds: list[Any]) -> None:
        await asyncio.sleep(self.delay_s)
        if self.fail:
            raise RedisConnectionError("node went away")
        for c in cmds:
            c.result = "reply"
        self.finished = True


class _Cluster:
    def __init__(self, nodes: dict[str, _Node]) -> None:
        self.nodes = nodes

    async def initialize(self) -> None:
        return None

    def get_node_from_key(self, key: str) -> _Node:
        return self.nodes[key]


def test_a_lost_node_raises_after_the_other_nodes_answered() -> None:
    slow = _Node("b", fail=False, delay_s=0.2)
    rc = _Cluster({"a": _Node("a", fail=True, delay_s=0.0), "b": slow})
    batch = Batch([], [("PING",), ("PING",)], ["a", "b"])

    async def main() -> bool:
        with pytest.raises(RedisConnectionError, match="went away"):
            await cluster_io._batch_async(rc, batch)
        return slow.finished  # before: raised at once, node b's pipeline still in flight

    try:
        assert asyncio.run(main())
        assert id(rc) in cluster_io._STALE
    finally:
        cluster_io._STALE.discard(id(rc))
