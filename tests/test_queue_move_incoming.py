"""A move of queue b onward while a move into b is under way (scheduler/admin/queue_move.py,
lua/move_out.lua): a -> b records `move_from:a` in b's config before each put, and b -> c's
check refused a live record, but only once, at its start. A b -> c run past its check then took
the jobs a -> b put meanwhile and wrote them into c; a -> b, stopped before its finish, wrote
them into b again at its rerun: one job waiting in b and in c, run twice. Each take now
refuses while such a record is there, atomically with the take. And the ids a -> b put are
kept in b (`move_in:a`) until its finish: a rerun no longer writes again a job that ran or was
cancelled in b since and whose record expired."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from scheduler.admin.queue_move import MoveRefused, QueueMove, move_queue
from scheduler.admin.queue_move_check import script_call as _call
from scheduler.client.queue import Queue
from scheduler.core.errors import BadArgument, CorruptKey
from tests.conftest import dump_queue
from tests.fixtures.move_queues import expire_record, made_queues, waiting_in


@pytest.fixture
def abc(client: redis.Redis) -> Iterator[tuple[Queue, Queue, Queue]]:
    with made_queues(client, "mvi-a-", "mvi-b-", "mvi-c-") as (a, b, c):
        a.enqueue("mvi.task", job_id="x")
        for jid in ("b0", "b1", "b2", "b3"):
            b.enqueue("mvi.task", job_id=jid)
        yield a, b, c


def test_a_move_on_past_its_check_is_refused_at_its_next_take(
    client: redis.Redis, abc: tuple[Queue, Queue, Queue]
) -> None:
    a, b, c = abc
    bc = QueueMove(client, b.name, c.name)
    bc.check(skip_schedules=False)  # nothing moves into b yet: passes
    first = bc.take(bc.src[0], ["b0", "b1"])
    assert bc.put(first) == "cc" and bc.finish(bc.src[0], ["b0", "b1"]) == 2
    ab = QueueMove(client, a.name, b.name)
    ab.check(skip_schedules=False)
    assert ab.put(ab.take(ab.src[0], ["x"])) == "c"  # then stopped before its finish
    before = (dump_queue(client, b), dump_queue(client, c))
    with pytest.raises(MoveRefused, match=f"from '{a.name}'.*--from {a.name} --to {b.name}"):
        bc.take(bc.src[0], ["b2", "b3", "x"])
    assert (dump_queue(client, b), dump_queue(client, c)) == before, "nothing taken"
    assert move_queue(client, a.name, b.name).already == 1  # a -> b's rerun first
    assert move_queue(client, b.name, c.name).moved == 3  # then b -> c goes on
    for jid in ("x", "b0", "b1", "b2", "b3"):
        assert waiting_in(client, jid, a, b, c) == [c.name], jid


def test_a_dry_run_reads_past_the_record_and_its_check_still_refuses_a_live_one(
    client: redis.Redis, abc: tuple[Queue, Queue, Queue]
) -> None:
    a, b, c = abc
    ab = QueueMove(client, a.name, b.name)
    assert ab.put(ab.take(ab.src[0], ["x"])) == "c"
    before = (dump_queue(client, b), dump_queue(client, c))
    for dry_run in (True, False):
        with pytest.raises(MoveRefused, match=f"stopped move from '{a.name}'"):
            move_queue(client, b.name, c.name, dry_run=dry_run)
    look = QueueMove(client, b.name, c.name)
    assert [e.id for e in look.take(look.src[0], ["b0"], look=True)] == ["b0"]
    assert (dump_queue(client, b), dump_queue(client, c)) == before


def test_a_record_left_behind_is_deleted_by_a_real_run_not_by_a_dry_run(
    client: redis.Redis, abc: tuple[Queue, Queue, Queue]
) -> None:
    # Its source holds no job moving here (that run ended without clearing it: an older
    # version's, or its end was cut): the take would refuse it forever.
    a, b, c = abc
    field = "move_from:" + a.name
    client.hset(b.keys.config, field, "1")
    assert move_queue(client, b.name, c.name, dry_run=True).moved == 4
    assert client.hget(b.keys.config, field) == "1", "a dry run writes nothing"
    assert move_queue(client, b.name, c.name).moved == 4
    assert client.hget(b.keys.config, field) is None


def test_a_record_written_again_since_it_was_read_is_kept(
    client: redis.Redis, abc: tuple[Queue, Queue, Queue]
) -> None:
    # The run that deletes a left-behind record read it first: a move into b that started
    # since wrote it again (a new value at each put), and that one must stay.
    a, b, _ = abc
    field = "move_from:" + a.name
    client.hset(b.keys.config, field, "1-old")
    forget = _call("move_done", ["forget", field, "1-old"])
    client.hset(b.keys.config, field, "2-new")
    assert b._run(forget) == 0
    assert client.hget(b.keys.config, field) == "2-new"
    assert b._run(_call("move_done", ["forget", field, "2-new"])) == 1
    assert client.hget(b.keys.config, field) is None


def test_each_put_writes_a_value_of_its_own(
    client: redis.Redis, abc: tuple[Queue, Queue, Queue]
) -> None:
    a, b, _ = abc
    a.enqueue("mvi.task", job_id="y")
    ab = QueueMove(client, a.name, b.name)
    seen = set()
    for jid in ("x", "y"):
        ab.put(ab.take(ab.src[0], [jid]))
        seen.add(client.hget(b.keys.config, "move_from:" + a.name))
    assert len(seen) == 2 and None not in seen


def test_forget_refuses_another_field_or_a_config_of_another_type_typed(
    client: redis.Redis, abc: tuple[Queue, Queue, Queue]
) -> None:
    _, b, _ = abc
    client.hset(b.keys.config, "move_to", "c")
    with pytest.raises(BadArgument, match="field=move_to"):
        b._run(_call("move_done", ["forget", "move_to", "c"]))
    assert client.hget(b.keys.config, "move_to") == "c"
    client.delete(b.keys.config)
    client.set(b.keys.config, "junk")
    with pytest.raises(CorruptKey, match="config"):
        b._run(_call("move_done", ["forget", "move_from:a", "1"]))
    assert client.get(b.keys.config) == "junk"
    client.delete(b.keys.config)


def test_a_take_refused_for_a_record_names_the_partitions_key_to_clear(
    client: redis.Redis, abc: tuple[Queue, Queue, Queue]
) -> None:
    _, b, c = abc
    client.hset(b.keys.config, "move_from:", "1")  # a hand edit: no source named
    with pytest.raises(MoveRefused, match="no source name"):
        move_queue(client, b.name, c.name)
    bc = QueueMove(client, b.name, c.name)
    with pytest.raises(MoveRefused, match=f"HDEL {b.keys.config} move_from:"):
        bc.take(bc.src[0], ["b0"])
    assert client.zscore(b.keys.due, "b0") is not None


@pytest.mark.parametrize("then", ["ran", "cancelled"])
def test_a_rerun_after_the_moved_job_ended_there_and_its_record_expired_writes_nothing(
    client: redis.Redis, abc: tuple[Queue, Queue, Queue], then: str
) -> None:
    # a -> b stopped after its put; x ran in b (or was cancelled there) and its record expired;
    # the rerun re-sent x from a's `moving`, b had no trace of it, and x was written again:
    # run twice (or a cancelled job back). b now keeps the ids put until the batch's finish.
    a, b, _ = abc
    ab = QueueMove(client, a.name, b.name)
    assert ab.put(ab.take(ab.src[0], ["x"])) == "c"  # then stopped
    if then == "ran":
        (job,) = [j for j in b.claim("w", limit=10).jobs if j.id == "x"]
        b.complete("x", job.token)
    else:
        assert b.cancel("x") == "due"
    expire_record(client, b, "x")
    report = move_queue(client, a.name, b.name)
    assert (report.moved, report.already, report.resumed) == (0, 1, 1)
    assert waiting_in(client, "x", a, b) == [] and client.exists(b.keys.job("x")) == 0
    assert client.zcard(a.keys.prefix + "moving") == 0


def test_the_ids_kept_are_one_batchs_and_gone_at_the_runs_end(
    client: redis.Redis, abc: tuple[Queue, Queue, Queue]
) -> None:
    a, b, _ = abc
    kept = b.keys.prefix + "move_in:" + a.name
    a.enqueue("mvi.task", job_id="y")
    ab = QueueMove(client, a.name, b.name)
    assert ab.put(ab.take(ab.src[0], ["x", "y"])) == "cc"  # then stopped
    assert sorted(client.smembers(kept)) == ["x", "y"]
    assert move_queue(client, a.name, b.name).already == 2
    assert client.exists(kept) == 0
    # A stale record is forgotten with its ids (that run's source holds nothing moving here).
    client.hset(b.keys.config, "move_from:" + a.name, "1")
    client.sadd(kept, "old")
    move_queue(client, b.name, a.name)
    assert client.exists(kept) == 0 and client.hget(b.keys.config, "move_from:" + a.name) is None


def test_a_kept_ids_key_of_another_type_is_refused_with_nothing_written(
    client: redis.Redis, abc: tuple[Queue, Queue, Queue]
) -> None:
    a, b, _ = abc
    client.set(b.keys.prefix + "move_in:" + a.name, "junk")
    ab = QueueMove(client, a.name, b.name)
    taken = ab.take(ab.src[0], ["x"])
    before = {k: v for k, v in dump_queue(client, b).items() if k != b.keys.config}
    with pytest.raises(CorruptKey, match="move_in:"):
        ab.put(taken)  # its record in config comes first (the put's own check is refused)
    assert {k: v for k, v in dump_queue(client, b).items() if k != b.keys.config} == before
