"""A server that refuses writes for now (min-replicas-to-write with no replica: NOREPLICAS on
every write; maxmemory reached: OOM on a script's first write). Every mutating call says so with
Redis's own error, which the worker and the dashboard take as "for now" (`refused_for_now`),
and changes nothing. Before, `pause` / `resume` reported the refusal as a corrupt `config` key
("edited by hand"), sending an operator to `scheduler doctor` for a full server.
A private server: these tests reconfigure it."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from redis.exceptions import OutOfMemoryError, ResponseError, TryAgainError
from starlette.testclient import TestClient

from scheduler import JobSpec, Queue
from scheduler._spawn import RedisProcess
from scheduler.cli.main import main
from scheduler.core.errors import SchedulerError, refused_for_now
from scheduler.dashboard import Auth, create_app
from scheduler.dashboard.store import Store
from scheduler.worker.execution import classify
from tests.conftest import dump_queue


@pytest.fixture
def server(module_server: RedisProcess) -> Iterator[RedisProcess]:
    module_server.client().flushall()
    yield module_server
    off = module_server.client()
    off.config_set("min-replicas-to-write", 0)
    off.config_set("maxmemory", 0)


def _state(server: RedisProcess) -> tuple[Queue, dict[str, Any]]:
    """A queue with something for every mutating call to do: a leased job, a waiting one, a
    dead one, a due one, a schedule."""
    q = Queue.from_url(server.url, "m")
    leased_id = q.enqueue("t", {"a": 1})
    dead_id = q.enqueue("t", {"a": 2}, max_attempts=1)
    batch = q.claim("w1", limit=2, lease_ms=60_000).jobs
    by_id = {j.id: j for j in batch}
    q.fail(dead_id, by_id[dead_id].token, RuntimeError("boom"))
    return q, {
        "leased": by_id[leased_id],
        "dead": dead_id,
        "later": q.enqueue("t", {"a": 3}, delay_ms=600_000),
        "due": q.enqueue("t", {"a": 4}),
        "schedule": q.schedule("nightly", "t", {}, cron="0 3 * * *"),
    }


def _calls(q: Queue, s: dict[str, Any]) -> dict[str, Callable[[], object]]:
    job = s["leased"]
    return {
        "enqueue": lambda: q.enqueue("t", {"b": 1}, key="k1"),
        "enqueue_many": lambda: q.enqueue_many([JobSpec("t", {"c": i}) for i in range(3)]),
        "claim": lambda: q.claim("w2", limit=1, lease_ms=1_000),
        "heartbeat": lambda: q.heartbeat([(job.id, job.token)], lease_ms=60_000),
        "complete": lambda: q.complete(job.id, job.token, {"ok": 1}),
        "fail": lambda: q.fail(job.id, job.token, RuntimeError("x")),
        "release": lambda: q.release([(job.id, job.token)]),
        "cancel": lambda: q.cancel(s["later"]),
        "reschedule": lambda: q.reschedule(s["later"], delay_ms=0),
        "requeue_dead": lambda: q.requeue_dead([s["dead"]]),
        "purge_dead": lambda: q.purge_dead([s["dead"]]),
        "set_dead_retention": lambda: q.set_dead_retention(max_age_ms=3_600_000),
        "pause": q.pause,
        "schedule": lambda: q.schedule("hourly", "t", {}, cron="0 * * * *"),
        "pause_schedule": lambda: q.pause_schedule("nightly"),
        "remove_schedule": lambda: q.remove_schedule("nightly"),
    }


def test_every_write_refused_for_now_raises_redis_own_error_and_changes_nothing(
    server: RedisProcess,
) -> None:
    q, s = _state(server)
    raw = server.client()
    before = dump_queue(raw, q)
    raw.config_set("min-replicas-to-write", 1)  # no replica: every write refused
    seen: dict[str, str] = {}
    for name, call in _calls(q, s).items():
        with pytest.raises(ResponseError) as caught:
            call()
        assert not isinstance(caught.value, SchedulerError), (name, caught.value)
        assert refused_for_now(caught.value), (name, caught.value)
        seen[name] = str(caught.value).split(" ", 1)[0]
    assert set(seen.values()) == {"NOREPLICAS"}, seen
    raw.config_set("min-replicas-to-write", 0)
    assert dump_queue(raw, q) == before
    # resume, of a paused queue (pause was refused above: pause it for real first).
    assert q.pause() == "paused"
    paused = dump_queue(raw, q)
    raw.config_set("min-replicas-to-write", 1)
    with pytest.raises(ResponseError, match=r"^NOREPLICAS") as refused:
        q.resume()
    assert not isinstance(refused.value, SchedulerError)
    raw.config_set("min-replicas-to-write", 0)
    assert dump_queue(raw, q) == paused
    assert q.resume() == "resumed"


def test_pause_refused_at_maxmemory_is_an_oom_not_a_corrupt_key(server: RedisProcess) -> None:
    q = Queue.from_url(server.url, "m")
    q.enqueue("t", {"a": 1})
    raw = server.client()
    raw.config_set("maxmemory", 1)
    with pytest.raises(OutOfMemoryError):
        q.pause()
    raw.config_set("maxmemory", 0)
    assert q.counts().paused is False
    assert q.pause() == "paused"


def test_dashboard_answers_503_when_redis_refuses_an_action_for_now(
    server: RedisProcess,
) -> None:
    Queue.from_url(server.url, "mail").enqueue("send", {"to": "a"})
    with TestClient(create_app(url=server.url, auth=Auth())) as web:
        page = web.get("/queues/mail")
        m = re.search(r'name="csrf" value="([0-9a-f]{64})"', page.text)
        assert m is not None
        raw = server.client()
        raw.config_set("min-replicas-to-write", 1)
        assert web.get("/queues/mail").status_code == 200  # reads go on
        acted = web.post("/queues/mail/pause", data={"csrf": m.group(1)},
                         headers={"Origin": "http://testserver"})  # fmt: skip
        raw.config_set("min-replicas-to-write", 0)
        assert acted.status_code == 503, acted.text
        assert "Redis busy" in acted.text and "NOREPLICAS" in acted.text
        assert "changed nothing" in acted.text
        assert Queue.from_url(server.url, "mail").counts().paused is False


def test_dashboard_lists_a_queue_whose_slot_is_moving_and_shows_the_others(
    server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TRYAGAIN (its slot being resharded) on one queue's read: the overview shows the other
    queues and names that one; any other Redis error on a read stays a 500."""
    for name in ("a", "b"):
        Queue.from_url(server.url, name).enqueue("t", {})
    real = Store.queue_summary
    error: list[Exception] = [TryAgainError("Multiple keys request during rehashing of slot")]

    def summary(self: Store, name: str) -> dict[str, Any]:
        if name == "b":
            raise error[0]
        return real(self, name)

    monkeypatch.setattr(Store, "queue_summary", summary)
    with TestClient(create_app(url=server.url, auth=Auth()), raise_server_exceptions=False) as web:
        got = web.get("/api/overview").json()
        assert [row["queue"] for row in got["queues"]] == ["a"]
        assert len(got["unreachable"]) == 1 and got["unreachable"][0].startswith("queue b:")
        page = web.get("/")
        assert page.status_code == 200 and "queue b:" in page.text
        error[0] = ResponseError("ERR something else")
        assert web.get("/").status_code == 500


