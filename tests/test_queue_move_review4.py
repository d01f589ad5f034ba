"""Review of f4101f6 (`scheduler queue move`): a rerun re-sends its own jobs in `moving` whatever
`move_from:` records its source holds, then refuses a stopped move into it; a destination whose
own `moving` holds jobs is no longer refused. Interleavings of two or three moves' steps
(QueueMove.take / put / finish / close called apart), crashes between them, workers in the
destinations, partitioned queues whose jobs sit in a partition their id does not route to."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from scheduler.admin.queue_move import MoveRefused, QueueMove, move_queue
from scheduler.admin.queue_move_check import (
    clear_incoming,
    forget_delivered,
    incoming_refusal,
    record_incoming,
)
from scheduler.admin.queue_move_check import script_call as _call
from scheduler.admin.queue_move_check import text as _t
from scheduler.client.queue import Queue
from scheduler.core.errors import BadArgument
from tests.fixtures.move_queues import expire_record, made_queues, waiting_in
from tests.fixtures.partitioned import MakePq


def _parts(q: Any) -> list[Queue]:
    """The queues that hold jobs: a plain one, or each partition."""
    return list(q.parts) if hasattr(q, "parts") else [q]


def _reruns(client: redis.Redis, *runs: tuple[Any, Any], rounds: int = 4) -> list[str]:
    """The runs in turn, round after round until one round has no refusal: each round's
    refusals ('a -> b: text'); [] at the end means reruns alone finished."""
    refused: list[str] = []
    for _ in range(rounds):
        refused = []
        for src, dst in runs:
            try:
                move_queue(client, src.name, dst.name)
            except MoveRefused as exc:
                if "nothing left to move" not in str(exc):
                    refused.append(f"{src.name} -> {dst.name}: {exc}")
        if not refused:
            return []
    return refused


def _where(client: redis.Redis, jid: str, *queues: Any) -> list[str]:
    """Every due or moving set of the queues' partitions holding `jid`."""
    keys = [k for q in queues for p in _parts(q) for k in (p.keys.due, p.keys.prefix + "moving")]
    return [k for k in keys if client.zscore(k, jid) is not None]


def _settled(client: redis.Redis, *queues: Any) -> bool:
    """No job in a `moving` set, no move record nor kept ids in any partition."""
    parts = [p for q in queues for p in _parts(q)]
    left = sum(int(client.zcard(p.keys.prefix + "moving")) for p in parts)
    fields = [f for p in parts for f in client.hkeys(p.keys.config) if "move_from:" in _t(f)]
    kept = [k for p in parts for k in client.keys(p.keys.prefix + "move_in:*")]
    return left == 0 and not fields and not kept


def _run_once(q: Queue, jid: str) -> None:
    """A worker of `q` claims `jid` and completes it (the others claimed with it released)."""
    jobs = q.claim("w", limit=100).jobs
    q.release([(j.id, j.token) for j in jobs if j.id != jid])
    (job,) = [j for j in jobs if j.id == jid]
    q.complete(jid, job.token)


# -- Defects this review found (each failed before its fix) ----------------------------------


def test_a_job_cancelled_in_the_destination_before_any_claim_stays_cancelled_after_the_rerun(
    client: redis.Redis,
) -> None:
    # a -> b put x into b and stopped before its finish; x is cancelled in b (its cancelled
    # record kept: state, finished_ms, attempts, and the spec, which leaves enqueued_ms out).
    # The rerun re-sends x from a's moving: move_in.lua reads the stored spec with no run time
    # (x is in neither b's due nor moving), identity (nil, nil), and answers 'x' (a conflict),
    # though x is the kept id of this very move. x goes back into a's due and runs there: the
    # cancel is undone. (Ran, then expired or kept, and cancelled-then-expired answer 'e':
    # test_queue_move_review3 / test_queue_move_incoming; a cancelled retried job has
    # task and enqueued_ms in its hash and answers 'e' too. Not from f4101f6: older.)
    with made_queues(client, "mvr4-a-", "mvr4-b-") as (a, b):
        a.enqueue("mvr4.task", job_id="x")
        m = QueueMove(client, a.name, b.name)
        assert m.put(m.take(m.src[0], ["x"])) == "c"  # then stopped
        assert b.cancel("x") == "due"
        report = move_queue(client, a.name, b.name)
        assert waiting_in(client, "x", a, b) == [], report.as_dict()
        assert (report.already, report.stays["conflict"]) == (1, 0), report.as_dict()
        assert _settled(client, a, b)


