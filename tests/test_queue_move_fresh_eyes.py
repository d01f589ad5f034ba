"""A fresh-eyes review of `scheduler queue move` (docs/cluster.md, "Outgrowing one Redis"): the
paths an operator hits. Ctrl-C at each step of run(), a server refusing writes (maxmemory) at
the put or the next take, the report after a rerun, and the CLI's table and exit codes."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler.admin.queue_move import MoveRefused, QueueMove, move_queue
from scheduler.cli.main import main
from scheduler.client.queue import Queue
from tests.conftest import delete_queue, dump_queue, new_queue

IDS = ["f0", "f1", "f2", "f3"]
STEPS = ("take", "put", "finish", "close", "carry_keys")


def _lock(q: Queue) -> str:
    return q.keys.prefix + "move_lock"


def _fill(src: Queue) -> None:
    for i, jid in enumerate(IDS):
        src.enqueue("fe.task", {"i": i}, job_id=jid)


@pytest.fixture
def pair(client: redis.Redis) -> Iterator[tuple[Queue, Queue]]:
    src, dst = new_queue(client, "fe-src-"), new_queue(client, "fe-dst-")
    _fill(src)
    yield src, dst
    for q in (src, dst):
        delete_queue(client, q)


def _places(client: redis.Redis, src: Queue, dst: Queue, jid: str) -> list[str]:
    got = [
        ("src due", client.zscore(src.keys.due, jid)),
        ("src moving", client.zscore(src.keys.prefix + "moving", jid)),
        ("dst due", client.zscore(dst.keys.due, jid)),
    ]
    return [where for where, score in got if score is not None]


def _assert_finished(client: redis.Redis, src: Queue, dst: Queue) -> None:
    for jid in IDS:
        assert _places(client, src, dst, jid) == ["dst due"], jid
    assert client.hget(src.keys.config, "move_to") is None
    assert not client.exists(_lock(src))


def _interrupt(
    monkeypatch: pytest.MonkeyPatch, step: str, when: str, exc: BaseException
) -> Callable[[], int]:
    """Raise `exc` at the first call of QueueMove.<step>, before or after the real call."""
    real = getattr(QueueMove, step)
    calls = [0]

    def hooked(self: QueueMove, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1 and when == "before":
            raise exc
        out = real(self, *args, **kwargs)
        if calls[0] == 1:
            raise exc
        return out

    monkeypatch.setattr(QueueMove, step, hooked)
    return lambda: calls[0]


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("step", STEPS)
def test_ctrl_c_at_each_step_releases_the_lock_and_a_rerun_finishes(
    client: redis.Redis,
    pair: tuple[Queue, Queue],
    monkeypatch: pytest.MonkeyPatch,
    step: str,
    when: str,
) -> None:
    src, dst = pair
    for i, jid in enumerate(IDS):  # an idempotency key per job: carry_keys has work
        client.set(src.keys.idem(f"d{i}"), f"{jid} 0", px=600_000)
    calls = _interrupt(monkeypatch, step, when, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        move_queue(client, src.name, dst.name, batch=2)
    assert calls() == 1
    assert not client.exists(_lock(src)), "the lock outlived the interrupted run"
    for jid in IDS:  # in one due at most, and somewhere
        places = _places(client, src, dst, jid)
        assert places and places.count("src due") + places.count("dst due") <= 1, (jid, places)
    monkeypatch.undo()
    if (step, when) == ("close", "after"):  # the move was over: its source is empty
        with pytest.raises(MoveRefused, match="nothing left to move"):
            move_queue(client, src.name, dst.name, batch=2)
        _assert_finished(client, src, dst)
        return
    report = move_queue(client, src.name, dst.name, batch=2)  # at once: no lease to wait out
    _assert_finished(client, src, dst)
    assert report.moved + report.already <= len(IDS)
    assert report.stays == dict.fromkeys(report.stays, 0)


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), redis.ConnectionError("gone")])
def test_an_error_while_taking_a_partitioned_sources_locks_leaves_none(
    client: redis.Redis,
    pair: tuple[Queue, Queue],
    monkeypatch: pytest.MonkeyPatch,
    make_pq: Any,
    exc: BaseException,
) -> None:
    _, dst = pair
    source = make_pq(partitions=2, suffix="-fe")
    for i in range(6):
        source.enqueue("fe.task", {"i": i})
    run = QueueMove(client, source.name, dst.name)
    locks = [_lock(p) for p in run.src]
    real_set, seen = client.set, []

    def set_(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.endswith("move_lock"):
            seen.append(name)
            if len(seen) == 2:  # the first partition's lock is taken, the second's fails
                raise exc
        return real_set(name, *args, **kwargs)

    monkeypatch.setattr(client, "set", set_)
    with pytest.raises(type(exc)):
        run.run()
    monkeypatch.undo()
    assert len(seen) == 2
    assert [k for k in locks if client.exists(k)] == [], "a partition's lock was left"
    report = move_queue(client, source.name, dst.name)  # at once, not a lease later
    assert report.moved == 6


def test_a_conflict_resumed_from_moving_is_counted_once(
    client: redis.Redis, pair: tuple[Queue, Queue]
) -> None:
    src, dst = pair
    dst.enqueue("fe.other", {}, job_id="f0")  # the destination's own job under that id
    stopped = QueueMove(client, src.name, dst.name)
    assert [e.id for e in stopped.take(stopped.src[0], ["f0"])] == ["f0"]  # then Ctrl-C
    report = move_queue(client, src.name, dst.name)
    assert report.resumed == 1
    assert report.stays["conflict"] == 1, report.stays  # one job: one conflict
    assert report.moved == 3
    assert client.zscore(src.keys.due, "f0") is not None
    again = move_queue(client, src.name, dst.name)
    assert (again.moved, again.resumed, again.stays["conflict"]) == (0, 0, 1)


def test_the_table_of_a_rerun_shows_the_jobs_the_destination_already_had(
    client: redis.Redis, pair: tuple[Queue, Queue], redis_url: str
) -> None:
    src, dst = pair
    stopped = QueueMove(client, src.name, dst.name)
    assert stopped.put(stopped.take(stopped.src[0], IDS)) == "cccc"  # then Ctrl-C
    args = ["queue", "move", "--url", redis_url, "--from", src.name, "--to", dst.name]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    assert "moved" in out.output and "resumed" in out.output
    assert "already" in out.output, out.output  # else 4 resumed, 0 moved and no word where
    _assert_finished(client, src, dst)


@pytest.fixture
def oom_pair(module_server: Any, private: redis.Redis) -> Iterator[tuple[Queue, Queue, str]]:
    src, dst = Queue(private, "fe-oom-src"), Queue(private, "fe-oom-dst")
    _fill(src)
    private.config_set("maxmemory-policy", "noeviction")
    yield src, dst, module_server.url
    private.config_set("maxmemory", 0)


@pytest.mark.parametrize("step", ["put", "take"])
def test_a_server_out_of_memory_mid_run_exits_3_and_a_rerun_finishes(
    private: redis.Redis,
    oom_pair: tuple[Queue, Queue, str],
    monkeypatch: pytest.MonkeyPatch,
    step: str,
) -> None:
    src, dst, url = oom_pair
    real, calls = getattr(QueueMove, step), [0]

    def hooked(self: QueueMove, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 2:  # the second batch's take or put: the first batch is done
            private.config_set("maxmemory", 1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(QueueMove, step, hooked)
    args = ["queue", "move", "--url", url, "--from", src.name, "--to", dst.name, "--batch", "2"]
    out = CliRunner().invoke(main, args)
    private.config_set("maxmemory", 0)
    assert out.exit_code == 3, out.output
    assert "maxmemory" in out.output
    assert not private.exists(_lock(src)), "the lock outlived the refused run"
    for jid in IDS:
        places = _places(private, src, dst, jid)
        assert places and places.count("src due") + places.count("dst due") <= 1, (jid, places)
    monkeypatch.undo()
    out = CliRunner().invoke(main, [*args, "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert report["moved"] + report["already"] == 2
    _assert_finished(private, src, dst)


def test_a_paused_destination_gets_the_jobs_and_stays_paused(
    client: redis.Redis, pair: tuple[Queue, Queue]
) -> None:
    src, dst = pair
    dst.pause()
    report = move_queue(client, src.name, dst.name)
    assert report.moved == 4
    _assert_finished(client, src, dst)
    assert dst.claim("w", lease_ms=1000).jobs == []  # still paused: nothing runs until resumed


def test_ctrl_c_in_the_cli_says_to_run_it_again(
    client: redis.Redis,
    pair: tuple[Queue, Queue],
    monkeypatch: pytest.MonkeyPatch,
    redis_url: str,
) -> None:
    src, dst = pair
    _interrupt(monkeypatch, "put", "before", KeyboardInterrupt())
    args = ["queue", "move", "--url", redis_url, "--from", src.name, "--to", dst.name]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 1, out.output
    assert "interrupted" in out.output and "run the same command again" in out.output, out.output
    assert not client.exists(_lock(src))
    monkeypatch.undo()
    assert CliRunner().invoke(main, args).exit_code == 0
    _assert_finished(client, src, dst)


@pytest.mark.parametrize("step", ["take", "put", "finish"])
def test_ctrl_c_mid_partitioned_move_then_a_rerun_finishes(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch, make_pq: Any, step: str
) -> None:
    source, dest = make_pq(partitions=3, suffix="-fs"), make_pq(partitions=2, suffix="-fd")
    ids = [source.enqueue("fe.task", {"i": i}) for i in range(12)]
    real, calls = getattr(QueueMove, step), [0]

    def hooked(self: QueueMove, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        out = real(self, *args, **kwargs)
        if calls[0] == 3:  # well into the run: a part done, one under way
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(QueueMove, step, hooked)
    with pytest.raises(KeyboardInterrupt):
        move_queue(client, source.name, dest.name, batch=2)
    monkeypatch.undo()
    assert not [p for p in source.parts if client.exists(_lock(p))]
    report = move_queue(client, source.name, dest.name, batch=2)
    assert report.stays == dict.fromkeys(report.stays, 0)
    for jid in ids:
        homes = [p.name for p in (*source.parts, *dest.parts) if client.zscore(p.keys.due, jid)]
        assert homes == [dest.part_of(jid).name], (jid, homes)
    for p in source.parts:
        assert not client.exists(p.keys.prefix + "moving")
        assert client.hget(p.keys.config, "move_to") is None


def test_a_partition_and_its_partitioned_queue_are_the_same_queue(
    client: redis.Redis, make_pq: Any, redis_url: str
) -> None:
    pq = make_pq(partitions=2, suffix="-fp")
    for i in range(4):
        pq.enqueue("fe.task", {"i": i})
    before = {p.name: dump_queue(client, p) for p in pq.parts}
    for a, b in ((pq.parts[1].name, pq.name), (pq.name, pq.parts[0].name)):
        args = ["queue", "move", "--url", redis_url, "--from", a, "--to", b]
        out = CliRunner().invoke(main, args)
        assert out.exit_code == 2 and "same queue" in out.output, out.output
    assert {p.name: dump_queue(client, p) for p in pq.parts} == before


def test_a_partition_of_a_partitioned_queue_is_no_destination(
    client: redis.Redis, pair: tuple[Queue, Queue], make_pq: Any, redis_url: str
) -> None:
    """`--to emails.p0.2` wrote every job into that one partition, whatever partition its id
    routes to (a partitioned queue's calls by id look there first): refused, usage, nothing
    written; the partitioned queue itself is the destination."""
    src, _ = pair
    pq = make_pq(partitions=2, suffix="-fd")
    before = (dump_queue(client, src), [dump_queue(client, p) for p in pq.parts])
    args = ["queue", "move", "--url", redis_url, "--from", src.name, "--to", pq.parts[0].name]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 2 and f"--to {pq.name}" in out.output, out.output
    assert (dump_queue(client, src), [dump_queue(client, p) for p in pq.parts]) == before


def test_a_dry_run_after_a_stop_counts_the_moving_jobs_as_resumed_alone(
    client: redis.Redis, pair: tuple[Queue, Queue]
) -> None:
    src, dst = pair
    stopped = QueueMove(client, src.name, dst.name)
    assert stopped.put(stopped.take(stopped.src[0], IDS[:1])) == "c"  # then Ctrl-C
    stopped.take(stopped.src[0], IDS[1:2])  # and one taken, not yet put
    dry = move_queue(client, src.name, dst.name, dry_run=True)
    assert (dry.moved, dry.resumed, dry.already) == (2, 2, 0)  # docs/cluster.md
    real = move_queue(client, src.name, dst.name)
    assert (real.moved, real.resumed, real.already) == (3, 2, 1)
    _assert_finished(client, src, dst)


def test_moving_the_destination_on_before_a_stopped_move_into_it_is_rerun(
    client: redis.Redis, pair: tuple[Queue, Queue], redis_url: str
) -> None:
    """a -> b stopped after its put; b -> c would move the job on, and a -> b's rerun then
    wrote it into b again: waiting in b and in c, run twice. b -> c is refused until then."""
    src, dst = pair
    third = new_queue(client, "fe-third-")
    try:
        stopped = QueueMove(client, src.name, dst.name)
        assert stopped.put(stopped.take(stopped.src[0], ["f0"])) == "c"  # then Ctrl-C
        before = (dump_queue(client, dst), dump_queue(client, third))
        for dry_run in (True, False):
            with pytest.raises(MoveRefused, match=f"stopped move from '{src.name}'"):
                move_queue(client, dst.name, third.name, dry_run=dry_run)
        args = ["queue", "move", "--url", redis_url, "--from", dst.name, "--to", third.name]
        out = CliRunner().invoke(main, args)
        assert out.exit_code == 1 and f"--from {src.name} --to {dst.name}" in out.output
        assert (dump_queue(client, dst), dump_queue(client, third)) == before
        assert move_queue(client, src.name, dst.name).already == 1  # the rerun first
        fields = [str(f) for f in client.hkeys(dst.keys.config)]
        left = [f for f in fields if not f.startswith("move_epoch:")]  # the fencing epoch stays
        assert left == [], "the run's end clears its record"
        assert move_queue(client, dst.name, third.name).moved == 4  # then on
        for jid in IDS:
            homes = [q.name for q in (src, dst, third) if client.zscore(q.keys.due, jid)]
            assert homes == [third.name], (jid, homes)
    finally:
        delete_queue(client, third)


def test_a_stale_or_edited_incoming_record(client: redis.Redis, pair: tuple[Queue, Queue]) -> None:
    src, dst = pair
    third = new_queue(client, "fe-third-")
    try:
        move_queue(client, src.name, dst.name)
        # a record whose source holds no job moving here (its run ended without clearing it)
        client.hset(dst.keys.config, "move_from:" + src.name, "1")
        client.hset(dst.keys.config, "move_from:fe-gone-queue", "1")
        assert move_queue(client, dst.name, third.name, dry_run=True).moved == 4
        client.hset(dst.keys.config, "move_from:not a name!", "1")  # a hand edit
        with pytest.raises(MoveRefused, match="HDEL"):
            move_queue(client, dst.name, third.name)
    finally:
        delete_queue(client, third)
