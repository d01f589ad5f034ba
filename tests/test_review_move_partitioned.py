"""Review of `scheduler queue move` where partitioned queues are involved (scheduler/admin/
queue_move*.py, scheduler/cli/queue_move.py, scheduler/core/partitions.py, docs/cluster.md
"Outgrowing one Redis"): a partitioned queue's logical name or one of its partitions on either
side, what stays and what survives, doctor on a half-done move, the CLI's exit codes.

The two defects found (a destination partitioned while a run starts; a partition's name taken
by a new partitioned queue) are fixed: their tests, last, now pass; the others are what holds."""

from __future__ import annotations

import asyncio
import json
import shlex
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler.admin.queue_move import QueueMove, move_queue
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.client.queue import Queue
from scheduler.core.connection import connect_async
from scheduler.core.errors import BadArgument
from scheduler.core.keys import QueueKeys
from scheduler.core.partitions import Layout
from tests.conftest import delete_queue, dump_queue, new_queue
from tests.fixtures.partitioned import MakePq, delete_partitioned

NO_RECORD = ("move_to", "move_take_ms")


def _cli(*args: str) -> tuple[int, str]:
    out = CliRunner(env={"REDIS_URL": None}).invoke(main, list(args))  # lines name their --url
    return out.exit_code, out.output


def _dump_all(client: redis.Redis, *queues: Queue | PartitionedQueue) -> dict[str, Any]:
    """Every key of each queue (a partitioned one: its logical name and each partition)."""
    out: dict[str, Any] = {}
    for q in queues:
        parts = [Queue(client, q.name)] + (q.parts if isinstance(q, PartitionedQueue) else [])
        for p in parts:
            out.update(dump_queue(client, p))
    return out


def _logical_keys(client: redis.Redis, name: str) -> list[str]:
    return sorted(client.scan_iter(match=QueueKeys(name).pattern(), count=1000))


def _waiting(client: redis.Redis, *queues: Queue) -> list[str]:
    return sorted(str(j) for q in queues for j in client.zrange(q.keys.due, 0, -1))


# -- What holds -----------------------------------------------------------------------------


def test_a_partitioned_source_leaves_its_stays_schedule_and_record_and_the_cli_tells_it(
    client: redis.Redis, make_pq: MakePq, redis_url: str
) -> None:
    # Leased, dead, flow and a schedule's run stay in their partitions and are counted once
    # each; the schedule refuses the move (exit 1, nothing written) until --skip-schedules;
    # the layout record survives, no run record or lock is left in any partition.
    a = make_pq(partitions=3, suffix="-a")
    b = new_queue(client, "rmp-b-")
    try:
        leased_id = a.enqueue("rmp.task", {"n": "leased"})
        lease = a.claim("w", limit=1).jobs[0]
        a.enqueue("rmp.task", {"n": "dead"}, max_attempts=1)
        dead = a.claim("w", limit=1).jobs[0]
        a.fail(dead.id, dead.token, ("E", "x", ""), retryable=False)
        a.enqueue("rmp.task", {"n": "prio"}, priority=5)
        ids = [a.enqueue("rmp.task", {"i": i}) for i in range(7)]
        a.schedule("hourly", "rmp.task", every_ms=3_600_000)
        base = ["queue", "move", "--url", redis_url, "--from", a.name, "--to", b.name, "--json"]
        before = _dump_all(client, a, b)
        code, out = _cli(*base)
        assert code == 1 and "1 schedule(s)" in out, out
        assert _dump_all(client, a, b) == before
        code, out = _cli(*base, "--skip-schedules")
        assert code == 0, out
        report = json.loads(out)
        assert report["moved"] == 7, report
        assert report["stays"] == {
            "leased": 1, "held": 0, "flow": 1, "schedule": 1, "dead": 1, "unreadable": 0,
            "conflict": 0, "moving": 0,
        }  # fmt: skip
        assert _waiting(client, b) == sorted(ids)
        assert PartitionedQueue.open(client, a.name).layout == a.layout
        assert [s.name for s in a.list_schedules()] == ["hourly"]
        assert a.status(leased_id) == "leased" and a.status(dead.id) == "dead"
        a.complete(lease.id, lease.token)  # the leased one ends in its own partition
        for p in a.parts:
            assert client.hmget(p.keys.config, list(NO_RECORD)) == [None, None]
            assert not client.exists(p.keys.prefix + "move_lock", p.keys.prefix + "moving")
        assert _logical_keys(client, a.name) == [QueueKeys(a.name).prefix + "partitions"]
    finally:
        delete_queue(client, b)


