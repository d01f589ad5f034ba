"""`scheduler queue move` (scheduler/admin/queue_move.py, lua/move_*.lua): waiting jobs move
between plain and partitioned queues keeping ids, payloads, run times and attempts; what cannot
move stays and is counted; an interrupted move is finished by a rerun, nothing twice."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler import NewerStorage
from scheduler.admin.doctor import check_queue, repair_queue
from scheduler.admin.queue_move import MoveRefused, QueueMove, move_queue
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.queue import Queue
from scheduler.core.errors import BadArgument, CorruptKey
from tests.conftest import delete_queue, dump_queue, new_queue


@pytest.fixture
def src(client: redis.Redis) -> Iterator[Queue]:
    q = new_queue(client, "mv-src-")
    yield q
    delete_queue(client, q)


@pytest.fixture
def dst(client: redis.Redis) -> Iterator[Queue]:
    q = new_queue(client, "mv-dst-")
    yield q
    delete_queue(client, q)


def _fill(q: Queue | PartitionedQueue, n: int) -> dict[str, Any]:
    """n jobs, every other one far in the future; returns id -> payload."""
    made = {}
    for i in range(n):
        payload = {"i": i, "text": "a|b"}
        delay = 10_000_000 if i % 2 else None
        jid = q.enqueue("mv.task", payload, job_id=f"job-{i}", delay_ms=delay, max_attempts=7)
        made[jid] = payload
    return made


def _snapshot(q: Queue | PartitionedQueue, ids: list[str]) -> dict[str, tuple[Any, ...]]:
    out = {}
    for jid in ids:
        j = q.get_job(jid)
        out[jid] = (j.task, j.payload_json, j.fields.get("run_at_ms"), j.attempts, j.max_attempts)
    return out


def test_plain_to_partitioned_keeps_ids_payloads_run_at_and_attempts(
    client: redis.Redis, src: Queue, make_pq: Any
) -> None:
    made = _fill(src, 8)
    # A retry waiting in due: its hash holds attempts 1 and its error.
    src.enqueue("mv.task", {"r": 1}, job_id="retried", max_attempts=3)
    batch = src.claim("w1", limit=10)
    retried = next(j for j in batch.jobs if j.id == "retried")
    for j in batch.jobs:
        if j.id != "retried":
            src.release([(j.id, j.token)])
    src.fail("retried", retried.token, ("E", "boom", ""), delay_ms=10_000_000)
    ids = [*made, "retried"]
    before = _snapshot(src, ids)
    dest = make_pq(partitions=3, suffix="-dst")
    report = move_queue(client, src.name, dest.name, batch=3)
    assert report.moved == 9 and report.already == 0
    assert sum(report.stays.values()) == 0
    assert _snapshot(dest, ids) == before
    assert dest.get_job("retried").attempts == 1
    assert client.zcard(src.keys.due) == 0 and client.zcard(src.keys.prefix + "moving") == 0
    assert all(client.exists(src.keys.job(i), src.keys.spec(i)) == 0 for i in ids)
    # The future ones stay future: only the 4 due at move time (ids job-0, 2, 4, 6) claim.
    claimed = dest.claim("w2", limit=50)
    assert sorted(j.id for j in claimed.jobs) == ["job-0", "job-2", "job-4", "job-6"]
    assert dest.cancel("job-1") == "scheduled"
    assert dest.status("job-3") == "scheduled"


def test_partitioned_to_plain(client: redis.Redis, make_pq: Any, dst: Queue) -> None:
    source = make_pq(partitions=3, suffix="-src")
    ids = [source.enqueue("mv.task", {"n": i}) for i in range(7)]
    before = _snapshot(source, ids)
    report = move_queue(client, source.name, dst.name)
    assert report.moved == 7
    assert _snapshot(dst, ids) == before
    assert all(client.zcard(p.keys.due) == 0 for p in source.parts)
    assert sorted(j.id for j in dst.claim("w", limit=50).jobs) == sorted(ids)


def test_leased_flow_dead_and_schedule_runs_stay_and_are_counted(
    client: redis.Redis, src: Queue, dst: Queue
) -> None:
    src.enqueue("mv.task", job_id="leased-1")
    lease = src.claim("w", limit=1).jobs[0]
    src.enqueue("mv.task", job_id="dead-1", max_attempts=1)
    dead = src.claim("w", limit=1).jobs[0]
    src.fail(dead.id, dead.token, ("E", "x", ""), retryable=False)
    src.enqueue("mv.task", job_id="prio-1", priority=5)
    src.enqueue("mv.task", job_id="child-1", after=["leased-1"])
    src.enqueue("mv.task", job_id="plain-1")
    src.schedule("every-hour", "mv.task", every_ms=3_600_000)
    with pytest.raises(MoveRefused, match="schedule"):
        move_queue(client, src.name, dst.name)
    report = move_queue(client, src.name, dst.name, skip_schedules=True)
    assert report.moved == 1
    assert report.stays == {
        "leased": 1, "held": 1, "flow": 1, "schedule": 1, "dead": 1, "unreadable": 0,
        "conflict": 0, "moving": 0,
    }  # fmt: skip
    assert dst.status("plain-1") == "due"
    for jid in ("leased-1", "dead-1", "prio-1", "child-1"):
        assert client.exists(dst.keys.job(jid), dst.keys.spec(jid)) == 0
    assert src.status("leased-1") == "leased" and src.status("dead-1") == "dead"
    src.complete(lease.id, lease.token)  # the leased one runs once, in SRC
    assert src.status("child-1") == "due"


def test_a_crash_after_step_one_then_a_rerun_moves_each_job_once(
    client: redis.Redis, src: Queue, make_pq: Any
) -> None:
    made = _fill(src, 6)
    dest = make_pq(partitions=2, suffix="-dst")
    m = QueueMove(client, src.name, dest.name)
    taken = m.take(m.src[0], ["job-0", "job-1", "job-2"])  # step 1, then "killed"
    assert [e.id for e in taken] == ["job-0", "job-1", "job-2"]
    assert client.zcard(src.keys.prefix + "moving") == 3
    report = move_queue(client, src.name, dest.name)
    assert report.resumed == 3
    assert client.zcard(src.keys.prefix + "moving") == 0
    every = [j for p in dest.parts for j in client.zrange(p.keys.due, 0, -1)]
    assert sorted(every) == sorted(made)


def test_a_crash_after_step_two_is_finished_without_a_second_copy(
    client: redis.Redis, src: Queue, dst: Queue
) -> None:
    made = _fill(src, 4)
    m = QueueMove(client, src.name, dst.name)
    entries = m.take(m.src[0], sorted(made))
    assert m.put(entries) == "cccc"  # step 2, then "killed" before step 3
    dst_job = dst.claim("w", limit=50).jobs  # DST's worker runs the due ones meanwhile
    for j in dst_job:
        dst.complete(j.id, j.token)
    report = move_queue(client, src.name, dst.name)
    assert report.resumed == 4 and report.already == 4 and report.moved == 0
    assert client.zcard(src.keys.prefix + "moving") == 0
    assert all(client.exists(src.keys.job(i), src.keys.spec(i)) == 0 for i in made)
    assert sorted(client.zrange(dst.keys.due, 0, -1)) == ["job-1", "job-3"]  # not re-added
    assert {dst.status(j.id) for j in dst_job} == {"done"}


def test_a_job_claimed_in_src_before_the_move_runs_once(
    client: redis.Redis, src: Queue, dst: Queue
) -> None:
    src.enqueue("mv.task", job_id="a")
    src.enqueue("mv.task", job_id="b")
    m = QueueMove(client, src.name, dst.name)
    lease = src.claim("w", limit=1).jobs[0]
    entries = m.take(m.src[0], ["a", "b"])
    assert [e.id for e in entries] == [x for x in ("a", "b") if x != lease.id]
    assert src.claim("w", limit=10).jobs == []  # the other one is moving: not due here
    m.put(entries)
    m.finish(m.src[0], [e.id for e in entries])
    src.complete(lease.id, lease.token)
    moved = dst.claim("w", limit=10).jobs
    assert [j.id for j in moved] == [e.id for e in entries]


def test_dry_run_changes_nothing_and_counts(client: redis.Redis, src: Queue, dst: Queue) -> None:
    _fill(src, 5)
    src.enqueue("mv.task", job_id="prio", priority=2)
    before = dump_queue(client, src)
    report = move_queue(client, src.name, dst.name, dry_run=True, batch=2)
    assert report.moved == 5 and report.stays["flow"] == 1
    assert dump_queue(client, src) == before
    assert dump_queue(client, dst) == {}


def test_bad_input_changes_nothing(client: redis.Redis, src: Queue, dst: Queue) -> None:
    _fill(src, 3)
    before = dump_queue(client, src)
    with pytest.raises(BadArgument):
        move_queue(client, src.name, src.name)
    with pytest.raises(BadArgument):
        move_queue(client, src.name, dst.name, batch=0)
    with pytest.raises(MoveRefused, match="no queue"):
        move_queue(client, "mv-missing-queue-x", dst.name)
    client.hset(dst.keys.config, "generation", "99")
    with pytest.raises(NewerStorage):
        move_queue(client, src.name, dst.name)
    assert dump_queue(client, src) == before
    assert list(dump_queue(client, dst)) == [dst.keys.config]


def test_cli_move_json_and_exit_codes(
    client: redis.Redis, redis_url: str, src: Queue, dst: Queue
) -> None:
    _fill(src, 3)
    run = CliRunner().invoke
    base = ["queue", "move", "--url", redis_url, "--from", src.name, "--to", dst.name]
    dry = run(main, [*base, "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output)["moved"] == 3 and json.loads(dry.output)["dry_run"] is True
    done = run(main, [*base, "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["moved"] == 3
    table = run(main, [*base[:-4], "--from", dst.name, "--to", src.name, "--dry-run"])
    assert table.exit_code == 0 and "would move" in table.output, table.output
    again = run(main, base)  # a finished move left no source: the refusal says so, exit 1
    assert again.exit_code == 1 and "nothing left to move" in again.output
    assert "what a finished move answers" in again.output
    same = run(main, ["queue", "move", "--url", redis_url, "--from", dst.name, "--to", dst.name])
    assert same.exit_code == 2
    missing = run(
        main, ["queue", "move", "--url", redis_url, "--from", "mv-nope-x", "--to", dst.name]
    )
    assert missing.exit_code == 1


def test_a_key_edited_by_hand_refuses_with_nothing_written(
    client: redis.Redis, src: Queue, dst: Queue
) -> None:
    _fill(src, 3)
    client.set(dst.keys.due, "x")  # the destination's due is no zset
    before = dump_queue(client, src)
    with pytest.raises(CorruptKey, match="due"):
        move_queue(client, src.name, dst.name)
    assert dump_queue(client, src) == before
    client.delete(dst.keys.due)
    client.set(src.keys.prefix + "moving", "x")  # the source's moving set is no zset
    before = dump_queue(client, src)
    with pytest.raises(CorruptKey, match="moving"):
        move_queue(client, src.name, dst.name)
    assert dump_queue(client, src) == before
    assert dump_queue(client, dst) == {}


def test_doctor_names_an_interrupted_move_and_fix_leaves_its_jobs(
    client: redis.Redis, src: Queue, dst: Queue
) -> None:
    _fill(src, 3)
    m = QueueMove(client, src.name, dst.name)
    m.put(m.take(m.src[0], ["job-0", "job-1"]))  # steps 1 and 2, then "killed"
    found = check_queue(client, src.name)
    assert [i.code for i in found] == ["move-interrupted"]
    repair_queue(client, src.name)  # no orphan: nothing goes back into SRC's due
    assert client.zrange(src.keys.due, 0, -1) == ["job-2"]
    assert move_queue(client, src.name, dst.name).already == 2
    assert check_queue(client, src.name) == []


def test_an_id_the_destination_holds_for_another_job_stays_in_the_source(
    client: redis.Redis, src: Queue, dst: Queue
) -> None:
    src.enqueue("mv.task", {"mine": 1}, job_id="shared-id")
    src.enqueue("mv.task", {"mine": 2}, job_id="other")
    dst.enqueue("mv.other", {"theirs": 1}, job_id="shared-id", delay_ms=5)
    theirs: dict[str, Any] = dump_queue(client, dst)
    report = move_queue(client, src.name, dst.name)
    assert report.moved == 1 and report.stays["conflict"] == 1 and report.already == 0
    assert src.get_job("shared-id").payload_json == '{"mine":1}'  # not lost
    assert client.zrange(src.keys.due, 0, -1) == ["shared-id"]
    assert client.zcard(src.keys.prefix + "moving") == 0
    assert dst.get_job("shared-id").task == "mv.other"
    after = dump_queue(client, dst)
    spec = dst.keys.spec("shared-id")
    assert after[spec] == theirs[spec]  # theirs untouched
    assert client.zscore(dst.keys.due, "shared-id") == dict(theirs[dst.keys.due][1])["shared-id"]


def test_partitioned_to_fewer_partitions_ids_tagged_beyond_n_are_found(
    client: redis.Redis, make_pq: Any
) -> None:
    source = make_pq(partitions=4, suffix="-src")
    dest = make_pq(partitions=2, suffix="-dst")
    ids = [source.enqueue("mv.task", {"n": i}, delay_ms=10_000_000) for i in range(12)]
    assert {i.split(".")[0] for i in ids} == {"p0", "p1", "p2", "p3"}  # p2., p3.: hashed on DST
    assert move_queue(client, source.name, dest.name).moved == 12
    assert {dest.status(i) for i in ids} == {"scheduled"}
    assert [dest.cancel(i) for i in ids] == ["scheduled"] * 12
    assert sum(client.zcard(p.keys.due) for p in source.parts) == 0


def test_a_plain_destination_gets_the_idempotency_key_naming_a_moved_job(
    client: redis.Redis, src: Queue, dst: Queue, make_pq: Any
) -> None:
    jid = src.enqueue("mv.task", {"n": 1}, key="order-7", delay_ms=10_000_000)
    report = move_queue(client, src.name, dst.name)
    assert report.moved == 1 and report.keys == 1
    assert dst.enqueue("mv.task", {"n": 2}, key="order-7") == jid  # the key names the moved job
    assert client.zcard(dst.keys.due) == 1
    pdest = make_pq(partitions=3, suffix="-pdst")
    assert move_queue(client, dst.name, pdest.name).keys == 1  # into every partition
    # A re-sent keyed enqueue routes by the key's text, which the source does not store: each
    # partition holds the key, and the id returned finds the moved job where it routes.
    assert pdest.enqueue("mv.task", {"n": 3}, key="order-7") == jid
    assert sum(client.zcard(p.keys.due) for p in pdest.parts) == 1
    assert pdest.status(jid) == "scheduled"
