"""`scheduler jobs cancel <id>... -q <partitioned queue>` when a partition's node stops
answering with a cancel in flight (a timeout reading its reply): that cancel was sent, so it
may have run, but it was printed as 'not cancelled: partition ... does not answer'. It is
unknown: said so ('unknown whether cancelled: ...', --json 'unknown'), exit 3 as before; the
ids of that partition not yet sent stay 'not cancelled'. The lost reply is injected after the
real cancel ran on a private server, so the job is in fact cancelled."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler.cli import job_cancel
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import connect
from scheduler.operations.ops import Op
from tests.redis_server import RedisProcess


@pytest.fixture
def two_jobs(module_server: RedisProcess) -> Iterator[tuple[str, str, str, str]]:
    """(url, queue, a, b): jobs a then b in the same partition of a 2-partition queue."""
    client = connect(module_server.url)
    client.flushall()
    pq = PartitionedQueue.create(client, "ct", partitions=2)
    keys = [k for k in (f"k{i}" for i in range(100)) if pq.layout.partition_of_key(k) == 0]
    a, b = (pq.enqueue("t", None, key=k, delay_ms=3_600_000) for k in keys[:2])
    yield module_server.url, "ct", a, b
    client.close()


@pytest.fixture
def reply_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first cancel runs, then its reply is lost: a read timeout, as redis-py raises it."""
    real = job_cancel._cancel_op

    def lost(q: Any, ids: Any) -> Op[list[str]]:
        yield from real(q, ids)
        raise redis.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(job_cancel, "_cancel_op", lost)


@pytest.mark.usefixtures("reply_lost")
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_cancel_whose_reply_was_lost_is_unknown_not_refused(
    two_jobs: tuple[str, str, str, str], as_json: bool
) -> None:
    url, queue, a, b = two_jobs
    args = ["jobs", "cancel", a, b, "-q", queue, "--url", url, *(["--json"] if as_json else [])]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 3, result.output
    pq = PartitionedQueue.open(connect(url), queue)
    assert pq.status(a) == "cancelled"  # it ran: 'not cancelled' was wrong
    assert pq.status(b) == "scheduled"  # never sent
    if as_json:
        data = json.loads(result.stdout)
        assert data["jobs"] == {}
        (unknown,) = data["unknown"]
        (unreachable,) = data["unreachable"]
        assert a in unknown and b in unreachable
    else:
        lines = result.stderr.splitlines()
        assert any(s.startswith("unknown whether cancelled:") and a in s for s in lines), lines
        assert not any(s.startswith("not cancelled:") and a in s for s in lines), lines
        assert any(s.startswith("not cancelled:") and b in s for s in lines), lines
    pq.client.close()
