"""Review of `scheduler queue move`'s MOVE_INCOMING records and kept ids (`move_in:<source>`,
lua/move_in.lua): interleavings of two runs' steps, and crashes between them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from scheduler.admin.queue_move import MoveRefused, QueueMove, move_queue
from scheduler.admin.queue_move_check import script_call as _call
from scheduler.client.queue import Queue
from tests.fixtures.move_queues import expire_record, made_queues, waiting_in


@pytest.fixture
def ab(client: redis.Redis) -> Iterator[tuple[Queue, Queue]]:
    with made_queues(client, "mvr3-a-", "mvr3-b-") as (a, b):
        a.enqueue("mvr3.task", job_id="x")
        b.enqueue("mvr3.task", job_id="y")
        yield a, b


def test_a_kept_id_left_by_a_crash_after_the_finish_does_not_swallow_a_reused_id(
    client: redis.Redis, ab: tuple[Queue, Queue]
) -> None:
    a, b = ab
    m = QueueMove(client, a.name, b.name)
    assert m.put(m.take(m.src[0], ["x"])) == "c"
    # The finish's move_done runs, then the run dies before the SREM (forget_delivered).
    assert int(a._run(_call("move_done", ["done", "", "x"]))) == 1
    assert client.sismember(b.keys.prefix + "move_in:" + a.name, "x")
    (job,) = [j for j in b.claim("w", limit=10).jobs if j.id == "x"]
    b.complete("x", job.token)
    expire_record(client, b, "x")
    a.enqueue("mvr3.task", job_id="x")  # a new job under the id, days later
    report = move_queue(client, a.name, b.name)
    assert waiting_in(client, "x", a, b) == [b.name], (report.moved, report.already)


def _reruns(client: redis.Redis, *runs: tuple[Queue, Queue]) -> list[str]:
    """Each move run whole in turn: 'done', or its refusal's text."""
    out = []
    for src, dst in runs:
        try:
            move_queue(client, src.name, dst.name)
            out.append("done")
        except MoveRefused as exc:
            out.append(str(exc))
    return out


def _settled(client: redis.Redis, *queues: Queue) -> bool:
    """No job left in a `moving` set, no move record nor kept ids left in a config."""
    left = [client.zcard(q.keys.prefix + "moving") for q in queues]
    fields = [f for q in queues for f in map(str, client.hkeys(q.keys.config)) if "move_from:" in f]
    kept = [k for q in queues for k in client.keys(q.keys.prefix + "move_in:*")]
    return left == [0] * len(queues) and not fields and not kept


def test_opposite_runs_both_stopped_between_put_and_finish_can_be_finished(
    client: redis.Redis, ab: tuple[Queue, Queue]
) -> None:
    # Each rerun was refused naming the other as the one to rerun first, until a hand edit. Now
    # a rerun re-sends its own stopped jobs (none is a copy: each was taken from due under the
    # take's MOVE_INCOMING check) before it is refused, which lets the other finish.
    a, b = ab
    ab_run, ba_run = QueueMove(client, a.name, b.name), QueueMove(client, b.name, a.name)
    ab_run.check(skip_schedules=False)
    ba_run.check(skip_schedules=False)  # both pass: neither has taken yet
    x = ab_run.take(ab_run.src[0], ["x"])
    y = ba_run.take(ba_run.src[0], ["y"])
    assert ab_run.put(x) == "c" and ba_run.put(y) == "c"  # then both stopped
    first, *rest = _reruns(client, (a, b), (b, a), (a, b))
    assert rest == ["done", "done"], (first, rest)
    assert first.startswith("1 job(s) of this move's stopped run were re-sent first")
    assert f"stopped move from {b.name!r}" in first
    assert waiting_in(client, "x", a, b) == [b.name] and waiting_in(client, "y", a, b) == [b.name]
    assert _settled(client, a, b)


