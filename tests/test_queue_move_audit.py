"""Adversarial review of `scheduler queue move` (scheduler/admin/queue_move.py, lua/move_*.lua):
each test names a way a job could be lost, run early or run twice by the move itself."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from scheduler.admin.queue_move import MoveRefused, QueueMove, move_queue
from scheduler.client.queue import Queue
from scheduler.core.connection import connect
from scheduler.core.errors import JobNotFound
from tests.fixtures.move_queues import made_queues


@pytest.fixture
def queues(client: redis.Redis) -> Iterator[tuple[Queue, Queue, Queue]]:
    with made_queues(client, "mva-src-", "mva-one-", "mva-two-") as (src, one, two):
        yield src, one, two


def test_a_rerun_to_another_destination_is_refused_while_jobs_wait_in_moving(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    # Interrupted after step 2 into `one`: the jobs are in `one` and in the source's `moving`.
    # A rerun naming `two` would write them there too: each would run twice.
    src, one, two = queues
    for i in range(3):
        src.enqueue("mva.task", {"i": i}, job_id=f"j{i}")
    m = QueueMove(client, src.name, one.name)
    assert m.put(m.take(m.src[0], ["j0", "j1", "j2"])) == "ccc"
    with pytest.raises(MoveRefused, match=one.name):
        move_queue(client, src.name, two.name)
    assert client.zcard(two.keys.due) == 0 and client.zcard(src.keys.prefix + "moving") == 3
    # The same destination finishes it; then the source may go anywhere again.
    report = move_queue(client, src.name, one.name)
    assert report.resumed == 3 and report.already == 3 and report.moved == 0
    src.enqueue("mva.task", job_id="later")
    assert move_queue(client, src.name, two.name).moved == 1
    assert sorted(client.zrange(one.keys.due, 0, -1)) == ["j0", "j1", "j2"]
    assert client.zrange(two.keys.due, 0, -1) == ["later"]


def test_a_record_with_bytes_no_client_can_read_stays_and_is_not_rewritten(
    client: redis.Redis, redis_url: str, queues: tuple[Queue, Queue, Queue]
) -> None:
    # A payload edited by hand into bytes that are not UTF-8: the source's claim parks it
    # ('invalid job: payload'), visibly. The move reads records through a decoding client
    # (backslashreplace): it must not write the text it read, a different payload, elsewhere.
    src, one, _ = queues
    src.enqueue("mva.task", {"v": "MARK"}, job_id="bad")
    src.enqueue("mva.task", {"v": "fine"}, job_id="good")
    with connect(redis_url, decode_responses=False) as raw:
        record = raw.get(src.keys.spec("bad"))
        assert record is not None and b"MARK" in record
        edited = record.replace(b"MARK", b"\xff\xfe")
        raw.set(src.keys.spec("bad"), edited)
        report = move_queue(client, src.name, one.name)
        assert report.moved == 1 and report.stays["unreadable"] == 1
        assert raw.get(src.keys.spec("bad")) == edited  # untouched, still waiting here
        assert client.zscore(src.keys.due, "bad") is not None
        assert raw.exists(one.keys.spec("bad"), one.keys.job("bad")) == 0
    assert client.zrange(one.keys.due, 0, -1) == ["good"]


def test_non_ascii_text_in_a_retried_jobs_hash_arrives_byte_for_byte(
    client: redis.Redis, redis_url: str, queues: tuple[Queue, Queue, Queue]
) -> None:
    # The hash travels as JSON (json.dumps escapes non-ASCII as \\u, an emoji as a surrogate
    # pair) and is decoded by move_in.lua's cjson: the bytes must be the same on both sides.
    src, one, _ = queues
    src.enqueue("mva.task", {"v": "caf\u00e9 \U0001f600"}, job_id="r", max_attempts=3)
    lease = src.claim("w", limit=1).jobs[0]
    src.fail("r", lease.token, ("E", "b\u00e4d \U0001f4a5", ""), delay_ms=10_000_000)
    with connect(redis_url, decode_responses=False) as raw:
        before = raw.hgetall(src.keys.job("r")), raw.get(src.keys.spec("r"))
        assert move_queue(client, src.name, one.name).moved == 1
        assert (raw.hgetall(one.keys.job("r")), raw.get(one.keys.spec("r"))) == before
    assert json.loads(one.get_job("r").payload_json) == {"v": "caf\u00e9 \U0001f600"}


def test_a_due_score_edited_into_no_time_stays_and_does_not_block_its_batch(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    # A due score that is no whole ms (a hand edit): the source's claim parks that job. The
    # move must not take it into `moving` and then have move_in refuse the whole batch: its
    # neighbours would wait in `moving` through every rerun.
    src, one, _ = queues
    for i in range(3):
        src.enqueue("mva.task", job_id=f"j{i}")
    client.zadd(src.keys.due, {"j1": 1234.5})
    for _ in range(2):  # a rerun too
        move_queue(client, src.name, one.name)
    assert sorted(client.zrange(one.keys.due, 0, -1)) == ["j0", "j2"]
    assert client.zcard(src.keys.prefix + "moving") == 0
    assert client.zscore(src.keys.due, "j1") == 1234.5


def test_cancelling_a_retried_job_while_it_is_moving_does_not_say_cancelled_and_run_it(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    src, one, _ = queues
    src.enqueue("mva.task", job_id="r", max_attempts=3)
    lease = src.claim("w", limit=1).jobs[0]
    src.fail("r", lease.token, ("E", "boom", ""), delay_ms=0)  # a retry, due now
    m = QueueMove(client, src.name, one.name)
    entries = m.take(m.src[0], ["r"])
    # While it is in `moving`: not here to cancel (as a never-claimed job there). Before, it
    # answered its state word 'due', read as cancelled, wrote nothing, and the job then ran.
    with pytest.raises(JobNotFound):
        src.cancel("r")
    m.finish(m.src[0], [e.id for e in entries if m.put(entries)])
    assert one.cancel("r") == "due"  # asked where it went: cancelled there
    assert [j.id for j in one.claim("w", limit=5).jobs] == []


def test_a_destination_sleeping_until_a_later_job_is_woken_by_a_due_job_moved_in(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    # A destination worker waits on its wake list until its next due time; a moved job due
    # now must wake it, one due after the destination's head need not.
    src, one, _ = queues
    one.enqueue("mva.task", job_id="head", delay_ms=60_000)
    src.enqueue("mva.task", job_id="late", delay_ms=600_000)
    client.delete(one.keys.wake)
    move_queue(client, src.name, one.name)
    assert client.llen(one.keys.wake) == 0
    src.enqueue("mva.task", job_id="now")
    move_queue(client, src.name, one.name)
    assert client.llen(one.keys.wake) == 1


def test_a_move_into_a_queue_whose_own_move_is_unfinished_is_refused(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    # src -> one stopped after step 2: the jobs are in `one` and in src's `moving`. Moving
    # `one` back into src would find each in src (in `moving`), answer 'e' and delete it from
    # `one`: then it waits only in src's `moving`, where nothing runs it.
    src, one, _ = queues
    src.enqueue("mva.task", job_id="j")
    m = QueueMove(client, src.name, one.name)
    assert m.put(m.take(m.src[0], ["j"])) == "c"
    with pytest.raises(MoveRefused, match=src.name):
        move_queue(client, one.name, src.name)
    assert client.zrange(one.keys.due, 0, -1) == ["j"]
