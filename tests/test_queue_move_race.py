"""Two `scheduler queue move` runs from one source at once (scheduler/admin/queue_move.py,
lua/move_out.lua): each step is called apart, so a test stops one run between steps while the
other goes on. A job must never wait in two destinations (it would run twice)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from scheduler.admin.queue_move import MoveRefused, QueueMove, move_queue
from scheduler.admin.queue_move_check import MOVE_QUIET_MS
from scheduler.admin.queue_move_check import script_call as _call
from scheduler.client.queue import Queue
from scheduler.core.errors import BadArgument
from scheduler.core.scripts import lua_dir
from tests.conftest import dump_queue
from tests.fixtures.move_queues import made_queues, waiting_in

IDS = ["j0", "j1", "j2", "j3"]


@pytest.fixture
def queues(client: redis.Redis) -> Iterator[tuple[Queue, Queue, Queue]]:
    with made_queues(client, "mvr-src-", "mvr-one-", "mvr-two-") as (src, one, two):
        for i, jid in enumerate(IDS):
            src.enqueue("mvr.task", {"i": i}, job_id=jid)
        yield src, one, two


def test_two_runs_to_different_destinations_never_write_one_job_into_both(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    # Both pass their checks (nothing moving yet); A takes the jobs into `moving`; B's take
    # returned them again (a job in `moving` is re-sent, for a rerun) and both wrote them:
    # the same job waiting in `one` and in `two`, run twice.
    src, one, two = queues
    a, b = QueueMove(client, src.name, one.name), QueueMove(client, src.name, two.name)
    a.check(skip_schedules=False)
    b.check(skip_schedules=False)
    taken_a = a.take(a.src[0], IDS)
    try:
        taken_b = b.take(b.src[0], IDS)
    except MoveRefused:
        taken_b = []
    for run, taken in ((a, taken_a), (b, taken_b)):
        if taken:
            run.put(taken)
            run.finish(run.src[0], [e.id for e in taken])
    assert {jid: waiting_in(client, jid, src, one, two) for jid in IDS} == {
        jid: [one.name] for jid in IDS
    }


def test_the_second_destination_is_refused_by_the_take_itself_with_nothing_written(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    src, one, two = queues
    a, b = QueueMove(client, src.name, one.name), QueueMove(client, src.name, two.name)
    a.check(skip_schedules=False)
    b.check(skip_schedules=False)  # before A's first take: passes
    a.take(a.src[0], IDS[:2])
    before = dump_queue(client, src)
    with pytest.raises(MoveRefused, match=f"move to '{one.name}'"):
        b.take(b.src[0], IDS)
    assert dump_queue(client, src) == before and dump_queue(client, two) == {}
    # A finishes (its rerun re-sends the two in `moving`, then the rest); its end clears the
    # record, and the source may then go anywhere.
    report = move_queue(client, src.name, one.name)
    assert (report.moved, report.resumed) == (4, 2)
    assert client.hget(src.keys.config, "move_to") is None
    src.enqueue("mvr.task", job_id="later")
    assert move_queue(client, src.name, two.name).moved == 1
    assert client.zrange(two.keys.due, 0, -1) == ["later"]


def test_between_two_batches_another_destination_waits_for_the_record_to_go_stale(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    # A has moved one batch and not yet taken the next: `moving` is empty. B toward `two`
    # would split the queue between two destinations: refused while A's last take is recent.
    src, one, two = queues
    a, b = QueueMove(client, src.name, one.name), QueueMove(client, src.name, two.name)
    taken = a.take(a.src[0], IDS[:2])
    a.finish(a.src[0], [e.id for e in taken if a.put(taken)])
    assert client.zcard(src.keys.prefix + "moving") == 0
    before = dump_queue(client, src)
    with pytest.raises(MoveRefused, match="ago"):
        b.take(b.src[0], IDS[2:])
    with pytest.raises(MoveRefused, match="ago"):
        move_queue(client, src.name, two.name)  # checked before the first write too
    with pytest.raises(MoveRefused, match="ago"):
        move_queue(client, src.name, two.name, dry_run=True)
    assert dump_queue(client, src) == before
    # A run that stopped long ago between batches (its record stale): B may go elsewhere.
    stale = int(client.hget(src.keys.config, "move_take_ms") or 0) - MOVE_QUIET_MS - 1
    client.hset(src.keys.config, "move_take_ms", stale)
    assert move_queue(client, src.name, two.name).moved == 2
    assert sorted(client.zrange(one.keys.due, 0, -1)) == IDS[:2]
    assert sorted(client.zrange(two.keys.due, 0, -1)) == IDS[2:]


def test_a_partitioned_source_each_partition_refuses_the_other_destination(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue], make_pq: Any
) -> None:
    # The record is per partition: B, past its checks, is refused at the first partition A
    # took from; the partitions A has not reached yet refuse B at check().
    _, one, two = queues
    source = make_pq(partitions=2, suffix="-src")
    for i in range(8):
        source.enqueue("mvr.task", {"i": i})
    a, b = QueueMove(client, source.name, one.name), QueueMove(client, source.name, two.name)
    b.check(skip_schedules=False)
    k = next(k for k, p in enumerate(a.src) if client.zcard(p.keys.due))
    ids = [str(i) for i in client.zrange(a.src[k].keys.due, 0, -1)]
    assert a.take(a.src[k], ids)
    with pytest.raises(MoveRefused, match=one.name):
        b.take(b.src[k], ids)
    with pytest.raises(MoveRefused, match=one.name):
        move_queue(client, source.name, two.name)
    assert client.zcard(two.keys.due) == 0
    assert move_queue(client, source.name, one.name).moved == 8
    assert all(client.hget(p.keys.config, "move_to") is None for p in a.src)


def test_a_record_of_the_previous_version_without_a_time_still_works(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    # The previous version wrote `move_to` alone (from Python, before each take).
    src, one, two = queues
    client.hset(src.keys.config, "move_to", one.name)
    assert move_queue(client, src.name, two.name, dry_run=True).moved == 4  # moving empty
    client.zrem(src.keys.due, "j0")
    client.zadd(src.keys.prefix + "moving", {"j0": 1})  # its interrupted run's job
    b = QueueMove(client, src.name, two.name)
    with pytest.raises(MoveRefused, match=one.name):
        move_queue(client, src.name, two.name)
    with pytest.raises(MoveRefused, match=one.name):
        b.take(b.src[0], ["j1"])
    report = move_queue(client, src.name, one.name)  # its own destination finishes it
    assert (report.moved, report.resumed) == (4, 1)


def test_a_take_time_far_ahead_of_the_clock_counts_as_old(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    # A time edited by hand (or written before the server's clock went back) would otherwise
    # keep every other destination out until that time.
    src, one, two = queues
    client.hset(src.keys.config, mapping={"move_to": one.name, "move_take_ms": 7_000_000_000_000})
    assert move_queue(client, src.name, two.name).moved == 4


def test_a_dry_run_writes_no_record(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    src, one, _ = queues
    before = dump_queue(client, src)
    assert move_queue(client, src.name, one.name, dry_run=True).moved == 4
    assert dump_queue(client, src) == before


def test_a_run_end_clears_only_its_own_record(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    # A stopped between batches long ago; B (to `two`) now holds the record. A's end must not
    # delete B's record: a third run to `one` would then be let in while B is between batches.
    src, one, two = queues
    a, b = QueueMove(client, src.name, one.name), QueueMove(client, src.name, two.name)
    a.take(a.src[0], ["j0"])
    a.finish(a.src[0], ["j0"], back=True)
    client.hset(src.keys.config, "move_take_ms", 0)
    b.take(b.src[0], ["j1"])
    a.close(a.src[0])
    assert client.hget(src.keys.config, "move_to") == two.name
    assert not b.close(b.src[0])  # j1 still in `moving`: kept for the rerun
    taken = b.take(b.src[0], ["j1"])
    assert b.put(taken) == "c" and b.finish(b.src[0], ["j1"]) == 1
    assert b.close(b.src[0])
    assert client.hmget(src.keys.config, ["move_to", "move_take_ms"]) == [None, None]


def test_the_quiet_bound_is_the_same_in_lua_and_python() -> None:
    text = (lua_dir() / "move_out.lua").read_text()
    assert f"local MOVE_QUIET_MS = {MOVE_QUIET_MS}" in text


def test_move_out_refuses_a_destination_that_is_no_queue_name(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    src, _, _ = queues
    before = dump_queue(client, src)
    for bad in ("", "a b", "x" * 65, "{tag}"):
        with pytest.raises(BadArgument, match="to="):
            src._run(_call("move_out", ["take", bad, "j0"]))
    assert dump_queue(client, src) == before
