"""`key_ttl_ms`: how long an idempotency key is held past its first job's run time (a throttle
window, as BullMQ's deduplication ttl); default 24 h. Checked at the boundary: a bad value is
refused and nothing is written."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler import BadArgument, JobSpec, Queue, Registry
from scheduler.cli.main import main
from scheduler.core.limits import IDEMPOTENCY_TTL_MS


def test_a_key_is_held_for_its_ttl_past_the_run_time(client: redis.Redis, q: Queue) -> None:
    first = q.enqueue("t", key="report:7", key_ttl_ms=1_000, delay_ms=5_000)
    assert q.enqueue("t", key="report:7", key_ttl_ms=1_000) == first
    # Redis expires the key (PX, its own clock): run time + the ttl from now.
    ttl = client.pttl(q.keys.idem(hashlib.sha256(b"report:7").hexdigest()))
    assert 5_000 < ttl <= 6_000


def test_once_the_key_expired_the_same_key_enqueues_again(client: redis.Redis, q: Queue) -> None:
    first = q.enqueue("t", key="burst", key_ttl_ms=1)
    idem = q.keys.idem(hashlib.sha256(b"burst").hexdigest())
    for _ in range(1000):  # until Redis has expired it (1 ms), not a fixed sleep
        if not client.exists(idem):
            break
        time.sleep(0.001)
    assert not client.exists(idem)
    second = q.enqueue("t", key="burst", key_ttl_ms=1)
    assert second != first
    assert q.status(first) == "due" and q.status(second) == "due"


def test_without_a_ttl_a_key_lasts_a_day(client: redis.Redis, q: Queue) -> None:
    q.enqueue("t", key="k")
    ttl = client.pttl(q.keys.idem(hashlib.sha256(b"k").hexdigest()))
    assert IDEMPOTENCY_TTL_MS - 10_000 < ttl <= IDEMPOTENCY_TTL_MS


@pytest.mark.parametrize("bad", [0, -1, 366 * 86_400_000 + 1, 1.5, True, "1000"])
def test_a_bad_ttl_is_refused_and_nothing_written(client: redis.Redis, q: Queue, bad: Any) -> None:
    with pytest.raises(BadArgument, match="key_ttl_ms"):
        q.enqueue("t", key="k", key_ttl_ms=bad)
    with pytest.raises(BadArgument, match="key_ttl_ms"):
        q.enqueue_many([JobSpec("t"), JobSpec("t", key="k", key_ttl_ms=bad)])
    assert list(client.scan_iter(match=q.keys.prefix + "*")) == []


def test_a_task_handle_passes_it_on(client: redis.Redis, q: Queue) -> None:
    registry = Registry()

    @registry.task("digest")
    def digest(payload: Any, ctx: Any) -> None: ...

    spec = digest.job_spec({"user": 1}, key="digest:1", key_ttl_ms=60_000)
    assert spec.key_ttl_ms == 60_000
    first = digest.enqueue(q, {"user": 1}, key="digest:1", key_ttl_ms=60_000)
    assert digest.enqueue(q, {"user": 1}, key="digest:1", key_ttl_ms=60_000) == first
    assert 0 < client.pttl(q.keys.idem(hashlib.sha256(b"digest:1").hexdigest())) <= 60_000


def test_the_cli_takes_key_ttl(redis_url: str, client: redis.Redis, q: Queue) -> None:
    runner = CliRunner()
    args = ["enqueue", "--url", redis_url, "-q", q.name, "t", "--key", "once", "--key-ttl", "90s"]
    first = runner.invoke(main, args)
    again = runner.invoke(main, args)
    assert first.exit_code == 0 and again.exit_code == 0, first.output + again.output
    assert first.output == again.output  # the same id
    assert 80_000 < client.pttl(q.keys.idem(hashlib.sha256(b"once").hexdigest())) <= 90_000
    bad = runner.invoke(main, [*args[:-1], "-5s"])
    assert bad.exit_code == 2


def test_a_ttl_without_a_key_is_refused(client: redis.Redis, q: Queue) -> None:
    with pytest.raises(BadArgument, match="need a key"):
        q.enqueue("t", key_ttl_ms=1_000)
    assert list(client.scan_iter(match=q.keys.prefix + "*")) == []