def test_a_stale_record_forgotten_between_a_runs_take_and_its_put_is_written_again(
    client: redis.Redis, ab: tuple[Queue, Queue]
) -> None:
    # b -> a's check reads a stale a -> b record; a -> b then takes (its moving is busy) and
    # b -> a deletes the value it read: the put writes a new one first, so b stays refused.
    a, b = ab
    field = "move_from:" + a.name
    client.hset(b.keys.config, field, "1-stale")
    m = QueueMove(client, a.name, b.name)
    taken = m.take(m.src[0], ["x"])
    assert b._run(_call("move_done", ["forget", field, "1-stale"])) == 1
    assert m.put(taken) == "c"
    ba = QueueMove(client, b.name, a.name)
    with pytest.raises(MoveRefused, match=a.name):
        ba.take(ba.src[0], ["x", "y"])
    assert waiting_in(client, "x", a, b) == [b.name]
    assert move_queue(client, a.name, b.name).already == 1
    assert move_queue(client, b.name, a.name).moved == 2
    assert waiting_in(client, "x", a, b) == [a.name] and waiting_in(client, "y", a, b) == [a.name]


def test_a_kept_id_left_in_a_partition_of_the_destination_is_deleted_by_the_next_run(
    client: redis.Redis, ab: tuple[Queue, Queue], make_pq: Any
) -> None:
    # The same as the plain case above, into a partitioned destination: the kept ids live in
    # the partition the id routes to, and the next run's check deletes them there.
    a, _ = ab
    dest = make_pq(partitions=3, suffix="-dst")
    m = QueueMove(client, a.name, dest.name)
    assert m.put(m.take(m.src[0], ["x"])) == "c"
    assert int(a._run(_call("move_done", ["done", "", "x"]))) == 1  # cut before the SREM
    (part,) = [q for q in m.dst if client.zscore(q.keys.due, "x") is not None]
    assert client.sismember(part.keys.prefix + "move_in:" + a.name, "x")
    (job,) = [j for j in part.claim("w", limit=10).jobs if j.id == "x"]
    part.complete("x", job.token)
    expire_record(client, part, "x")
    a.enqueue("mvr3.task", job_id="x")
    assert move_queue(client, a.name, dest.name).moved == 1
    assert waiting_in(client, "x", a, *m.dst) == [part.name]


def test_a_new_job_reusing_the_id_of_one_finished_in_the_destination_is_not_deleted(
    client: redis.Redis, ab: tuple[Queue, Queue]
) -> None:
    # x moved and ran in b (its finished record kept there); a new job x of the same task is
    # enqueued in a: the next move must not take it for the one already there.
    a, b = ab
    assert move_queue(client, a.name, b.name).moved == 1
    (job,) = [j for j in b.claim("w", limit=10).jobs if j.id == "x"]
    b.complete("x", job.token)
    a.enqueue("mvr3.task", job_id="x")
    report = move_queue(client, a.name, b.name)
    assert report.already == 0, report.as_dict()
    assert waiting_in(client, "x", a, b) == [a.name]  # a conflict: it stays


def test_a_rerun_after_the_moved_job_finished_there_with_its_record_kept_writes_nothing(
    client: redis.Redis, ab: tuple[Queue, Queue]
) -> None:
    # The other side of the test above: the stopped run's own job (its id kept since its put)
    # is still 'e' against its finished record: not put back into a (it would run twice).
    a, b = ab
    m = QueueMove(client, a.name, b.name)
    assert m.put(m.take(m.src[0], ["x"])) == "c"  # then stopped
    (job,) = [j for j in b.claim("w", limit=10).jobs if j.id == "x"]
    b.complete("x", job.token)
    report = move_queue(client, a.name, b.name)
    assert (report.already, report.moved, report.stays["conflict"]) == (1, 0, 0)
    assert waiting_in(client, "x", a, b) == [] and client.zcard(a.keys.prefix + "moving") == 0


@pytest.mark.parametrize("order", ["a -> b first", "b -> c first"])
def test_a_chain_with_both_runs_stopped_mid_batch_can_be_finished(
    client: redis.Redis, ab: tuple[Queue, Queue], order: str
) -> None:
    # a -> b's rerun was refused while b's `moving` held b -> c's jobs, and b -> c's while b
    # held a -> b's record: each named the other, until a hand edit. Now the first goes (a
    # destination's own moving jobs are no reason to refuse: move_in.lua's 'm' and the kept
    # ids answer for them), and the second re-sends its own before naming the first.
    a, b = ab
    with made_queues(client, "mvr3-c-") as (c,):
        ab_run, bc_run = QueueMove(client, a.name, b.name), QueueMove(client, b.name, c.name)
        ab_run.check(skip_schedules=False)
        bc_run.check(skip_schedules=False)
        y = bc_run.take(bc_run.src[0], ["y"])  # before a -> b's record: not refused
        assert ab_run.put(ab_run.take(ab_run.src[0], ["x"])) == "c"  # then stopped
        assert bc_run.put(y) == "c"  # then stopped
        if order == "a -> b first":
            assert _reruns(client, (a, b), (b, c)) == ["done", "done"]
        else:
            first, *rest = _reruns(client, (b, c), (a, b), (b, c))
            assert rest == ["done", "done"], (first, rest)
            assert first.startswith("1 job(s) of this move's stopped run were re-sent first")
            assert f"stopped move from {a.name!r}" in first
        assert waiting_in(client, "x", a, b, c) == [c.name]
        assert waiting_in(client, "y", a, b, c) == [c.name]
        assert _settled(client, a, b, c)


