"""An adversarial review of `scheduler queue move`'s one-destination record (lua/move_out.lua
ARGV[2], config `move_to` / `move_take_ms`, move_done.lua 'end') and of the `moving` state's
readers: two runs interleaved step by step (QueueMove.take / put / finish / close called apart),
runs stopped between steps and rerun, hand edits of the record, readers of a moving job."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence

import pytest
import redis
from click.testing import CliRunner

from scheduler import JobNotFound, JobState
from scheduler.admin.doctor import check_queue
from scheduler.admin.queue_move import Entry, MoveRefused, QueueMove, move_queue
from scheduler.admin.queue_move_check import clear_incoming
from scheduler.cli.main import main
from scheduler.client.queue import Queue
from scheduler.core.errors import CorruptKey
from tests.conftest import dump_queue
from tests.fixtures.move_queues import made_queues
from tests.fixtures.partitioned import MakePq
from tests.workers.procs import wait_for


@pytest.fixture
def queues(client: redis.Redis) -> Iterator[tuple[Queue, Queue, Queue]]:
    with made_queues(client, "mvw-a-", "mvw-b-", "mvw-c-") as (a, b, c):
        yield a, b, c


def _waiting(client: redis.Redis, jid: str, *queues: Queue) -> list[str]:
    """The `due` and `moving` keys of `queues` that hold `jid` with its record."""
    out = []
    for q in queues:
        for key in (q.keys.due, q.keys.prefix + "moving"):
            if client.zscore(key, jid) is not None and (
                client.exists(q.keys.job(jid)) or client.exists(q.keys.spec(jid))
            ):
                out.append(key)
    return out


def _enqueue(q: Queue, kind: str, jid: str) -> None:
    """A job of each record shape: never claimed (spec only), scheduled later, retried (a
    hash with task and enqueued_ms)."""
    if kind == "later":
        q.enqueue("mvw.task", job_id=jid, delay_ms=3_600_000)
        return
    q.enqueue("mvw.task", job_id=jid, max_attempts=3)
    if kind == "retried":
        (lease,) = q.claim("w", limit=1).jobs
        q.fail(jid, lease.token, ("E", "boom", ""), delay_ms=0)


@pytest.mark.parametrize("kind", ["fresh", "later", "retried"])
def test_opposite_runs_interleaved_lose_no_job(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue], kind: str
) -> None:
    # a -> b has written its batch into b and not yet finished it; b -> a (past its check,
    # made before a -> b's first take) lists b's due, which now holds that batch, takes it and
    # wrote it into a, where move_in found each id (still in a's `moving`) and answered 'e'
    # (a retried or scheduled job: same task and enqueued_ms). Then b -> a deleted it from b
    # and a -> b from a: the job was nowhere. move_in then answered 'm' and it stayed in b;
    # now b -> a's take is refused while b holds a -> b's record (move_out's MOVE_INCOMING).
    a, b, _ = queues
    _enqueue(a, kind, "x")
    b.enqueue("mvw.task", job_id="y")  # b's own job, which b -> a moves
    ab, ba = QueueMove(client, a.name, b.name), QueueMove(client, b.name, a.name)
    ab.check(skip_schedules=False)
    ba.check(skip_schedules=False)
    assert ab.put(ab.take(ab.src[0], ["x"])) == "c"
    with pytest.raises(MoveRefused, match=f"move from '{a.name}'"):
        ba._drain(ba.src[0], b.keys.due, dry_run=False, resumed=False)  # b -> a's one page
    assert ab.finish(ab.src[0], ["x"]) == 1
    assert ab.close(ab.src[0]) and not ba.close(ba.src[0])  # b -> a recorded nothing
    assert _waiting(client, "x", a, b) == [b.keys.due] and b.status("x") != "moving"
    assert _waiting(client, "y", a, b) == [b.keys.due]
    assert ba.report.moved == 0
    clear_incoming(client, ab.src, ab.dst, a.name)  # a -> b's end; then b -> a goes
    assert move_queue(client, b.name, a.name).moved == 2
    assert [_waiting(client, jid, a, b) for jid in ("x", "y")] == [[a.keys.due]] * 2


@pytest.mark.parametrize(
    "edit",
    [
        "the destination's moving is a string",
        "the source's config is a string",
        "the destination's config is a string",
    ],
)
def test_a_key_of_another_type_is_a_typed_refusal_with_nothing_written(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue], edit: str
) -> None:
    # check() read these with bare Redis calls: WRONGTYPE escaped untyped (the CLI's exit 1
    # for a refusal, CorruptKey's "see doctor", were lost).
    a, b, _ = queues
    a.enqueue("mvw.task", job_id="x")
    b.enqueue("mvw.task", job_id="y")
    queue = b if "destination" in edit else a
    key = queue.keys.prefix + "moving" if "moving" in edit else queue.keys.config
    client.delete(key)
    client.set(key, "junk")
    before = (dump_queue(client, a), dump_queue(client, b))
    for dry_run in (True, False):
        with pytest.raises(CorruptKey, match=key):
            move_queue(client, a.name, b.name, dry_run=dry_run)
    assert (dump_queue(client, a), dump_queue(client, b)) == before


@pytest.mark.parametrize("to", ["?", ""])
def test_a_recent_record_naming_no_queue_is_refused_by_check_as_by_the_take(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue], to: str
) -> None:
    # check() read a missing `move_to` as '?', so a hand-edited '?' (or '', which move_out
    # compares as text) passed check() and the dry run, then the take refused: the dry run said
    # it would move, and a partitioned source's earlier partitions moved before the refusal.
    a, b, _ = queues
    a.enqueue("mvw.task", job_id="x")
    now_ms = int(client.time()[0]) * 1000
    client.hset(a.keys.config, mapping={"move_to": to, "move_take_ms": now_ms})
    with pytest.raises(MoveRefused, match="ago"):
        move_queue(client, a.name, b.name, dry_run=True)
    before = dump_queue(client, a)
    m = QueueMove(client, a.name, b.name)
    with pytest.raises(MoveRefused, match="ago"):
        m.check(skip_schedules=False)
    with pytest.raises(MoveRefused, match="ago"):
        m.take(m.src[0], ["x"])
    assert dump_queue(client, a) == before and dump_queue(client, b) == {}


def test_the_take_refusal_names_the_recorded_destination_whole(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    # A record edited by hand to a text with spaces: the take's refusal cut it at the first
    # space (another queue's name, maybe), while check() named it whole.
    a, b, _ = queues
    a.enqueue("mvw.task", job_id="x")
    client.hset(a.keys.config, mapping={"move_to": "old q name", "move_take_ms": 0})
    client.zadd(a.keys.prefix + "moving", {"x": 1})
    client.zrem(a.keys.due, "x")
    m = QueueMove(client, a.name, b.name)
    with pytest.raises(MoveRefused, match="move to 'old q name'"):
        m.check(skip_schedules=False)
    with pytest.raises(MoveRefused, match="move to 'old q name'"):
        m.take(m.src[0], ["x"])


def _gone(client: redis.Redis, *keys: str) -> None:
    """Until none of `keys` exists (a record's expiry; the bound is for liveness only)."""
    wait_for(lambda: not client.exists(*keys), 20, f"{keys} to expire")


def test_two_runs_to_one_destination_never_write_a_job_it_already_ran(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    # B lists the source's due; A takes that page first (into `moving`). B's take returned the
    # jobs again (a job in `moving` is re-sent, for a rerun), then A wrote, finished; the
    # destination ran the job and its record expired (result_ttl_ms); B's put wrote it again:
    # run twice. B's page, listed from due, must leave a job another run took meanwhile.
    src, dst, _ = queues
    src.enqueue("mvw.task", job_id="x", result_ttl_ms=1)
    a, b = QueueMove(client, src.name, dst.name), QueueMove(client, src.name, dst.name)
    taken: list[Entry] = []
    ran: list[str] = []
    listed = client.zrange

    def b_lists_then_a_takes(key: str, *args: object, **kw: object) -> object:
        ids = listed(key, *args, **kw)  # type: ignore[arg-type]
        if key == src.keys.due and ids and not taken:
            taken.extend(a.take(a.src[0], [str(i) for i in ids]))
        return ids

    def a_ends_and_the_destination_runs_it() -> None:
        if ran:
            return
        assert a.put(taken) == "c" and a.finish(a.src[0], ["x"]) == 1 and a.close(a.src[0])
        (job,) = dst.claim("w", limit=1).jobs
        dst.complete("x", job.token, "ok")
        _gone(client, dst.keys.job("x"), dst.keys.spec("x"))
        ran.append("x")

    put = b.put

    def b_puts(entries: list[Entry]) -> str:
        a_ends_and_the_destination_runs_it()
        return put(entries)

    monkeypatch.setattr(client, "zrange", b_lists_then_a_takes)
    monkeypatch.setattr(b, "put", b_puts)
    b._drain(b.src[0], src.keys.due, dry_run=False, resumed=False)
    monkeypatch.setattr(client, "zrange", listed)
    a_ends_and_the_destination_runs_it()
    assert client.zcard(dst.keys.due) == 0 and dst.claim("w", limit=1).jobs == []
    assert (b.report.moved, b.report.already) == (0, 0)


class Stop(Exception):
    """The run's process dies here."""


def _record(client: redis.Redis, parts: list[Queue]) -> dict[str, Sequence[object]]:
    return {p.name: client.hmget(p.keys.config, ["move_to", "move_take_ms"]) for p in parts}


@pytest.mark.parametrize("stop", ["put", "finish", "close", "carry_keys"])
def test_a_partitioned_move_stopped_anywhere_is_finished_by_a_rerun_and_holds_others_out(
    client: redis.Redis,
    queues: tuple[Queue, Queue, Queue],
    make_pq: MakePq,
    monkeypatch: pytest.MonkeyPatch,
    stop: str,
) -> None:
    # 3 partitions into 3, 2 jobs a page; the run dies at its second call of `stop` (after
    # a take, a put, a finish, or a whole partition). Another destination is refused (jobs in
    # `moving`, or a take less than 60 s old), still refused once the record is old if
    # `moving` holds jobs, and the rerun moves each job exactly once and clears every record.
    _, _, other = queues
    source, dest = make_pq(partitions=3, suffix="-s"), make_pq(partitions=3, suffix="-d")
    ids = [source.enqueue("mvw.task", {"i": i}) for i in range(12)]
    run = QueueMove(client, source.name, dest.name, batch=2)
    real, calls = getattr(run, stop), []

    def dies(*args: object, **kw: object) -> object:
        calls.append(stop)
        if len(calls) == 2:
            raise Stop
        return real(*args, **kw)

    monkeypatch.setattr(run, stop, dies)
    with pytest.raises(Stop):
        run.run()
    busy = sum(client.zcard(p.keys.prefix + "moving") for p in source.parts)
    assert busy == (2 if stop in ("put", "finish") else 0)
    with pytest.raises(MoveRefused, match=dest.name):
        move_queue(client, source.name, other.name, dry_run=True)
    with pytest.raises(MoveRefused, match=dest.name):
        move_queue(client, source.name, other.name)
    for p in source.parts:  # 60 s on (the records' times moved back)
        if client.hget(p.keys.config, "move_take_ms") is not None:
            client.hset(p.keys.config, "move_take_ms", 1)
    if busy:
        with pytest.raises(MoveRefused, match="rerun that first"):
            move_queue(client, source.name, other.name)
    report = move_queue(client, source.name, dest.name)
    assert report.resumed == busy
    waiting = [str(j) for p in dest.parts for j in client.zrange(p.keys.due, 0, -1)]
    assert sorted(waiting) == sorted(ids) and client.zcard(other.keys.due) == 0
    assert all(client.zcard(p.keys.due) == 0 for p in source.parts)
    assert _record(client, source.parts) == {p.name: [None, None] for p in source.parts}


def test_two_runs_to_one_destination_the_last_to_end_clears_the_record(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    # A and B toward one destination, interleaved: A's end while B's batch waits in `moving`
    # keeps the record (B's rerun would need it); B's end, the last, deletes it. Each job is
    # written once, and the reports add up.
    src, dst, _ = queues
    for i in range(4):
        src.enqueue("mvw.task", job_id=f"j{i}")
    a, b = QueueMove(client, src.name, dst.name), QueueMove(client, src.name, dst.name)
    a.check(skip_schedules=False)
    b.check(skip_schedules=False)
    ta = a.take(a.src[0], ["j0", "j1"], fresh=True)
    tb = b.take(b.src[0], ["j1", "j2", "j3"], fresh=True)  # j1 is A's: left to it
    assert [e.id for e in ta] == ["j0", "j1"] and [e.id for e in tb] == ["j2", "j3"]
    assert a.put(ta) == "cc" and a.finish(a.src[0], ["j0", "j1"]) == 2
    assert not a.close(a.src[0])  # B's two wait in `moving`
    assert client.hget(src.keys.config, "move_to") == dst.name
    assert b.put(tb) == "cc" and b.finish(b.src[0], ["j2", "j3"]) == 2
    assert b.close(b.src[0])
    assert client.hmget(src.keys.config, ["move_to", "move_take_ms"]) == [None, None]
    assert sorted(client.zrange(dst.keys.due, 0, -1)) == ["j0", "j1", "j2", "j3"]
    assert client.zcard(src.keys.due) == client.zcard(src.keys.prefix + "moving") == 0


def _waiter(q: Queue, jid: str, out: dict[str, object]) -> threading.Thread:
    """q.result(jid) on a thread, its answer (or error type) in out[jid], once announced."""

    def wait() -> None:
        try:
            out[jid] = q.result(jid, timeout_s=30)
        except Exception as exc:  # the type is the answer
            out[jid] = type(exc)

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    # Announced: it blocks now.
    wait_for(lambda: bool(q.client.exists(q.keys.result_wait(jid))), 20, "the waiter")
    return t


def test_a_result_waiter_on_the_source_is_told_the_job_left_and_one_moved_back_gets_it(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    # docs/cluster.md said a waiter on the source "waits out its timeout": it re-reads the
    # state at least each second and raises JobNotFound. A job moved out and back in while
    # its waiter waits is the same job: the waiter gets its result.
    a, b, _ = queues
    a.enqueue("mvw.task", job_id="gone")
    b.enqueue("mvw.task", job_id="back")
    out: dict[str, object] = {}
    first = _waiter(a, "gone", out)
    assert move_queue(client, a.name, b.name).moved == 1
    first.join()
    assert out["gone"] is JobNotFound
    second = _waiter(b, "back", out)
    assert move_queue(client, b.name, a.name).moved == 2
    assert move_queue(client, a.name, b.name).moved == 2
    jobs = {j.id: j.token for j in b.claim("w", limit=5).jobs}
    b.complete("back", jobs["back"], 42)
    second.join()
    assert out["back"] == 42


@pytest.mark.parametrize("record", ["kept", "junk", "none"])
def test_doctor_names_the_destination_an_interrupted_move_must_be_rerun_to(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue], record: str
) -> None:
    # Its advice was "run the same move again" with `--to ...`: the one destination the take
    # accepts while `moving` holds jobs is the recorded one, which the operator may not know
    # (another's run). A record edited into no queue name cannot be rerun to: said so.
    a, b, _ = queues
    a.enqueue("mvw.task", job_id="x")
    m = QueueMove(client, a.name, b.name)
    assert m.put(m.take(m.src[0], ["x"])) == "c"  # then killed
    if record == "junk":
        client.hset(a.keys.config, "move_to", "no such {queue}")
    elif record == "none":
        client.hdel(a.keys.config, "move_to", "move_take_ms")
    (found,) = check_queue(client, a.name)
    assert found.code == "move-interrupted"
    if record == "kept":
        assert f"--to {b.name}`" in found.fix
    elif record == "junk":
        assert "'no such {queue}' names no queue" in found.fix
    else:
        assert "same destination" in found.fix


@pytest.mark.parametrize("kind", ["fresh", "later", "retried"])
def test_a_rerun_into_a_queue_moving_the_job_onward_does_not_keep_a_second_copy(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue], kind: str
) -> None:
    # a -> b wrote x into b and died before its finish; b -> c took x (b's `moving`); a -> b's
    # rerun (past its check) re-sends x into b. x was delivered: b forwards it to c, so a's copy
    # must go. Answered 'm' (or 'x' for a never-claimed job: its run time read from b's due,
    # where it no longer is), x went back into a's due while c got it too: run twice.
    a, b, c = queues
    _enqueue(a, kind, "x")
    first = QueueMove(client, a.name, b.name)
    assert first.put(first.take(first.src[0], ["x"])) == "c"  # then killed
    # Now the onward take itself is refused while b holds a -> b's record (MOVE_INCOMING).
    rerun, onward = QueueMove(client, a.name, b.name), QueueMove(client, b.name, c.name)
    rerun.check(skip_schedules=False)
    with pytest.raises(MoveRefused, match="stopped move from"):  # b's record of a -> b's put
        onward.check(skip_schedules=False)
    with pytest.raises(MoveRefused, match="stopped move from"):  # as a run past its check
        onward.take(onward.src[0], ["x"])
    rerun._drain(rerun.src[0], a.keys.prefix + "moving", dry_run=False, resumed=True)
    assert (rerun.report.already, rerun.report.stays["conflict"], rerun.report.stays["moving"]) == (
        1,
        0,
        0,
    )
    assert _waiting(client, "x", a, b, c) == [b.keys.due]
    clear_incoming(client, rerun.src, rerun.dst, a.name)  # its end: b -> c goes on
    assert move_queue(client, b.name, c.name).moved == 1
    assert _waiting(client, "x", a, b, c) == [c.keys.due]


@pytest.mark.parametrize("broken", ["flow:held", "moving"])
def test_one_of_held_or_moving_of_another_type_does_not_hide_the_other(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue], broken: str
) -> None:
    # get_job's reads fell back to neither set when one was of another type (a hand edit,
    # doctor's): a moving job then read as due (or failed: no run time for a spec-only one),
    # a held one as due.
    a, b, _ = queues
    a.enqueue("mvw.task", job_id="held", concurrency_key="k", concurrency_limit=1)
    a.enqueue("mvw.task", job_id="held2", concurrency_key="k", concurrency_limit=1)
    assert [j.id for j in a.claim("w", limit=5).jobs] == ["held"]  # held2 set aside
    a.enqueue("mvw.task", job_id="mov")
    m = QueueMove(client, a.name, b.name)
    assert [e.id for e in m.take(m.src[0], ["mov"])] == ["mov"]
    assert a.status("held2") is JobState.HELD and a.status("mov") is JobState.MOVING
    key = a.keys.flow_held if broken == "flow:held" else a.keys.prefix + "moving"
    client.delete(key)
    client.set(key, "junk")
    if broken == "flow:held":
        assert a.status("mov") is JobState.MOVING
        assert {j.id: j.state for j in a._run(a.ops.get_jobs(["mov", "held"]))} == {
            "mov": "moving",
            "held": "leased",
        }
    else:
        assert a.status("held2") is JobState.HELD


def test_jobs_show_reads_a_moving_of_another_type_as_empty(
    client: redis.Redis, redis_url: str, queues: tuple[Queue, Queue, Queue]
) -> None:
    # Since `jobs show` lists the place `moving`, a `moving` edited into another type failed
    # it for every job of the queue (exit 1, WRONGTYPE), where get_job reads it as empty.
    a, _, _ = queues
    a.enqueue("mvw.task", job_id="j")
    client.set(a.keys.prefix + "moving", "junk")
    args = ["jobs", "show", "--json", "-q", a.name, "j", "--url", redis_url]
    got = CliRunner().invoke(main, args)
    assert got.exit_code == 0, got.output
    shown = json.loads(got.stdout)
    assert (shown["state"], shown["places"]) == ("due", ["due"])


def test_a_previous_versions_record_on_a_partitioned_source_is_finished_and_cleared(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue], make_pq: MakePq
) -> None:
    # The previous version wrote `move_to` alone (from Python, before each take) and died with
    # a batch in one partition's `moving`: another destination is refused, this version's rerun
    # to the recorded one finishes it and leaves no record in any partition.
    _, _, other = queues
    source, dest = make_pq(partitions=3, suffix="-s"), make_pq(partitions=2, suffix="-d")
    ids = [source.enqueue("mvw.task", {"i": i}) for i in range(9)]
    part = next(p for p in source.parts if client.zcard(p.keys.due) >= 2)
    pair = [str(i) for i in client.zrange(part.keys.due, 0, 1)]
    client.zrem(part.keys.due, *pair)
    client.zadd(part.keys.prefix + "moving", {j: 1 for j in pair})
    client.hset(part.keys.config, "move_to", dest.name)
    with pytest.raises(MoveRefused, match=dest.name):
        move_queue(client, source.name, other.name)
    report = move_queue(client, source.name, dest.name)
    assert (report.moved, report.resumed) == (9, 2)
    waiting = sorted(str(j) for p in dest.parts for j in client.zrange(p.keys.due, 0, -1))
    assert waiting == sorted(ids)
    assert _record(client, source.parts) == {p.name: [None, None] for p in source.parts}


