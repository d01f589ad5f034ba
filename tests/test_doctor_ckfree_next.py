"""doctor --fix's repair of a stray member of a key's lease set (lua/repair.lua 'ckfree') lets
the key's held jobs go as a lease's end does (lib/flow.lua's walk): its oldest held jobs, each
as far as its own limit has room, oldest first, the first without room stopping the rest (the
key stays FIFO). Before, the repair let go as many as the oldest held job's limit had room for,
whatever the limits of the jobs behind it: a job of limit 1 went back to due with its key's one
slot taken, and one of limit 3 behind it with it (claim held both again). Real scripts on a
private Redis."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import redis
from click.testing import CliRunner

from scheduler import JobState, Queue
from scheduler.admin.doctor import check_queue, repair_queue
from scheduler.admin.inspection import server_now_ms
from scheduler.cli.main import main

FAR_MS = 4_000_000_000_000
CK = "flow:ck:k"


def _held_behind_a_stray(q: Queue, client: redis.Redis) -> tuple[str, str, str]:
    """Key k (limit 3) full: two leases of a worker that died a minute ago (lapsed, not yet
    reaped: no claim since, and within doctor's stale-lease window) and a stray member. Held,
    oldest first: h (limit 3), u (limit 1), v (limit 3)."""
    now_ms = server_now_ms(client)
    leases = [q.enqueue("t", f"l{n}", concurrency_key="k", concurrency_limit=3) for n in (1, 2)]
    assert sorted(j.id for j in q.claim("w-gone", limit=5).jobs) == sorted(leases)
    client.zadd(q.keys.prefix + CK, {"ghost": FAR_MS})  # by hand: no lease
    ids = []
    for n, limit in enumerate((3, 1, 3)):
        at = datetime.fromtimestamp((now_ms - 30_000 + n * 10_000) / 1000, UTC)
        ids.append(q.enqueue("t", n, concurrency_key="k", concurrency_limit=limit, run_at=at))
        assert q.claim("w", limit=5).jobs == []
    # The worker's leases ended a minute ago: both their scores, as a lease that ran out.
    for lease in leases:
        client.zadd(q.keys.leased, {lease: now_ms - 60_000})
        client.zadd(q.keys.prefix + CK, {lease: now_ms - 60_000})
    h, u, v = ids
    assert all(q.status(j) == JobState.HELD for j in ids)
    return h, u, v


def _held(q: Queue, ids: list[str]) -> list[bool]:
    return [q.status(j) == JobState.HELD for j in ids]


def test_the_repair_lets_go_the_held_jobs_whose_own_limit_has_room_fifo(
    q: Queue, client: redis.Redis
) -> None:
    h, u, v = _held_behind_a_stray(q, client)
    assert [i.code for i in check_queue(client, q.name)] == ["flow-slot-stray"]
    report = repair_queue(client, q.name)
    assert [i.code for i in report.fixed] == ["flow-slot-stray"] and report.remaining == []
    # The key is empty now: h has room (1 of 3); u (limit 1) would be its second: it waits,
    # and v, behind it, with it (FIFO). Before: all three due.
    assert _held(q, [h, u, v]) == [False, True, True]
    assert client.zscore(q.keys.due, h) is not None
    assert "flow_reason" not in q.get_job(h).fields
    assert [str(m) for m in client.zrange(q.keys.prefix + "flow:ckheld:k", 0, -1)] == [u, v]
    assert client.zcard(q.keys.prefix + CK) == 0


def test_the_cli_fix_frees_the_same(q: Queue, client: redis.Redis, redis_url: str) -> None:
    h, u, v = _held_behind_a_stray(q, client)
    args = ["doctor", "--url", redis_url, "-q", q.name, "--no-server", "--fix", "--json"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert [f["code"] for f in json.loads(res.output)["fixed"]] == ["flow-slot-stray"]
    assert _held(q, [h, u, v]) == [False, True, True]
