"""Rolling deploys, this version as the older one: a queue a newer version has taken over
(`config` field `generation` above ours) whose layout moved. Every entry this version has must
refuse it with NewerStorage ("upgrade this one") and write nothing, not misread or convert the
newer keys, nor blame a hand edit (docs/guide/workers.md, "Upgrading")."""

from __future__ import annotations

import re

import pytest
import redis
from click.testing import CliRunner
from starlette.testclient import TestClient

from scheduler import NewerStorage, Queue
from scheduler.cli.main import main
from scheduler.core.keys import STORAGE_GENERATION
from scheduler.dashboard import Auth, create_app
from tests.conftest import delete_queue, dump_queue
from tests.workers.procs import run_worker

NEWER = str(STORAGE_GENERATION + 1)


def _newer_layout(client: redis.Redis, q: Queue, *, due_moved: bool = True) -> None:
    """A queue whose newer version keeps `dead` as a list (this version takes it for an older
    version's dead letters and converts it) and, `due_moved`, `due` as a hash."""
    q.enqueue("echo", {"i": 1})
    client.hset(q.keys.config, "generation", NEWER)
    client.delete(q.keys.dead)
    client.rpush(q.keys.dead, "a", "b", "c")
    if due_moved:
        client.delete(q.keys.due)
        client.hset(q.keys.due, "shard-0", "3")


def test_counts_refuse_a_newer_queue_and_convert_nothing(client: redis.Redis, q: Queue) -> None:
    # counts.lua converts a step of an older dead LIST as it reads: on a newer queue that is a
    # write into a layout it does not know (it converted the newer version's list).
    _newer_layout(client, q, due_moved=False)
    before = dump_queue(client, q)
    with pytest.raises(NewerStorage, match=f"generation={NEWER} .*upgrade this one"):
        q.counts()
    assert dump_queue(client, q) == before
    assert client.type(q.keys.dead) == "list" and client.llen(q.keys.dead) == 3


def test_stats_name_the_newer_version_not_a_hand_edit(
    client: redis.Redis, redis_url: str, q: Queue
) -> None:
    _newer_layout(client, q)
    for args in (["stats", "-q", q.name], ["jobs", "list", "-q", q.name, "--state", "due"]):
        got = CliRunner().invoke(main, [*args, "--url", redis_url])
        assert got.exit_code == 1, got.output
        assert "stored by a newer version" in got.output, got.output
        assert "edited by hand" not in got.output, got.output


def test_a_worker_does_not_start_on_a_newer_layout_and_says_why(
    client: redis.Redis, redis_url: str, q: Queue
) -> None:
    # The start's access check wrote to `due` (a ZREM that changes nothing) before it read the
    # generation: a newer `due` of another type made it 'WRONGTYPE ... (run scheduler doctor)'.
    _newer_layout(client, q)
    before = dump_queue(client, q)
    done = run_worker(redis_url, q.name)
    assert done.returncode == 1, done.stderr
    assert f"queue {q.name!r} is stored by a newer version" in done.stderr, done.stderr
    assert "WRONGTYPE" not in done.stderr
    assert dump_queue(client, q) == before


def test_the_dashboard_names_a_newer_queue_and_shows_the_others(
    client: redis.Redis, q: Queue, queue_name: str
) -> None:
    # Before: the overview showed the newer queue by this version's reading, converting its
    # `dead` LIST; once counts refused, one newer queue made the whole overview a 400.
    _newer_layout(client, q, due_moved=False)
    other = Queue(client, queue_name + "-other")
    other.enqueue("echo", None)
    before = dump_queue(client, q)
    app = create_app(client=client, queues=[q.name, other.name], read_only=True, auth=Auth())
    page = TestClient(app).get("/")
    assert page.status_code == 200, page.text
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.text))
    assert f"queue {q.name}: the queue is stored by a newer version" in text, text
    assert other.name in text
    got = TestClient(app).get(f"/queues/{q.name}")
    assert "stored by a newer version" in got.text and "upgrade this one" in got.text
    assert dump_queue(client, q) == before
    delete_queue(client, other)


def test_schedule_reads_refuse_a_newer_queue(client: redis.Redis, redis_url: str, q: Queue) -> None:
    # Plain reads (HGETALL of each definition), not a script: they listed a newer version's
    # schedules by this version's reading.
    q.schedule("nightly", "echo", cron="0 3 * * *")
    client.hset(q.keys.config, "generation", NEWER)
    for read in (lambda: q.get_schedule("nightly"), q.list_schedules):
        with pytest.raises(NewerStorage, match="stored by a newer version"):
            read()
    got = CliRunner().invoke(main, ["schedules", "list", "--url", redis_url, "-q", q.name])
    assert got.exit_code == 1 and "stored by a newer version" in got.output, got.output
    client.hdel(q.keys.config, "generation")  # taken back: read again
    assert [s.name for s in q.list_schedules()] == ["nightly"]