def test_a_round_trip_through_a_plain_queue_brings_each_job_home_once(
    client: redis.Redis, make_pq: MakePq
) -> None:
    # a (3 partitions) -> b (plain) -> a: each id back in the partition it is tagged with, a
    # keyed enqueue re-sent finds the moved job; nothing but the record under a's own name.
    a = make_pq(partitions=3, suffix="-rt")
    b = new_queue(client, "rmp-rt-")
    try:
        ids = [a.enqueue("rmp.task", {"i": i}) for i in range(6)]
        keyed = a.enqueue("rmp.task", {"k": 1}, key="order-7")
        assert move_queue(client, a.name, b.name).moved == 7
        assert move_queue(client, b.name, a.name).moved == 7
        for jid in [*ids, keyed]:
            home = a.parts[a.layout.partition_of_id(jid)]
            assert client.zscore(home.keys.due, jid) is not None, jid
        assert _waiting(client, *a.parts) == sorted([*ids, keyed])
        assert _waiting(client, b) == []
        assert a.enqueue("rmp.task", {"k": 1}, key="order-7") == keyed
        assert _logical_keys(client, a.name) == [QueueKeys(a.name).prefix + "partitions"]
    finally:
        delete_queue(client, b)


def test_every_partition_name_is_refused_on_either_side_with_nothing_written(
    client: redis.Redis, make_pq: MakePq, redis_url: str
) -> None:
    # Both name forms (`<q>.p<k>` and `<q>.p<k>.<j>`, which 2 partitions give here): exit 2,
    # the message names the queue itself; nothing written on either side.
    d = make_pq(partitions=2, suffix="-d")
    assert any(n.count(".") == 2 for n in d.layout.names), d.layout.names
    s = new_queue(client, "rmp-s-")
    try:
        s.enqueue("rmp.task", job_id="x")
        d.enqueue("rmp.task", {"i": 1})
        before = _dump_all(client, s, d)
        for part in d.layout.names:
            for a, b, flag in ((s.name, part, "--to"), (part, s.name, "--from")):
                code, out = _cli("queue", "move", "--url", redis_url, "--from", a, "--to", b)
                assert code == 2 and f"{flag} {d.name}" in out, out
        assert _dump_all(client, s, d) == before
    finally:
        delete_queue(client, s)


def test_an_unreadable_layout_record_on_either_side_is_exit_1_with_nothing_written(
    client: redis.Redis, queue_name: str, redis_url: str
) -> None:
    s = new_queue(client, "rmp-u-")
    junk = Queue(client, queue_name + "-u")
    try:
        s.enqueue("rmp.task", job_id="x")
        client.set(junk.keys.prefix + "partitions", "junk")
        before = _dump_all(client, s, junk)
        for a, b in ((s.name, junk.name), (junk.name, s.name)):
            code, out = _cli("queue", "move", "--url", redis_url, "--from", a, "--to", b)
            assert code == 1 and "unreadable stored data" in out, out
        assert _dump_all(client, s, junk) == before
    finally:
        delete_queue(client, s)
        delete_queue(client, junk)


