"""An entry of a key's hold set flow:ckheld:<key> whose job is not held (no flow:held entry:
added by hand) sits at its head with an old score. A lease's end lets the key's held jobs go
by the head's own limit (lib/flow.lua): the stale head, no job, reads as limit 1, so the end
of the key's last lease let it go alone and the key's real held jobs stayed held with the key
empty, until a new job of the key came. doctor did not see it; now it finds it
(`flow-held-stale`) and --fix removes it (lua/repair.lua 'ckstale'), then lets the key's held
jobs that have room go. Real scripts on a private Redis."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import redis
from click.testing import CliRunner

from scheduler import JobState, Queue
from scheduler.admin.doctor import check_queue, repair_queue
from scheduler.admin.inspection import server_now_ms
from scheduler.cli.main import main

HELD = "flow:ckheld:k"


def _stale_head(q: Queue, client: redis.Redis) -> tuple[str, str, str]:
    """a (limit 1) leased; x (limit 1) held, y (limit 3) held behind it; a stale head."""
    now_ms = server_now_ms(client)
    ids = []
    for n, limit in enumerate((1, 1, 3)):
        at = datetime.fromtimestamp((now_ms - 30_000 + n * 10_000) / 1000, UTC)
        ids.append(q.enqueue("t", n, concurrency_key="k", concurrency_limit=limit, run_at=at))
    a, x, y = ids
    assert [j.id for j in q.claim("w", limit=5).jobs] == [a]
    assert q.status(x) == JobState.HELD and q.status(y) == JobState.HELD
    client.zadd(q.keys.prefix + HELD, {"ghost": 0})  # by hand: no job held
    return a, x, y


def test_doctor_finds_and_removes_a_stale_head_and_the_key_drains(
    q: Queue, client: redis.Redis
) -> None:
    a, x, y = _stale_head(q, client)
    found = check_queue(client, q.name)
    assert [i.code for i in found] == ["flow-held-stale"]  # before: nothing
    assert "ghost" in found[0].message and found[0].repair
    report = repair_queue(client, q.name)
    assert [i.code for i in report.fixed] == ["flow-held-stale"] and report.remaining == []
    assert [str(m) for m in client.zrange(q.keys.prefix + HELD, 0, -1)] == [x, y]
    assert q.status(x) == JobState.HELD  # the key is still full: nothing else moved
    # a ends: x goes (with the stale head left, the head went in its stead and x stayed held
    # with the key empty); y goes once x has started, 2 of its limit of 3.
    q.complete(a, q.get_job(a).token or "", None)
    assert q.status(x) == JobState.DUE and q.status(y) == JobState.HELD
    got = [j.id for j in q.claim("w", limit=5).jobs]
    assert got + [j.id for j in q.claim("w", limit=5).jobs] == [x, y]
    assert check_queue(client, q.name) == []


def test_a_held_job_is_no_stale_entry(q: Queue, client: redis.Redis) -> None:
    _a, x, y = _stale_head(q, client)
    client.zrem(q.keys.prefix + HELD, "ghost")
    assert check_queue(client, q.name) == []
    assert repair_queue(client, q.name).fixed == []
    assert [str(m) for m in client.zrange(q.keys.prefix + HELD, 0, -1)] == [x, y]


def test_the_repair_lets_the_held_jobs_with_room_go(
    q: Queue, client: redis.Redis, redis_url: str
) -> None:
    """A stale head written while the key is empty: the fix removes it through the CLI and
    lets the held jobs with room go (x's and y's limits both have room once the key is
    empty), oldest first. (A stale head at the key's last lease end no longer keeps x held:
    that end drops it, tests/test_flow_stale_head.py.)"""
    a, x, y = _stale_head(q, client)
    q.complete(a, q.get_job(a).token or "", None)  # the stale head dropped, x goes
    assert q.status(x) == JobState.DUE and q.status(y) == JobState.HELD
    client.zadd(q.keys.prefix + HELD, {"ghost": 0})  # and one is written again
    args = ["doctor", "--url", redis_url, "-q", q.name, "--no-server", "--fix", "--json"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert [f["code"] for f in json.loads(res.output)["fixed"]] == ["flow-held-stale"]
    assert q.status(x) == JobState.DUE and q.status(y) == JobState.DUE
    got = [j.id for j in q.claim("w", limit=5).jobs]
    assert got + [j.id for j in q.claim("w", limit=5).jobs] == [x, y]
    assert client.zcard(q.keys.prefix + HELD) == 0