def test_refused_for_now_tells_a_refusal_from_a_bug() -> None:
    codes = ("BUSY", "MISCONF", "LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY")
    for text in [f"{code} detail" for code in (*codes, "NOREPLICAS", "OOM")]:
        assert refused_for_now(ResponseError(text)), text
    for text in ("ERR unknown command", "WRONGTYPE Operation", "NOSCRIPT No matching script"):
        assert not refused_for_now(ResponseError(text)), text
    assert refused_for_now(redis.exceptions.ReadOnlyError("You can't write"))


def test_a_script_killed_by_script_kill_is_refused_for_now(server: RedisProcess) -> None:
    """SCRIPT KILL ends only a script that has written nothing (else UNKILLABLE): the call
    changed nothing and can be sent again. Its caller read it as a bug (a worker whose claim
    or report an operator killed stopped with exit 5, which supervisors do not restart; the
    CLI said exit 1)."""
    admin = server.client()
    admin.config_set("busy-reply-threshold", 50)
    got: list[redis.ResponseError] = []

    def spin() -> None:
        try:
            server.client().eval("while true do end", 0)
        except redis.ResponseError as exc:
            got.append(exc)

    t = threading.Thread(target=spin)
    t.start()
    try:
        while True:
            try:
                admin.script_kill()
                break
            except redis.ResponseError as exc:  # NOTBUSY until the script is slow enough
                assert str(exc).startswith("NOTBUSY"), exc
    finally:
        t.join(30)
        admin.config_set("busy-reply-threshold", 5000)
    [killed] = got
    assert refused_for_now(killed)
    assert classify(killed) == "transient"
    assert not refused_for_now(ResponseError("Error running script: user_script:1: x"))