def test_doctor_names_the_partition_of_a_stopped_move_and_its_rerun_and_fix_keeps_it(
    client: redis.Redis, make_pq: MakePq, redis_url: str
) -> None:
    # a (3) -> d (2) stopped after a put from one partition: doctor on the logical name names
    # that partition and the destination to rerun to (a warning: exit 0, --strict 1); --fix
    # leaves `moving` alone; the rerun finishes with no copy and doctor is clean.
    a = make_pq(partitions=3, suffix="-da")
    d = make_pq(partitions=2, suffix="-dd")
    ids = [a.enqueue("rmp.task", {"i": i}) for i in range(9)]
    m = QueueMove(client, a.name, d.name)
    part = next(p for p in m.src if client.zcard(p.keys.due) >= 2)
    pair = [str(j) for j in client.zrange(part.keys.due, 0, 1)]
    assert m.put(m.take(part, pair)) == "cc"  # then killed
    doctor = ["doctor", "--url", redis_url, "-q", a.name, "--no-server", "--json"]
    code, out = _cli(*doctor)
    found = json.loads(out)["findings"]
    assert code == 0 and [(f["code"], f["queue"]) for f in found] == [
        ("move-interrupted", part.name)
    ], out
    assert f"--to {d.name} --url {shlex.quote(redis_url)}`" in found[0]["fix"]  # the checked URL
    assert _cli(*doctor, "--strict")[0] == 1
    assert _cli(*doctor, "--fix")[0] == 0
    assert sorted(client.zrange(part.keys.prefix + "moving", 0, -1)) == sorted(pair)
    report = move_queue(client, a.name, d.name)
    assert (report.moved, report.resumed, report.already) == (7, 2, 2), report.as_dict()
    assert _waiting(client, *d.parts) == sorted(ids)
    assert _waiting(client, *a.parts) == []
    for q in (a.name, d.name):
        code, out = _cli("doctor", "--url", redis_url, "-q", q, "--no-server", "--json")
        assert code == 0 and json.loads(out)["findings"] == [], out


# -- Fixed defects ---------------------------------------------------------------------------


