"""Review 5 of `scheduler queue move` (after 0746687): two real runs at once with their locks, a
run whose lock lapsed, future-dated / retried / keyed jobs into a partitioned destination, a
partition moved as a source on its own (`--from <queue>.p<k>.<n>`) mixed with moves of its whole
queue, and dry runs in those states. A second run is started inside a step of the first
(a monkeypatched QueueMove method), as tests/test_queue_move_lock.py does."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler.admin.queue_move import Entry, MoveRefused, QueueMove, move_queue
from scheduler.admin.queue_move_lock import lock_key
from scheduler.cli.main import main
from scheduler.client.queue import Queue
from scheduler.core.errors import BadArgument
from tests.conftest import dump_queue
from tests.fixtures.move_queues import expire_record, made_queues, waiting_in
from tests.fixtures.partitioned import MakePq
from tests.test_queue_move_review4 import _parts, _reruns, _run_once, _settled


def _on_put(monkeypatch: pytest.MonkeyPatch, run: QueueMove, hook: Callable[[], object]) -> None:
    """`hook` runs inside `run`'s first put, before the put itself (a pause there)."""
    real = run.put
    calls: list[int] = []

    def put(entries: list[Entry]) -> str:
        if not calls:
            calls.append(1)
            hook()
        return real(entries)

    monkeypatch.setattr(run, "put", put)


def _waiting(client: redis.Redis, jid: str, *queues: Any) -> list[str]:
    """The names of the partitions (or plain queues) whose `due` holds `jid`."""
    return waiting_in(client, jid, *(p for q in queues for p in _parts(q)))


def _dump(client: redis.Redis, *queues: Any) -> dict[str, object]:
    """Every key of the queues, of each partition and of a partitioned queue's own name."""
    out: dict[str, object] = {}
    for q in queues:
        for p in [q, *_parts(q)] if hasattr(q, "parts") else [q]:
            out.update(dump_queue(client, p if isinstance(p, Queue) else Queue(client, p.name)))
    return out


# -- Defects this review found (each failed before its fix) ----------------------------------


@pytest.mark.parametrize("expired", [False, True], ids=["record-kept", "record-expired"])
def test_a_partition_is_no_source_so_a_stopped_move_is_rerun_under_its_own_name(
    client: redis.Redis, make_pq: MakePq, redis_url: str, expired: bool
) -> None:
    # A move of a's partition p on its own (`--from <a>.p0.2`) put j into b and stopped before
    # its finish, or the move of the whole of a did; j ran in b. The rerun under the other
    # name (the whole queue a, or the partition p) found none of the ids kept in b, which are
    # keyed by the run's --from name (`move_in:<source>`): j's kept record answered 'x' (back
    # into p's due: run again in a), its expired record 'c' (written into b again). A
    # partition is now refused as --from, as it is as --to (exit 2, nothing written), so a
    # stopped move of a is rerun as a, which finds its kept id: 'e', j runs once.
    a = make_pq(partitions=2, suffix="-a")
    with made_queues(client, "mvr5-b-") as (b,):
        jid = a.enqueue("mvr5.task", {"n": 1})
        part = a.parts[a.layout.partition_of_id(jid)]
        with pytest.raises(BadArgument, match=f"--from {a.name}"):
            QueueMove(client, part.name, b.name)
        stopped = QueueMove(client, a.name, b.name)
        assert stopped.put(stopped.take(part, [jid])) == "c"  # then stopped
        _run_once(b, jid)
        if expired:
            expire_record(client, b, jid)
        before = _dump(client, a, b)
        args = ["queue", "move", "--url", redis_url, "--from", part.name, "--to", b.name]
        out = CliRunner().invoke(main, args)
        assert out.exit_code == 2 and "is a partition of the partitioned queue" in out.output
        assert _dump(client, a, b) == before
        report = move_queue(client, a.name, b.name)
        assert (report.resumed, report.already) == (1, 1), report.as_dict()
        assert _waiting(client, jid, a, b) == [], report.as_dict()


def _lapsed_after_put(client: redis.Redis, a: Queue, b: Queue) -> QueueMove:
    """Run 1 of a -> b: x taken and put into b under its lock, then paused past its lease
    (its lock gone) before its finish."""
    a.enqueue("mvr5.task", {"n": 1}, job_id="x")
    first = QueueMove(client, a.name, b.name, lease_ms=1000)
    first.lock.take()
    first.check(skip_schedules=False)
    assert first.put(first.take(first.src[0], ["x"])) == "c"
    client.delete(lock_key(a))
    return first