def test_list_jobs_due_never_lists_a_moving_job(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    a, b, _ = queues
    for jid in ("m", "d"):
        a.enqueue("mvw.task", job_id=jid)
    m = QueueMove(client, a.name, b.name)
    assert [e.id for e in m.take(m.src[0], ["m"])] == ["m"]
    assert [j.id for j in a.list_jobs("due")] == ["d"]
    assert a.counts().due == 1 and a.counts().moving == 1


def test_doctor_names_an_id_in_moving_with_no_record_which_no_rerun_clears(
    client: redis.Redis, queues: tuple[Queue, Queue, Queue]
) -> None:
    # Its records deleted by hand: each rerun answers it 'unreadable' and leaves it, so
    # `moving` never empties and the record holds every other destination out for ever, while
    # doctor's only advice was to rerun.
    a, b, _ = queues
    a.enqueue("mvw.task", job_id="x")
    a.enqueue("mvw.task", job_id="y")
    m = QueueMove(client, a.name, b.name)
    assert len(m.take(m.src[0], ["x", "y"])) == 2  # then killed
    client.delete(a.keys.spec("x"), a.keys.job("x"))
    move_queue(client, a.name, b.name)
    assert client.zrange(a.keys.prefix + "moving", 0, -1) == ["x"]  # the rerun cannot
    found = {i.code: i for i in check_queue(client, a.name)}
    assert set(found) == {"move-interrupted", "moving-no-record"}
    assert found["moving-no-record"].job_id == "x"
    assert found["moving-no-record"].fix == f"ZREM {a.keys.prefix}moving x"