def test_a_kept_id_left_by_a_resume_cut_after_its_finish_does_not_swallow_a_reused_id(
    client: redis.Redis,
) -> None:
    # a -> b stopped with p and q in a's moving, both put. Its rerun (a page a job) re-sends
    # p ('e') and dies between p's finish and its SREM: b keeps p's id, a still holds q in
    # moving. p runs in b, its record expires; a new job p is enqueued in a. The next rerun
    # keeps b's ids (a's moving is not empty: check_move deletes them only then), re-sends q,
    # then takes the new p from due: b has no record of p but its kept id, 'e', and the new
    # p is deleted from a: lost. (review3's reused-id test is the same with a's moving empty.
    # Not from f4101f6: older.)
    with made_queues(client, "mvr4-a-", "mvr4-b-") as (a, b):
        a.enqueue("mvr4.task", job_id="p")
        a.enqueue("mvr4.task", job_id="q")
        first = QueueMove(client, a.name, b.name)
        assert first.put(first.take(first.src[0], ["p", "q"])) == "cc"  # then stopped
        rerun = QueueMove(client, a.name, b.name, batch=1)
        assert rerun.put(rerun.take(rerun.src[0], ["p"])) == "e"
        assert int(a._run(_call("move_done", ["done", "", "p"]))) == 1  # then died before the SREM
        _run_once(b, "p")
        expire_record(client, b, "p")
        a.enqueue("mvr4.task", job_id="p")  # a new job under the id
        report = move_queue(client, a.name, b.name)
        assert waiting_in(client, "p", a, b) == [b.name], report.as_dict()
        assert waiting_in(client, "q", a, b) == [b.name] and _settled(client, a, b)


def test_a_partition_moved_as_a_source_keeps_a_stopped_move_into_its_queue_in_force(
    client: redis.Redis, make_pq: MakePq
) -> None:
    # d -> x (x partitioned) put j into the partition its id routes to and stopped before its
    # finish: that partition's config holds `move_from:<d>`, d's moving holds j toward x.
    # A move of that partition alone (`--from <x>.p<k>.<n>`: check_names refuses a partition
    # only as --to) reads the record as stale, since d's `move_to` names x, not the partition
    # (incoming_refusal compares it with the partition's name), forgets it and moves the copy
    # of j to e. d -> x's rerun then writes j into the partition again ('c': no record, and
    # its kept ids went with the forgotten record): j waits in e and in x, run twice. Not
    # from f4101f6: older. (Since 5456d3d a partition is refused as --from altogether.)
    x = make_pq(partitions=2, suffix="-x")
    with made_queues(client, "mvr4-d-", "mvr4-e-") as (d, e):
        d.enqueue("mvr4.task", job_id="j")
        part = x.parts[x.layout.partition_of_id("j")]
        dx = QueueMove(client, d.name, x.name)
        assert dx.put(dx.take(dx.src[0], ["j"])) == "c"  # then stopped
        try:
            onward = move_queue(client, part.name, e.name).as_dict()
        except (MoveRefused, BadArgument) as exc:  # refused, as a move of the whole of x is
            onward = {"refused": str(exc)}
        move_queue(client, d.name, x.name)
        assert waiting_in(client, "j", d, e, *x.parts) == [part.name], onward


# -- Interleavings checked safe (guards of f4101f6's claims) ---------------------------------