def _late_finish_refused(first: QueueMove) -> None:
    """Run 1 wakes and finishes x: refused (it went on, unchecked, before 91a93f0)."""
    with pytest.raises(MoveRefused, match="lost its lock"):
        first.finish(first.src[0], ["x"])


def test_a_run_whose_lock_lapsed_between_put_and_finish_is_refused_its_finish(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Run 1 (a -> b) put x into b and paused past its lease before its finish; its lock is
    # gone. The rerun takes the lock and re-sends x from a's moving. Between the rerun's take
    # and its put, run 1 wakes up and finishes: finish() neither renews nor checks the lock
    # (move_done 'done' and the SREM of b's kept id are not token-checked), so x leaves a's
    # moving and its id leaves b's `move_in:<a>`. x runs in b and its record expires; the
    # rerun's put finds neither the job nor its kept id and writes x into b again ('c'): run
    # twice. (The docs name a pause between a put's renewal and the put; this one is between
    # a put and its finish, a whole round trip wide, and the lapsed run writes.) With an id
    # reused in a instead, run 1's late finish deletes the new job from the rerun's moving.
    with made_queues(client, "mvr5-a-", "mvr5-b-") as (a, b):
        first = _lapsed_after_put(client, a, b)

        def wake_first() -> None:
            _late_finish_refused(first)
            _run_once(b, "x")
            expire_record(client, b, "x")

        rerun = QueueMove(client, a.name, b.name)
        _on_put(monkeypatch, rerun, wake_first)
        report = rerun.run()
        assert waiting_in(client, "x", a, b) == [], report.as_dict()


def test_a_lapsed_runs_late_finish_cannot_delete_a_new_job_reusing_the_id(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Run 1 (a -> b) put x into b and paused past its lease before its finish. A rerun
    # finishes the move (x 'already'), x runs in b (its record kept: a lean hash), and a new
    # job x is enqueued in a. The next run takes the new x into a's moving; before its put,
    # run 1 wakes up and finishes x: move_done 'done' deletes the new x from a's moving and
    # its record (no lock checked). The run's put answers 'x' (b holds the finished old x,
    # whose kept id is gone), its finish 'back' finds nothing in moving: the new job is in
    # neither queue, lost, and the report counts it as a conflict that stayed.
    with made_queues(client, "mvr5-a-", "mvr5-b-") as (a, b):
        first = _lapsed_after_put(client, a, b)
        assert move_queue(client, a.name, b.name).already == 1
        _run_once(b, "x")
        a.enqueue("mvr5.task", {"n": 2}, job_id="x")  # a new job under the id
        rerun = QueueMove(client, a.name, b.name)
        _on_put(monkeypatch, rerun, lambda: _late_finish_refused(first))
        report = rerun.run()
        assert waiting_in(client, "x", a, b) == [a.name], report.as_dict()
        assert json.loads(a.get_job("x").payload_json) == {"n": 2}


def test_a_batchs_keys_are_carried_before_its_finish_so_a_stopped_run_leaves_none(
    client: redis.Redis, make_pq: MakePq
) -> None:
    # a -> b (b partitioned) took, put and finished its only page, then stopped before
    # carry_keys. The rerun finds a's moving empty and its due empty: it moves nothing, so its
    # moved_ids are empty and it carries no key. k's idempotency key stays in a only, and a
    # keyed enqueue re-sent to b makes a second job beside the moved k: both run. docs/
    # cluster.md said "a run stopped before it leaves that job's key uncopied"; no rerun
    # copied it either, so a stop at any point after the first finish of a run (a big queue's
    # first page) left those keys behind for good. Now a batch's keys are carried before its
    # finish (queue_move_keys.BatchKeys).
    b = make_pq(partitions=3, suffix="-b")
    with made_queues(client, "mvr5-a-") as (a,):
        a.enqueue("mvr5.task", {"n": 2}, job_id="k", key="order-7")
        m = QueueMove(client, a.name, b.name)
        entries = m.take(m.src[0], ["k"])
        assert m.put(entries) == "c"
        assert m.finish(m.src[0], ["k"]) == 1  # then stopped before carry_keys
        assert _reruns(client, (a, b)) == []
        assert _waiting(client, "k", a, b) == [b.parts[b.layout.partition_of_id("k")].name]
        assert b.enqueue("mvr5.task", {"n": 2}, key="order-7") == "k"


# -- Interleavings checked safe ---------------------------------------------------------------


def test_future_retried_and_keyed_jobs_stopped_in_flight_to_a_partitioned_queue_move_intact(
    client: redis.Redis, make_pq: MakePq
) -> None:
    # A future-dated job, a retried one (failed once, its hash with attempts and error, due
    # later) and a keyed one: a -> b (3 partitions) puts them and stops before the finish;
    # the rerun re-sends them ('e'). Each waits once, in the partition its id routes to, with
    # the same due score and the same record; the keyed enqueue re-sent to b returns the moved
    # job's id.
    b = make_pq(partitions=3, suffix="-b")
    with made_queues(client, "mvr5-a-") as (a,):
        a.enqueue("mvr5.task", {"n": 1}, job_id="f", delay_ms=3_600_000)
        a.enqueue("mvr5.task", {"n": 2}, job_id="k", key="order-7", delay_ms=60_000)
        a.enqueue("mvr5.task", {"n": 3}, job_id="r")
        for job in a.claim("w", limit=10).jobs:
            a.fail(job.id, job.token, ("E", "once", ""), delay_ms=120_000)
        ids = ("f", "k", "r")
        before = {j: (a.get_job(j).fields, client.zscore(a.keys.due, j)) for j in ids}
        assert a.get_job("r").fields.get("attempts") == "1"
        m = QueueMove(client, a.name, b.name)
        assert m.put(m.take(m.src[0], list(ids))) == "ccc"  # then stopped
        report = move_queue(client, a.name, b.name)
        assert (report.resumed, report.already, report.keys) == (3, 3, 1), report.as_dict()
        for j in ids:
            part = b.parts[b.layout.partition_of_id(j)]
            assert _waiting(client, j, a, b) == [part.name]
            assert (part.get_job(j).fields, client.zscore(part.keys.due, j)) == before[j]
        assert b.enqueue("mvr5.task", {"n": 2}, key="order-7") == "k"
        assert _settled(client, a, b)


@pytest.mark.parametrize("at", ["before-put", "after-put"])
def test_two_moves_each_way_at_once_end_with_each_job_waiting_once(
    client: redis.Redis, make_pq: MakePq, monkeypatch: pytest.MonkeyPatch, at: str
) -> None:
    # a -> b (b partitioned) and b -> a run at once: b -> a whole inside a -> b's first put,
    # before it or after it (then stopped there: a -> b's batch waits in a's moving). Whatever
    # is refused, reruns alone finish and every job waits in exactly one queue.
    b = make_pq(partitions=2, suffix="-b")
    with made_queues(client, "mvr5-a-") as (a,):
        xs = [a.enqueue("mvr5.task", {"x": n}, delay_ms=n * 1000) for n in range(3)]
        ys = [b.enqueue("mvr5.task", {"y": n}) for n in range(3)]
        ab = QueueMove(client, a.name, b.name, batch=1)

        def other_way() -> None:
            with contextlib.suppress(MoveRefused):
                move_queue(client, b.name, a.name)

        if at == "before-put":
            _on_put(monkeypatch, ab, other_way)
            with contextlib.suppress(MoveRefused):
                ab.run()
        else:
            ab.lock.take()
            ab.put(ab.take(ab.src[0], [xs[0]]))
            ab.lock.release()  # then stopped
            other_way()
        assert _reruns(client, (a, b), (b, a)) == []
        assert all(len(_waiting(client, j, a, b)) == 1 for j in xs + ys)
        assert _settled(client, a, b)


def test_a_dry_run_writes_nothing_in_the_stopped_and_mixed_states(
    client: redis.Redis, make_pq: MakePq
) -> None:
    # States: a's stopped move (a job in a partition's moving, b's record and kept id), a
    # stale record in each of a's partitions (from c, whose move ended: a real run forgets
    # it). A dry run of the whole queue, of the partition (refused by name), and toward
    # another queue (refused or not) changes no key of any of them.
    a = make_pq(partitions=2, suffix="-a")
    with made_queues(client, "mvr5-b-", "mvr5-c-") as (b, c):
        ids = [a.enqueue("mvr5.task", {"n": n}, delay_ms=n) for n in range(4)]
        part = a.parts[a.layout.partition_of_id(ids[0])]
        stopped = QueueMove(client, a.name, b.name)
        assert stopped.put(stopped.take(part, [ids[0]])) == "c"
        c.enqueue("mvr5.task", job_id="cz")
        assert move_queue(client, c.name, a.name).moved == 1
        client.hset(a.parts[1].keys.config, "move_from:" + c.name, "1-old")
        client.hset(part.keys.config, "move_from:" + c.name, "1-old")
        pairs: list[tuple[Any, Any]] = [(a, b), (part, b), (a, c), (part, c), (b, a), (c, a)]
        for src, dst in pairs:
            before = _dump(client, a, b, c)
            with contextlib.suppress(MoveRefused, BadArgument):
                move_queue(client, src.name, dst.name, dry_run=True)
            assert _dump(client, a, b, c) == before, (src.name, dst.name)