def test_a_dry_run_of_a_rerun_waiting_on_a_stopped_move_in_says_what_the_real_run_does(
    client: redis.Redis, ab: tuple[Queue, Queue]
) -> None:
    # b -> c stopped after its take (y in b's moving), a -> b stopped after its put (x in b's
    # due and a's moving). b -> c's dry run names what its real run does: y sent, then refused;
    # the real run sends y and takes nothing from b's due (x stays, a -> b's rerun finds it).
    a, b = ab
    with made_queues(client, "mvr3-c-") as (c,):
        bc_run, ab_run = QueueMove(client, b.name, c.name), QueueMove(client, a.name, b.name)
        assert [e.id for e in bc_run.take(bc_run.src[0], ["y"])] == ["y"]  # then stopped
        assert ab_run.put(ab_run.take(ab_run.src[0], ["x"])) == "c"  # then stopped
        with pytest.raises(MoveRefused, match=r"^1 job\(s\) of this move's stopped run would be"):
            move_queue(client, b.name, c.name, dry_run=True)
        assert client.zcard(b.keys.prefix + "moving") == 1 and waiting_in(client, "y", b, c) == []
        with pytest.raises(MoveRefused, match=r"^1 job\(s\) of this move's stopped run were"):
            move_queue(client, b.name, c.name)
        assert waiting_in(client, "y", a, b, c) == [c.name]
        assert waiting_in(client, "x", a, b, c) == [b.name]
        assert client.zcard(b.keys.prefix + "moving") == 0
        assert client.zscore(a.keys.prefix + "moving", "x") is not None


def test_a_partitioned_rerun_sends_every_partitions_jobs_before_it_is_refused(
    client: redis.Redis, make_pq: Any
) -> None:
    # pa -> b stopped after taking from both partitions; z -> pa stopped after its put into
    # one of them. pa -> b's rerun sends the jobs of both partitions' `moving` before it is
    # refused (before any take from due), so z -> pa's rerun can go, then pa -> b's.
    pa = make_pq(partitions=2, suffix="-psrc")
    ids = [pa.enqueue("mvr3.task", {"i": i}) for i in range(8)]
    first = {p: next(i for i in ids if i.startswith(f"p{p}.")) for p in (0, 1)}
    with made_queues(client, "mvr3-b-", "mvr3-z-") as (b, z):
        z.enqueue("mvr3.task", job_id="zz")
        out = QueueMove(client, pa.name, b.name)
        for p in (0, 1):
            assert [e.id for e in out.take(out.src[p], [first[p]])] == [first[p]]  # stopped
        into = QueueMove(client, z.name, pa.name)
        assert into.put(into.take(into.src[0], ["zz"])) == "c"  # then stopped
        (zz_part,) = [q for q in into.dst if client.zscore(q.keys.due, "zz") is not None]
        with pytest.raises(MoveRefused, match=r"^2 job\(s\) of this move's stopped run were"):
            move_queue(client, pa.name, b.name)
        assert sorted(client.zrange(b.keys.due, 0, -1)) == sorted(first.values())
        assert all(client.zcard(p.keys.prefix + "moving") == 0 for p in pa.parts)
        assert waiting_in(client, "zz", z, b, *pa.parts) == [zz_part.name]  # not taken yet
        assert _reruns(client, (z, pa), (pa, b)) == ["done", "done"]
        assert waiting_in(client, "zz", z, b, *pa.parts) == [b.name]
        assert client.zcard(b.keys.due) == 9
        assert _settled(client, b, z, *pa.parts)