def test_a_rerun_resending_into_a_partitioned_queue_whose_stopped_move_took_a_job_elsewhere(
    client: redis.Redis, make_pq: MakePq
) -> None:
    # d is partitioned; j sits in d.parts[0] but its id routes to another partition. d -> s
    # takes j (d.parts[0]'s moving) and puts it into s; s -> d had taken k before that put and
    # put it into d; both stopped. s -> d's rerun re-sends k (s holds d -> s's record: not a
    # reason to keep its own jobs), then is refused; its take of j (a copy) stays refused.
    # A worker runs k in d and its record expires; d -> s's rerun re-sends j ('e', s has it),
    # and the last s -> d moves j back to the partition its id routes to: each once.
    d = make_pq(partitions=3, suffix="-d")
    jid = next(f"j{i}" for i in range(100) if d.layout.partition_of_id(f"j{i}") != 0)
    with made_queues(client, "mvr4-s-") as (s,):
        d.parts[0].enqueue("mvr4.task", job_id=jid)
        s.enqueue("mvr4.task", job_id="k")
        sd, ds = QueueMove(client, s.name, d.name), QueueMove(client, d.name, s.name)
        k = sd.take(sd.src[0], ["k"])
        assert ds.put(ds.take(d.parts[0], [jid])) == "c"
        assert sd.put(k) == "c"  # then both stopped
        with pytest.raises(MoveRefused, match="stopped move from"):
            sd.take(sd.src[0], [jid])
        with pytest.raises(MoveRefused, match=r"^1 job\(s\) of this move's stopped run were"):
            move_queue(client, s.name, d.name)
        assert _where(client, jid, s, d) == [s.keys.due, d.parts[0].keys.prefix + "moving"]
        (kp,) = [p for p in d.parts if client.zscore(p.keys.due, "k") is not None]
        _run_once(kp, "k")
        expire_record(client, kp, "k")
        assert _reruns(client, (d, s), (s, d)) == []
        assert _where(client, jid, s, d) == [d.parts[d.layout.partition_of_id(jid)].keys.due]
        assert _where(client, "k", s, d) == [] and _settled(client, s, d)


def test_three_moves_in_a_cycle_all_stopped_between_put_and_finish_end_in_reruns_alone(
    client: redis.Redis, make_pq: MakePq
) -> None:
    # a -> b, b -> c, c -> a each took one job and put it, then all stopped: each source holds
    # the next one's record and its own job in `moving`. Whatever the order, reruns alone
    # finish (the first to rerun re-sends, is refused, and frees the next), each job waits in
    # one queue, nothing is left in a `moving` set or a config. b is partitioned, its job
    # sitting in a partition its id does not route to.
    b = make_pq(partitions=2, suffix="-b")
    yid = next(f"y{i}" for i in range(100) if b.layout.partition_of_id(f"y{i}") != 1)
    with made_queues(client, "mvr4-a-", "mvr4-c-") as (a, c):
        a.enqueue("mvr4.task", job_id="x")
        b.parts[1].enqueue("mvr4.task", job_id=yid)
        c.enqueue("mvr4.task", job_id="z")
        runs = [
            (QueueMove(client, a.name, b.name), a, "x"),
            (QueueMove(client, b.name, c.name), b.parts[1], yid),
            (QueueMove(client, c.name, a.name), c, "z"),
        ]
        taken = [m.take(part, [jid]) for m, part, jid in runs]
        assert [m.put(t) for (m, _, _), t in zip(runs, taken, strict=True)] == ["c"] * 3
        assert _reruns(client, (b, c), (c, a), (a, b)) == []
        for jid in ("x", yid, "z"):
            assert len(_where(client, jid, a, b, c)) == 1, (jid, _where(client, jid, a, b, c))
        assert _settled(client, a, b, c)


