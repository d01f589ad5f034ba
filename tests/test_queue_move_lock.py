"""The run lock of `scheduler queue move` (scheduler/admin/queue_move_lock.py, lua/move_out.lua,
lua/move_done.lua 'renew' / 'unlock'): one run of a source at a time. A second run is refused
before any write and told who holds the lock; a crashed run's lock blocks a rerun until its
lease ends; a run that lost its lock stops before its next take."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler.admin import queue_move_keys
from scheduler.admin.doctor import check_queue
from scheduler.admin.queue_move import Entry, MoveRefused, QueueMove, move_queue
from scheduler.admin.queue_move_check import script_call as _call
from scheduler.cli.main import main
from scheduler.client.queue import Queue
from scheduler.core.errors import BadArgument
from tests.conftest import dump_queue
from tests.fixtures.move_queues import made_queues
from tests.workers.procs import wait_for

IDS = ["j0", "j1", "j2", "j3"]


@pytest.fixture
def queues(client: redis.Redis) -> Iterator[tuple[Queue, Queue, Queue]]:
    with made_queues(client, "mvl-src-", "mvl-one-", "mvl-two-") as (src, one, two):
        for i, jid in enumerate(IDS):
            src.enqueue("mvl.task", {"i": i}, job_id=jid)
        yield src, one, two


def _lock(q: Queue) -> str:
    return q.keys.prefix + "move_lock"


def _held_by_hand(client: redis.Redis, q: Queue, px: int = 60_000) -> None:
    """A lock as another run writes it (another host's run, or one that crashed)."""
    info = {"token": "t" * 32, "host": "elsewhere-host", "pid": 4242, "started_ms": 1}
    client.set(_lock(q), json.dumps({**info, "lease_ms": 60_000}), px=px)


def _on_put(
    monkeypatch: pytest.MonkeyPatch, run: QueueMove, hook: Callable[[int], None]
) -> list[int]:
    """Call hook(batch number) inside each of `run`'s puts, before it writes: `run` is then
    between its take and its put."""
    calls: list[int] = []
    real = run.put

    def put(entries: list[Entry]) -> str:
        calls.append(len(calls))
        hook(calls[-1])
        return real(entries)

    monkeypatch.setattr(run, "put", put)
    return calls


def _until(cond: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    wait_for(cond, timeout_s, what)


@pytest.mark.parametrize("other", ["same", "different"])
def test_a_second_run_is_refused_before_any_write_while_the_first_is_between_steps(
    client: redis.Redis,
    queues: tuple[Queue, Queue, Queue],
    monkeypatch: pytest.MonkeyPatch,
    other: str,
) -> None:
    src, one, two = queues
    dest = one if other == "same" else two
    a = QueueMove(client, src.name, one.name, batch=2)
    said: list[str] = []

    def second_run(_: int) -> None:
        before = [dump_queue(client, q) for q in queues]
        with pytest.raises(MoveRefused, match="another move of queue") as refused:
            move_queue(client, src.name, dest.name)
        said.append(str(refused.value))
        assert [dump_queue(client, q) for q in queues] == before

    calls = _on_put(monkeypatch, a, second_run)
    assert a.run().moved == 4 and len(calls) == 2
    assert f"pid {os.getpid()}" in said[0]
    assert "last renewed" in said[0] and "expires in" in said[0]
    assert client.exists(_lock(src)) == 0  # released at the run's end
    assert sorted(client.zrange(one.keys.due, 0, -1)) == IDS


def test_the_lock_is_renewed_between_batches(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, one, _ = queues
    a = QueueMove(client, src.name, one.name, batch=1, lease_ms=60_000)
    ttls: list[int] = []

    def shorten(_: int) -> None:
        ttls.append(int(client.pttl(_lock(src))))
        client.pexpire(_lock(src), 5_000)  # the next batch's renewal sets the lease again

    _on_put(monkeypatch, a, shorten)
    assert a.run().moved == 4
    assert len(ttls) == 4 and all(t > 5_000 for t in ttls)


def test_a_crashed_runs_lock_blocks_a_rerun_until_its_lease_ends(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, one, _ = queues
    a = QueueMove(client, src.name, one.name, batch=2, lease_ms=1_500)

    class Killed(BaseException):
        pass

    def kill(_: int) -> None:
        raise Killed

    _on_put(monkeypatch, a, kill)
    monkeypatch.setattr(a.lock, "release", lambda **_: None)  # killed: its end never runs
    with pytest.raises(Killed):
        a.run()
    assert client.zcard(src.keys.prefix + "moving") == 2
    before = dump_queue(client, src)
    with pytest.raises(MoveRefused, match="another move of queue"):
        move_queue(client, src.name, one.name)
    with pytest.raises(MoveRefused, match="another move of queue"):
        move_queue(client, src.name, one.name, dry_run=True)
    assert dump_queue(client, src) == before and dump_queue(client, one) == {}
    _until(lambda: client.exists(_lock(src)) == 0, "the crashed run's lock to expire")
    report = move_queue(client, src.name, one.name)
    assert (report.moved, report.resumed) == (4, 2)


def test_a_lock_left_by_another_host_refuses_a_run_and_its_dry_run(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    src, one, _ = queues
    _held_by_hand(client, src)
    before = dump_queue(client, src)
    for dry_run in (False, True):
        with pytest.raises(MoveRefused, match="elsewhere-host, pid 4242"):
            move_queue(client, src.name, one.name, dry_run=dry_run)
    assert dump_queue(client, src) == before and dump_queue(client, one) == {}
    client.persist(_lock(src))  # a hand edit: it would keep every run out for good
    with pytest.raises(MoveRefused, match="never expires: no expiry set; delete it"):
        move_queue(client, src.name, one.name)


def test_a_run_whose_lock_was_taken_over_stops_before_its_next_write(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A paused past its lease (GC, a stopped laptop); B took the lock. A's next step refuses.
    src, one, _ = queues
    a = QueueMove(client, src.name, one.name, batch=2)
    _on_put(monkeypatch, a, lambda _: _held_by_hand(client, src))
    with pytest.raises(MoveRefused, match=r"lost its lock .*elsewhere-host"):
        a.run()
    assert dump_queue(client, one) == {}  # its put wrote nothing
    assert client.zcard(src.keys.prefix + "moving") == 2  # left for the rerun
    assert json.loads(client.get(_lock(src)) or "{}")["pid"] == 4242  # B's lock is kept


def test_the_take_itself_checks_the_token(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A paused between its renewal and its take: move_out.lua refuses, atomically with it.
    src, one, _ = queues
    a = QueueMove(client, src.name, one.name)
    a.lock.take()
    monkeypatch.setattr(a.lock, "renew", lambda: None)
    client.delete(_lock(src))  # expired
    with pytest.raises(MoveRefused, match="lost its lock"):
        a.take(a.src[0], IDS)
    _held_by_hand(client, src)  # taken by another run
    with pytest.raises(MoveRefused, match="lost its lock"):
        a.take(a.src[0], IDS)
    b = QueueMove(client, src.name, one.name)  # a step-by-step caller, holding no lock
    with pytest.raises(MoveRefused, match="another move of queue"):
        b.take(b.src[0], IDS)
    client.set(_lock(src), "not json")
    with pytest.raises(MoveRefused, match="another move of queue"):
        b.take(b.src[0], IDS)
    assert sorted(client.zrange(src.keys.due, 0, -1)) == IDS  # nothing taken
    assert client.zcard(src.keys.prefix + "moving") == 0
    assert client.hget(src.keys.config, "move_to") is None


def test_partitioned_source_each_partition_is_locked_before_any_write(
    client: redis.Redis,
    queues: tuple[Queue, Queue, Queue],
    monkeypatch: pytest.MonkeyPatch,
    make_pq: Any,
) -> None:
    _, one, two = queues
    source = make_pq(partitions=2, suffix="-src")
    for i in range(8):
        source.enqueue("mvl.task", {"i": i})
    a = QueueMove(client, source.name, one.name)
    locks = [_lock(p) for p in a.src]

    def check(_: int) -> None:
        assert all(client.exists(k) for k in locks)
        with pytest.raises(MoveRefused, match="another move of queue"):
            move_queue(client, source.name, two.name)

    _on_put(monkeypatch, a, check)
    assert a.run().moved == 8
    assert not any(client.exists(k) for k in locks)
    # One partition locked by another run: refused before any write, no lock left behind.
    for i in range(4):
        source.enqueue("mvl.task", {"i": i})
    _held_by_hand(client, a.src[1])
    before = [dump_queue(client, p) for p in a.src]
    with pytest.raises(MoveRefused, match="elsewhere-host"):
        move_queue(client, source.name, two.name)
    assert [dump_queue(client, p) for p in a.src] == before
    assert client.exists(locks[0]) == 0 and dump_queue(client, two) == {}


def test_cli_says_who_holds_the_lock_and_exits_1(
    client: redis.Redis, redis_url: str, queues: tuple[Queue, Queue, Queue]
) -> None:
    src, one, _ = queues
    _held_by_hand(client, src)
    base = ["queue", "move", "--url", redis_url, "--from", src.name, "--to", one.name]
    for extra in ([], ["--dry-run"]):
        got = CliRunner().invoke(main, [*base, *extra])
        text = " ".join(got.output.split())
        assert got.exit_code == 1, got.output
        assert f"another move of queue '{src.name}' is running" in text
        assert "elsewhere-host, pid 4242" in text and "expires in" in text
    assert dump_queue(client, one) == {}


def test_bad_lease_and_lock_arguments_are_refused(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    src, one, _ = queues
    for bad in (0, -1, True, "5", 86_400_001):
        with pytest.raises(BadArgument, match="lease_ms"):
            QueueMove(client, src.name, one.name, lease_ms=bad)  # type: ignore[arg-type]
    before = dump_queue(client, src)
    for args in (
        ["renew", ""],
        ["renew", "t", "0"],
        ["unlock"],
        ["take", one.name, "x" * 65, "j0"],
    ):
        script = "move_out" if args[0] == "take" else "move_done"
        with pytest.raises(BadArgument):
            src._run(_call(script, args))
    assert dump_queue(client, src) == before


def test_doctor_names_a_lock_that_never_expires_and_not_a_runs_own(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    src, _, _ = queues
    _held_by_hand(client, src)  # a run's: it expires
    assert [i.code for i in check_queue(client, src.name)] == []
    client.persist(_lock(src))
    found = check_queue(client, src.name)
    assert [(i.code, i.severity, i.repair) for i in found] == [("move-lock-stuck", "error", ())]
    assert f"DEL {_lock(src)}" in found[0].fix
    client.delete(_lock(src))
    client.hset(_lock(src), "a", "b")  # another type: no expiry either
    assert [i.code for i in check_queue(client, src.name)] == ["move-lock-stuck"]


def test_the_lock_is_renewed_while_many_idempotency_keys_are_carried(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, one, _ = queues
    for i in range(250):
        src.enqueue("mvl.task", {"i": i}, key=f"k-{i}")
    a = QueueMove(client, src.name, one.name, batch=1000)
    renewals: list[str] = []
    real_renew, real_carry = a.lock.renew, a.carry_keys

    def renew() -> None:
        renewals.append("renew")
        real_renew()

    def carry(part: Queue) -> None:
        renewals.append("carry")
        real_carry(part)

    monkeypatch.setattr(a.lock, "renew", renew)
    monkeypatch.setattr(a, "carry_keys", carry)
    monkeypatch.setattr(queue_move_keys, "SCAN_COUNT", 50)  # the 250 keys: 5 pages at least
    assert a.run().keys == 250
    # Once a SCAN page (its keys read in one pipeline), then once more before the run's end
    # writes (close, clear_incoming).
    end = renewals[renewals.index("carry") :]
    assert end[0] == "carry" and set(end[1:]) == {"renew"} and len(end) >= 7, end


def test_a_release_that_fails_after_an_error_neither_hides_it_nor_keeps_the_other_locks(
    client: redis.Redis,
    queues: tuple[Queue, Queue, Queue],
    monkeypatch: pytest.MonkeyPatch,
    make_pq: Any,
) -> None:
    # The run's end released its locks in a `finally`: a server error there (the connection
    # lost too) replaced the run's own error, and the locks after the first were kept until
    # their lease ran out.
    _, one, _ = queues
    source = make_pq(partitions=2, suffix="-rel")
    source.enqueue("mvl.task", {"i": 0})
    a = QueueMove(client, source.name, one.name)
    locks = [_lock(p) for p in a.src]

    def stopped(*_: Any, **__: Any) -> Any:
        assert all(client.exists(k) for k in locks)
        raise MoveRefused("the run's own error")

    def unlock_fails(_: Any) -> Any:
        raise redis.ConnectionError("lost while unlocking")

    monkeypatch.setattr(a, "_run", stopped)
    monkeypatch.setattr(a.src[0], "_run", unlock_fails)
    with pytest.raises(MoveRefused, match="the run's own error"):
        a.run()
    assert [client.exists(k) for k in locks] == [1, 0]  # the one that failed: its lease ends


def test_a_release_that_fails_after_a_run_that_went_well_is_raised(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, one, _ = queues
    a = QueueMove(client, src.name, one.name)
    real = a.lock.release

    def unlock_fails(_: Any) -> Any:
        raise redis.TimeoutError("timed out while unlocking")

    def release(*, quiet: bool = False) -> None:
        monkeypatch.setattr(a.src[0], "_run", unlock_fails)
        real(quiet=quiet)

    monkeypatch.setattr(a.lock, "release", release)
    with pytest.raises(redis.TimeoutError):
        a.run()
    assert sorted(client.zrange(one.keys.due, 0, -1)) == IDS  # moved: only its end failed


def test_a_run_that_lost_its_lock_before_its_end_leaves_the_records_to_the_next_run(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The lock lapsed while the run carried its keys (a pause past the lease). Its end writes
    # (move_done 'end', the destination's move_from record and kept ids) were made all the
    # same, though a run that took over may be between a put and its finish there. Now the
    # run renews first, is refused, and writes none of them; the next run ends the move.
    src, one, _ = queues
    src.enqueue("mvl.task", {"i": 1}, key="k-1")
    a = QueueMove(client, src.name, one.name)
    real_carry = a.carry_keys

    def carry(part: Queue) -> None:
        real_carry(part)
        client.delete(_lock(src))  # its lease ended while it was paused

    monkeypatch.setattr(a, "carry_keys", carry)
    with pytest.raises(MoveRefused, match="lost its lock"):
        a.run()
    assert client.hget(src.keys.config, "move_to") == one.name
    assert client.hexists(one.keys.config, "move_from:" + src.name)
    report = move_queue(client, src.name, one.name)
    assert (report.moved, report.already) == (0, 0)
    assert client.hget(src.keys.config, "move_to") is None
    assert not client.hexists(one.keys.config, "move_from:" + src.name)


def test_a_put_below_the_epoch_the_destination_saw_is_refused_with_nothing_written(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    # The fence of a put (move_in.lua MOVE_STALE): a destination that saw a later run of the
    # source (here set by hand far ahead, as a server clock stepped back would leave it)
    # refuses this run's put, nothing written there; the run stops as one that lost its lock,
    # its batch waiting in `moving` for a rerun.
    src, one, _ = queues
    src.enqueue("mvl.task", {"i": 1}, job_id="j")
    n = int(client.zcard(src.keys.due))
    field = "move_epoch:" + src.name
    client.hset(one.keys.config, field, str(2**52))
    with pytest.raises(MoveRefused, match=r"lost its lock.*clock went back.*MOVE_STALE"):
        move_queue(client, src.name, one.name)
    assert client.zcard(one.keys.due) == 0 and client.zscore(src.keys.prefix + "moving", "j")
    client.hdel(one.keys.config, field)
    report = move_queue(client, src.name, one.name)
    assert (report.resumed, report.moved) == (n, n) and client.zscore(one.keys.due, "j")
    assert int(client.hget(one.keys.config, field) or 0) > 0  # the epoch seen, kept


def test_a_key_written_after_the_first_batch_is_carried_at_the_partitions_end(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch's keys are carried before its finish, from one read of the source's keys at the
    # first batch; a keyed job enqueued after that read moves in a later batch, and its key is
    # carried by the end pass (which skips the keys the batches carried).
    src, one, _ = queues
    for i in range(3):
        src.enqueue("mvl.task", {"i": i}, key=f"early-{i}")
    a = QueueMove(client, src.name, one.name, batch=1)
    real_finish, late = a.finish, list[str]()

    def finish(part: Queue, ids: list[str], *, back: bool = False) -> int:
        done = real_finish(part, ids, back=back)
        if not late:
            late.append(src.enqueue("mvl.task", {"i": 9}, key="late", delay_ms=3_600_000))
        return done

    monkeypatch.setattr(a, "finish", finish)
    report = a.run()
    assert report.keys == 4 and client.zscore(one.keys.due, late[0]) is not None
    assert one.enqueue("mvl.task", {"i": 9}, key="late") == late[0]