def test_a_destination_partitioned_while_the_run_starts_is_no_bad_usage(
    client: redis.Redis, queue_name: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run reads each side's layout once, when it is made; PartitionedQueue.create(dest)
    # from another process before its first put (docs step 1, run a moment late) makes every
    # put refused by move_in.lua ("is partitioned"): BadArgument, exit 2 "bad usage ... nothing
    # was written", with advice for a plain Queue user, while the batch waits in the source's
    # `moving` and a `move_from:` record sits in a config hash under the partitioned name,
    # which no later run deletes (it clears the partitions').
    s = new_queue(client, "rmp-race-")
    dest = queue_name + "-race"
    ids = [s.enqueue("rmp.task", {"i": i}, job_id=f"j{i}") for i in range(4)]
    real_check = QueueMove.check
    calls: list[int] = []

    def check(self: QueueMove, *, skip_schedules: bool, dry_run: bool = False) -> None:
        calls.append(1)
        if len(calls) == 2:  # the run's own check, holding its lock: created just before
            PartitionedQueue.create(client, dest, partitions=2)
        real_check(self, skip_schedules=skip_schedules, dry_run=dry_run)

    monkeypatch.setattr(QueueMove, "check", check)
    try:
        code, out = _cli("queue", "move", "--url", redis_url, "--from", s.name, "--to", dest)
        monkeypatch.undo()
        moving = client.zrange(s.keys.prefix + "moving", 0, -1)
        assert code == 1 and "open_queue" not in out, (code, out, moving)
        assert "was partitioned" in out and moving == [], out  # refused before any write
        assert _logical_keys(client, dest) == [QueueKeys(dest).prefix + "partitions"]
        move_queue(client, s.name, dest)
        pq = PartitionedQueue.open(client, dest)
        assert _waiting(client, *pq.parts) == sorted(ids)
        assert _logical_keys(client, dest) == [QueueKeys(dest).prefix + "partitions"]
    finally:
        delete_queue(client, s)
        layout = Layout.create(dest, 2)
        for name in (dest, *layout.names):
            delete_queue(client, Queue(client, name))


@pytest.mark.parametrize("order", ["queue-first", "partition-name-first"])
def test_a_partitions_name_is_no_new_partitioned_queue(
    client: redis.Redis, queue_name: str, order: str
) -> None:
    # `PartitionedQueue.create(client, "emails.p1", ...)` (docs/cluster.md's first step of a
    # move, a destination name picked beside the source) while "emails" is partitioned, or
    # "emails" created after it: the record under the partition's name makes every write into
    # that partition refused ("queue=emails.p1 is partitioned"), so emails' enqueues routed
    # there fail, and `queue move --to emails` exits 2 with the job left in the source's
    # `moving`. check_names already refuses such a name as --to / --from.
    name = queue_name + "-own"
    child = Layout.create(name, 3).names[1]
    made: list[PartitionedQueue] = []
    try:
        if order == "queue-first":
            made.append(PartitionedQueue.create(client, name, partitions=3))
            with pytest.raises(BadArgument, match="partition"):
                made.append(PartitionedQueue.create(client, child, partitions=2))
        else:
            made.append(PartitionedQueue.create(client, child, partitions=2))
            with pytest.raises(BadArgument, match="partition"):
                made.append(PartitionedQueue.create(client, name, partitions=3))
    finally:
        for pq in made:
            delete_partitioned(client, pq)
        for n in (name, child):
            delete_queue(client, Queue(client, n))


def test_a_destination_partitioned_before_the_first_put_is_refused_and_the_rerun_finishes(
    client: redis.Redis, queue_name: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Partitioned after the run's check, before its first put: move_in.lua refuses the put
    # ("is partitioned"). Exit 1 (not "bad usage"), the `move_from:` record written before the
    # put deleted (nothing but the layout under the name); the batch waits in the source's
    # `moving`, and the same command run again re-sends it into the partitions.
    s = new_queue(client, "rmp-put-")
    dest = queue_name + "-put"
    ids = [s.enqueue("rmp.task", {"i": i}, job_id=f"j{i}") for i in range(4)]
    real_put = QueueMove.put

    def put(self: QueueMove, entries: list[Any]) -> str:
        if not client.exists(QueueKeys(dest).prefix + "partitions"):
            PartitionedQueue.create(client, dest, partitions=2)
        return real_put(self, entries)

    monkeypatch.setattr(QueueMove, "put", put)
    base = ["queue", "move", "--url", redis_url, "--from", s.name, "--to", dest, "--json"]
    try:
        code, out = _cli(*base)
        monkeypatch.undo()
        assert code == 1 and "partitioned during the run" in out, out
        assert sorted(str(j) for j in client.zrange(s.keys.prefix + "moving", 0, -1)) == ids
        assert _logical_keys(client, dest) == [QueueKeys(dest).prefix + "partitions"]
        code, out = _cli(*base)
        assert code == 0, out
        report = json.loads(out)
        assert (report["moved"], report["resumed"], report["already"]) == (4, 4, 0), report
        pq = PartitionedQueue.open(client, dest)
        assert _waiting(client, *pq.parts) == sorted(ids) and _waiting(client, s) == []
        assert not client.exists(s.keys.prefix + "moving")
        assert _logical_keys(client, dest) == [QueueKeys(dest).prefix + "partitions"]
        for p in pq.parts:
            assert not [f for f in client.hkeys(p.keys.config) if str(f).startswith("move_from")]
    finally:
        delete_queue(client, s)
        for name in (dest, *Layout.create(dest, 2).names):
            delete_queue(client, Queue(client, name))


@pytest.mark.parametrize("order", ["queue-first", "partition-name-first"])
def test_the_async_create_refuses_a_partitions_name_too(
    client: redis.Redis, queue_name: str, redis_url: str, order: str
) -> None:
    name = queue_name + "-aown"
    child = Layout.create(name, 3).names[2]
    first, second = (name, child) if order == "queue-first" else (child, name)
    n = {name: 3, child: 2}

    async def main() -> None:
        aclient = connect_async(redis_url)
        try:
            await AsyncPartitionedQueue.create(aclient, first, partitions=n[first])
            with pytest.raises(BadArgument, match="partition"):
                await AsyncPartitionedQueue.create(aclient, second, partitions=n[second])
        finally:
            await aclient.aclose()

    try:
        asyncio.run(main())
        assert not client.exists(QueueKeys(second).prefix + "partitions")
    finally:
        for q in (name, child):
            for part in (q, *Layout.create(q, n[q]).names):
                delete_queue(client, Queue(client, part))