def test_a_move_into_a_queue_whose_stopped_move_back_holds_a_job_in_moving(
    client: redis.Redis,
) -> None:
    # b -> a took y (b's moving, toward a) and stopped before its put. a -> b, no longer
    # refused for b's busy moving, moves x into b whole; a worker runs x there. b -> a's rerun
    # puts y into a ('c'), then moves b's due (nothing: x ran). y waits in a alone, x ran once.
    with made_queues(client, "mvr4-a-", "mvr4-b-") as (a, b):
        a.enqueue("mvr4.task", job_id="x")
        b.enqueue("mvr4.task", job_id="y")
        ba = QueueMove(client, b.name, a.name)
        assert [e.id for e in ba.take(ba.src[0], ["y"])] == ["y"]  # then stopped
        assert move_queue(client, a.name, b.name).moved == 1
        _run_once(b, "x")
        report = move_queue(client, b.name, a.name)
        assert (report.resumed, report.moved) == (1, 1)
        assert waiting_in(client, "y", a, b) == [a.name] and waiting_in(client, "x", a, b) == []
        assert b.status("x") == "done" and _settled(client, a, b)


def test_a_refused_rerun_whose_resent_job_conflicts_keeps_it_and_the_other_move_finishes(
    client: redis.Redis,
) -> None:
    # a -> b took x and stopped; b -> a put y into a and stopped; then b got a job of its own
    # under the id x. a -> b's rerun re-sends x: 'x' (another job there), back into a's due,
    # and the rerun is refused there (b -> a's record): a's due is not taken. b -> a's rerun
    # finishes y and moves b's x, a conflict in a: both x stay, each in its own queue.
    with made_queues(client, "mvr4-a-", "mvr4-b-") as (a, b):
        a.enqueue("mvr4.task", job_id="x")
        b.enqueue("mvr4.task", job_id="y")
        ab, ba = QueueMove(client, a.name, b.name), QueueMove(client, b.name, a.name)
        assert [e.id for e in ab.take(ab.src[0], ["x"])] == ["x"]  # then stopped
        assert ba.put(ba.take(ba.src[0], ["y"])) == "c"  # then stopped
        b.enqueue("mvr4.other", job_id="x")
        with pytest.raises(MoveRefused, match=f"stopped move from {b.name!r}"):
            move_queue(client, a.name, b.name)
        assert waiting_in(client, "x", a, b) == [a.name, b.name]
        report = move_queue(client, b.name, a.name)
        assert (report.resumed, report.already, report.stays["conflict"]) == (1, 1, 1)
        assert waiting_in(client, "y", a, b) == [a.name]
        assert waiting_in(client, "x", a, b) == [a.name, b.name]
        assert a.get_job("x").task == "mvr4.task" and b.get_job("x").task == "mvr4.other"
        assert _settled(client, a, b)


# -- Random interleavings ---------------------------------------------------------------------


def _steps(m: QueueMove, part: Queue, key: str, resumed: bool) -> Iterator[str]:
    """QueueMove._drain, a yield between its writes (a put per destination partition, a
    finish's move_done and its SREM apart): where a run may die."""
    m.kept = 0
    while ids := [_t(i) for i in m.client.zrange(key, m.kept, m.kept + m.batch - 1)]:
        entries = m.take(part, ids, fresh=not resumed)
        yield "take"
        flags = [""] * len(entries)
        for i, e in enumerate(entries):
            k = 0 if m.dst_layout is None else m.dst_layout.partition_of_id(e.id)
            record_incoming(m.client, m.dst[k], m.report.source)
            yield "record"
            args = ["1", m.report.source, "", e.id, e.run_at_ms, e.spec, json.dumps(e.fields)]
            flags[i] = _t(m.dst[k]._write(_call("move_in", args)))
            yield "put"
        ours = [e.id for e, f in zip(entries, flags, strict=True) if f in "ce"]
        theirs = [e.id for e, f in zip(entries, flags, strict=True) if f not in "ce"]
        if ours:
            part._run(_call("move_done", ["done", "", *ours]))
            yield "done"
            forget_delivered(m.client, m.dst, m.dst_layout, m.report.source, ours)
            yield "srem"
        if theirs:
            m.finish(part, theirs, back=True)
            yield "back"
            if not resumed:
                m.kept += len(theirs)


