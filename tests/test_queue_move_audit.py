"""Adversarial review of `scheduler queue move` (scheduler/admin/queue_move.py, lua/move_*.lua):
each test names a way a job could be lost, run early or run twice by the move itself."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from scheduler.admin.queue_move import MoveRefused, QueueMove, move_queue
from scheduler.client.queue import Queue
from tests.conftest import delete_queue, new_queue


@pytest.fixture
def queues(client: redis.Redis) -> Iterator[tuple[Queue, Queue, Queue]]:
    made = [new_queue(client, p) for p in ("mva-src-", "mva-one-", "mva-two-")]
    yield made[0], made[1], made[2]
    for q in made:
        delete_queue(client, q)


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
    with redis.Redis.from_url(redis_url) as raw:
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