def test_cli_exits_3_when_redis_refuses_for_now(server: RedisProcess) -> None:
    """Exit 3 (try again), the refusal named; it was exit 1, "a refusal", like a typo."""
    Queue.from_url(server.url, "m").enqueue("t", {})
    raw = server.client()
    raw.config_set("min-replicas-to-write", 1)
    try:
        for args in (["pause"], ["enqueue", "t"], ["dead", "purge", "--yes"]):
            got = CliRunner().invoke(main, [*args, "--url", server.url, "-q", "m"])
            if args[0] == "dead":  # nothing dead: nothing to write, nothing refused
                assert got.exit_code == 0, got.output
                continue
            assert got.exit_code == 3, (args, got.output)
            assert "Redis refused the command for now: NOREPLICAS" in got.stderr
    finally:
        raw.config_set("min-replicas-to-write", 0)
    assert Queue.from_url(server.url, "m").counts().due == 1


def test_stats_and_keys_exit_3_while_a_slot_moves(
    server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reshard on a cluster: `stats` shows the moving queue's row as refused for now and the
    others (exit 3: it exited 1, as for damaged data); a command meeting redis-py's own cluster
    error (its slot map being rebuilt: "TTL exhausted") exits 3 with one line (`keys` ended in
    a traceback, an audit found)."""
    from redis.exceptions import ClusterError, RedisClusterException

    from scheduler.cli import admin, keys

    for name in ("a", "b"):
        Queue.from_url(server.url, name).enqueue("t", {})
    real = admin.queue_stats

    def moving(client: Any, name: str) -> dict[str, Any]:
        if name == "b":
            raise TryAgainError("Multiple keys request during rehashing of slot")
        return real(client, name)

    monkeypatch.setattr(admin, "queue_stats", moving)
    got = CliRunner().invoke(main, ["stats", "--url", server.url, "--json"])
    assert got.exit_code == 3, got.output
    rows = {r["queue"]: r for r in json.loads(got.stdout)["queues"]}
    assert rows["a"]["error"] is None and rows["b"]["down"] is True
    assert "hash slot is being migrated" in rows["b"]["error"]  # was "Redis refused for now"

    def remapping(client: Any, queue: str) -> Any:
        raise ClusterError("TTL exhausted.")

    monkeypatch.setattr(keys, "stored_layout", remapping)
    got = CliRunner().invoke(main, ["keys", "--url", server.url, "-q", "a"])
    assert got.exit_code == 3 and "TTL exhausted" in got.stderr, got.output
    assert got.exception is None or isinstance(got.exception, SystemExit)

    def bug(client: Any, queue: str) -> Any:
        raise RedisClusterException("Invalid args in command")  # ours, not the cluster's

    monkeypatch.setattr(keys, "stored_layout", bug)
    got = CliRunner().invoke(main, ["keys", "--url", server.url, "-q", "a"])
    assert isinstance(got.exception, RedisClusterException), got.output  # not "unreachable"


def test_the_overview_shows_a_partitioned_queue_whose_one_partition_is_moving(
    server: RedisProcess,
) -> None:
    """One partition of a partitioned queue refused for now (its slot being resharded): the
    overview shows the queue with the other partitions' counts and names that partition; the
    whole queue's row was dropped (an audit, on a cluster: 25 s without it for 1 of 6)."""
    from scheduler.client.partitioned import PartitionedQueue
    from scheduler.operations.requests import Commands

    pq = PartitionedQueue.create(server.client(), "pq", partitions=3)
    for i in range(30):
        pq.enqueue("t", {"n": i}, key=f"k{i}")
    app = create_app(url=server.url, auth=Auth())
    with TestClient(app) as web:
        before = {r["queue"]: r for r in web.get("/api/overview").json()["queues"]}
        assert before["pq"]["due"] == 30 and before["pq"]["unread_partitions"] == []
        moving = app.store.view("pq").parts[1]

        def refused() -> Any:
            yield Commands([("PING",)])
            raise TryAgainError("Multiple keys request during rehashing of slot")

        moving.ops.counts = refused  # type: ignore[method-assign]
        got = web.get("/api/overview").json()
        row = {r["queue"]: r for r in got["queues"]}["pq"]
        assert 0 < row["due"] < 30  # the two partitions that answered
        why = "its hash slot is being migrated to another Redis Cluster node (TRYAGAIN)"
        assert row["unread_partitions"] == [
            f"partition {moving.name}: {why}: run the command again once the move is done"
        ]
        assert any(moving.name in u for u in got["unreachable"]), got["unreachable"]