def _run_steps(m: QueueMove) -> Iterator[str]:
    """QueueMove.run's writes in its order (no lock: the caller runs one source at a time)."""
    m.check(skip_schedules=True)
    yield "check"
    for part in m.src:
        yield from _steps(m, part, part.keys.prefix + "moving", True)
    clear_incoming(m.client, m.src, m.dst, m.report.source)
    yield "clear_incoming"
    stopped = incoming_refusal(m.client, m.src, m.report.source, forget_stale=True)
    yield "incoming"
    for part in m.src if stopped is None else ():
        yield from _steps(m, part, part.keys.due, False)
    for part in m.src:
        m.close(part)
        yield "close"
    clear_incoming(m.client, m.src, m.dst, m.report.source)


@pytest.mark.parametrize("seed", range(12))
def test_random_interleavings_of_three_queues_moves_run_each_job_once(
    client: redis.Redis, make_pq: MakePq, seed: int
) -> None:
    # Moves between three queues (plain or of 3 partitions, jobs written to partitions
    # their ids need not route to) step by step, at most one run of a source at a time (its
    # lock), runs dying between any two writes, workers running (or failing once) jobs, a
    # cancel with its record kept or expired. Then reruns alone must finish, and every job run
    # once (or cancelled: never run).
    rnd = random.Random(seed)
    with made_queues(client, "mvr4-a-", "mvr4-b-", "mvr4-c-") as plain:
        qs: list[Any] = []
        for i, q in enumerate(plain):
            qs.append(q if rnd.random() < 0.5 else make_pq(partitions=3, suffix=f"-{i}"))
        ids = [f"j{i}{n}" for i in range(3) for n in range(4)]
        for jid in ids:
            rnd.choice(_parts(qs[int(jid[1])])).enqueue("mvr4.task", job_id=jid)
        live: dict[int, tuple[int, Iterator[str]]] = {}
        started: set[tuple[int, int]] = set()
        ran: Counter[str] = Counter()
        cancelled: set[str] = set()
        log: list[str] = []
        for _ in range(150):
            act, part = rnd.random(), rnd.choice(_parts(qs[rnd.randrange(3)]))
            if act < 0.2:
                s, d = rnd.sample(range(3), 2)
                if s not in live:
                    m = QueueMove(client, qs[s].name, qs[d].name, batch=rnd.choice([1, 2, 5]))
                    live[s] = (d, _run_steps(m))
                    started.add((s, d))
            elif act < 0.8 and live:
                s = rnd.choice(list(live))
                try:
                    log.append(f"{s}->{live[s][0]} {next(live[s][1])}")
                except (StopIteration, MoveRefused) as exc:
                    log.append(f"{s}->{live[s][0]} ended {exc!r:.60}")
                    del live[s]
            elif act < 0.88 and live:
                log.append(f"{(s := rnd.choice(list(live)))} died")
                del live[s]
            elif act < 0.92 and (due := [_t(j) for j in client.zrange(part.keys.due, 0, -1)]):
                part.cancel(jid := rnd.choice(due))
                if rnd.random() < 0.5:
                    expire_record(client, part, jid)
                cancelled.add(jid)
                log.append(f"cancelled {jid}")
            else:
                for job in part.claim("w", limit=1).jobs:
                    if job.attempts < 2 and rnd.random() < 0.3:
                        part.fail(job.id, job.token, ("E", "once", ""), delay_ms=0)
                        continue
                    part.complete(job.id, job.token)
                    ran[job.id] += 1
                    log.append(f"ran {job.id}")
                    if rnd.random() < 0.5:
                        expire_record(client, part, job.id)
        for p in (p for q in qs for p in _parts(q)):  # the records' takes are old now
            if client.hget(p.keys.config, "move_take_ms") is not None:
                client.hset(p.keys.config, "move_take_ms", 1)
        pairs = sorted(started)
        rnd.shuffle(pairs)
        assert _reruns(client, *((qs[s], qs[d]) for s, d in pairs)) == [], log
        assert _settled(client, *qs), log
        for p in (p for q in qs for p in _parts(q)):
            while jobs := p.claim("w", limit=100).jobs:
                for job in jobs:
                    p.complete(job.id, job.token)
                    ran[job.id] += 1
        assert {j: ran[j] for j in ids if ran[j] != (j not in cancelled)} == {}, log
