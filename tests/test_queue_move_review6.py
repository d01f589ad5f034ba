"""Review 6 of `scheduler queue move` (after 4b4841d): real concurrency (two or three
`move_queue` calls in threads, each with its own client, workers running jobs in every queue
at the same time, leases short enough to lapse mid-run), the idempotency keys a run carries
for jobs gone from the source (queue_move_keys.moved), and a run that lost its lock between
its put's renewal and the put itself."""

from __future__ import annotations

import os
import random
import threading
from collections import Counter
from typing import Any

import pytest
import redis

import scheduler.admin.queue_move as queue_move_mod
from scheduler.admin.queue_move import MoveRefused, QueueMove, move_queue
from scheduler.admin.queue_move_check import record_incoming
from scheduler.admin.queue_move_check import text as _t
from scheduler.admin.queue_move_lock import lock_key
from scheduler.client.queue import Queue
from scheduler.core.connection import connect
from scheduler.core.errors import BadArgument
from scheduler.core.partitions import meta_key
from tests.fixtures.move_queues import expire_record, made_queues
from tests.fixtures.partitioned import MakePq
from tests.test_queue_move_review4 import _parts, _reruns, _run_once, _settled, _where

# -- Defects this review found (each failed before its fix) ----------------------------------


def test_a_carried_key_names_a_job_finished_in_the_source_and_reused_in_the_destination(
    client: redis.Redis,
) -> None:
    # The user picks job ids ("invoice-7") in both queues. In a, the keyed job invoice-7 ran
    # and its record expired; its key stays (key_ttl_ms, 24 h past its run time). b holds
    # another job invoice-7, never claimed. A move a -> b (any run, not only a rerun) reads
    # a's key through queue_move_keys.moved: its job is gone from a and b holds the id, so
    # the key is carried into b, naming b's unrelated job. A debounced keyed enqueue re-sent
    # to b then replaces that job's task and payload (it was never claimed): changed; without
    # debounce, it returns the other job's id.
    with made_queues(client, "mvr6-a-", "mvr6-b-") as (a, b):
        x = a.enqueue("mvr6.src", {"src": 1}, key="order-7", job_id="invoice-7")
        _run_once(a, x)
        expire_record(client, a, x)
        b.enqueue("mvr6.dst", {"dst": 2}, job_id="invoice-7")
        a.enqueue("mvr6.other", {"n": 3})  # something to move
        report = move_queue(client, a.name, b.name)
        assert report.moved == 1
        got = b.enqueue("mvr6.new", {"new": 4}, key="order-7", debounce=True)
        job = b.get_job("invoice-7")
        assert (job.task, job.payload(), got != "invoice-7") == ("mvr6.dst", {"dst": 2}, True)


def test_a_run_that_lost_its_lock_after_its_put_renewal_is_refused_its_put(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Run A took j (a's moving) and renewed its lock in put(); it paused there (GC, a stalled
    # network) past its lease, before move_in. Run B took the lock over, re-sent j from
    # moving ('c'), finished it and ended (its kept ids forgotten); j ran in b and its record
    # expired. A woke: move_in holds no lock check (the put is no atomic step with the
    # renewal), so it wrote j into b again ('c'); A's finish is refused (MOVE_LOCKED), too
    # late: j waits in b and runs a second time. Reruns alone do not notice.
    with made_queues(client, "mvr6-a-", "mvr6-b-") as (a, b):
        jid = a.enqueue("mvr6.t", {"n": 1})
        real = record_incoming
        fired: list[int] = []

        def paused(c: redis.Redis, part: Queue, source: str) -> None:
            if not fired:
                fired.append(1)
                client.delete(lock_key(a))  # A's lease lapsed while it paused
                move_queue(client, a.name, b.name)  # B re-sends j and ends
                _run_once(b, jid)
                expire_record(client, b, jid)
            real(c, part, source)

        monkeypatch.setattr(queue_move_mod, "record_incoming", paused)
        with pytest.raises(MoveRefused, match="lost its lock"):
            QueueMove(client, a.name, b.name).run()
        monkeypatch.undo()
        assert _reruns(client, (a, b)) == []
        assert client.zscore(b.keys.due, jid) is None, "j ran in b and waits there again"


def _pause_at_forget(monkeypatch: pytest.MonkeyPatch, dst: Queue, then: Any) -> list[int]:
    """`then()` runs once, when `dst` is sent its first move_done 'forget' (clear_incoming's
    deletion, after its check of the source's `moving`): a run paused there."""
    real_run, fired = dst._run, list[int]()

    def paused(gen: Any) -> Any:
        args = (gen.gi_frame.f_locals.get("args") or [None]) if gen.gi_frame else [None]
        if not fired and args[0] == "forget":
            fired.append(1)
            then()
        return real_run(gen)

    monkeypatch.setattr(dst, "_run", paused)
    return fired


def test_a_run_that_lost_its_lock_inside_its_end_deletes_the_next_runs_kept_ids(
    client: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Run A renewed its lock before its end writes (4b4841d), and clear_incoming found a's
    # moving empty; A paused there past its lease. Meanwhile j2 was enqueued into a, run B took
    # the lock, took j2 and put it into b (its record `move_from:a` and kept id `move_in:a`),
    # then stopped before its finish (a crash; its lock expired since). A woke and deleted
    # both: the check and the deletion were no atomic step. j2 ran in b and its record
    # expired; B's rerun re-sent j2 from a's moving: no kept id, so 'c', written into b
    # again: run twice. Now A deletes only the record value it read before its check (B's
    # put wrote a new one): nothing of B's.
    with made_queues(client, "mvr6-a-", "mvr6-b-") as (a, b):
        a.enqueue("mvr6.t", {"n": 1})
        own = connect(redis_url)
        state: dict[str, str] = {}

        def b_runs() -> None:
            client.delete(lock_key(a))  # A's lease lapsed while it paused
            state["j2"] = j2 = a.enqueue("mvr6.t", {"n": 2})
            stopped = QueueMove(client, a.name, b.name)
            stopped.lock.take()
            assert stopped.put(stopped.take(a, [j2])) == "c"  # then B stops
            client.delete(lock_key(a))  # B's lock expired since

        run = QueueMove(own, a.name, b.name)
        fired = _pause_at_forget(monkeypatch, run.dst[0], b_runs)
        run.run()
        monkeypatch.undo()
        own.close()
        assert fired == [1]
        j2 = state["j2"]
        _run_once(b, j2)
        expire_record(client, b, j2)
        assert _reruns(client, (a, b)) == []
        assert client.zscore(b.keys.due, j2) is None, "j2 ran in b and waits there again"


def test_a_run_that_lost_its_lock_inside_forget_kept_deletes_the_next_runs_kept_ids(
    client: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same gap after the moving re-sends (0746687's forget_kept, now clear_incoming): an
    # earlier run left its record in b (cut after its finish). A found a's moving empty and
    # paused past its lease before deleting b's `move_in:a`. B took the lock, took j and put
    # it into b, then stopped before its finish. A woke and deleted B's kept id; its next take
    # was refused (lost lock). j ran in b and its record expired; B's rerun re-sent j: no kept
    # id, 'c', written into b again: run twice.
    with made_queues(client, "mvr6-a-", "mvr6-b-") as (a, b):
        a.enqueue("mvr6.t", {"n": 0}, job_id="j0")
        earlier = QueueMove(client, a.name, b.name)
        assert earlier.put(earlier.take(a, ["j0"])) == "c"
        earlier.finish(a, ["j0"])  # then cut: b keeps its record
        jid = a.enqueue("mvr6.t", {"n": 1})
        own = connect(redis_url)

        def b_runs() -> None:
            client.delete(lock_key(a))  # A's lease lapsed while it paused
            stopped = QueueMove(client, a.name, b.name)
            stopped.lock.take()
            assert stopped.put(stopped.take(a, [jid], fresh=True)) == "c"  # then B stops
            client.delete(lock_key(a))  # B's lock expired since

        run = QueueMove(own, a.name, b.name)
        fired = _pause_at_forget(monkeypatch, run.dst[0], b_runs)
        with pytest.raises(MoveRefused, match="lost its lock"):
            run.run()
        monkeypatch.undo()
        own.close()
        assert fired == [1]
        _run_once(b, jid)
        expire_record(client, b, jid)
        assert _reruns(client, (a, b)) == []
        assert client.zscore(b.keys.due, jid) is None, "j ran in b and waits there again"


def test_a_partition_is_moved_as_a_source_while_its_layout_record_is_unreadable(
    client: redis.Redis, make_pq: MakePq
) -> None:
    # check_names reads the layout of the queue a partition-looking --from name belongs to, and
    # takes an unreadable record as "no layout": the partition is moved on its own (the
    # refusal of 5456d3d is bypassed). Its run keeps its records under the partition's name;
    # stopped after its put, j ran in b. Once the record is mended (doctor names it), the
    # rerun can only be of the queue a (the partition is refused again), which finds no kept
    # id under 'a': j's kept record answers 'x' and j goes back into a's due: run twice.
    a = make_pq(partitions=2, suffix="-a")
    with made_queues(client, "mvr6-b-") as (b,):
        jid = a.enqueue("mvr6.task", {"n": 1})
        part = a.parts[a.layout.partition_of_id(jid)]
        good = client.get(meta_key(a.name))
        assert good is not None
        client.set(meta_key(a.name), "unreadable by hand")
        # Now refused while the record cannot be read (it may be a partition), nothing written.
        for src, dst in ((part.name, b.name), (b.name, part.name)):
            with pytest.raises(BadArgument, match="layout record cannot be read"):
                QueueMove(client, src, dst)
        assert _where(client, jid, a, b) == [part.keys.due] and client.zcard(b.keys.due) == 0
        client.set(meta_key(a.name), good)
        assert move_queue(client, a.name, b.name).moved == 1
        _run_once(b, jid)
        assert _where(client, jid, a, b) == [] and _settled(client, a, b)


PLANS = [1, 2, 200, 30_000, -1, -2]  # a run's lease in ms, or a stopped run (_mover)

# -- Guard: real runs in threads, workers beside them -----------------------------------------


class _Workers:
    """A thread claiming and completing jobs in every partition of the queues: each completion
    is counted by id, and a payload that is not the enqueued one is recorded. A job whose
    payload says `fail` fails its first attempt (retried at once): its second attempt is the
    one that completes, its attempts counted there."""

    def __init__(self, url: str, parts: list[Queue], expected: dict[str, Any]) -> None:
        self.client = connect(url)
        self.parts = [Queue(self.client, p.name) for p in parts]
        self.expected = expected
        self.runs: Counter[str] = Counter()
        self.bad: list[str] = []
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def one_round(self) -> int:
        got = 0
        for p in self.parts:
            for j in p.claim("w6", limit=10, lease_ms=120_000).jobs:
                if j.payload() != self.expected.get(j.id):
                    self.bad.append(f"{j.id}: {j.payload()!r}")
                if j.payload().get("fail") and j.attempts == 1:
                    p.fail(j.id, j.token, ("E", "first attempt", ""), delay_ms=0)
                    got += 1
                    continue
                if j.attempts != (2 if j.payload().get("fail") else 1):
                    self.bad.append(f"{j.id}: attempt {j.attempts}")
                self.runs[j.id] += 1
                p.complete(j.id, j.token)
                got += 1
        return got

    def _loop(self) -> None:
        try:
            while not self.stop.is_set():
                if not self.one_round():
                    self.stop.wait(0.002)  # a worker's idle poll, not a wait for a state
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)


def _crash(c: redis.Redis, src: str, dst: str, batch: int, after_put: bool) -> None:
    """A run stopped for good after one take (or its put): its 1 ms lock left to expire."""
    run = QueueMove(c, src, dst, batch=batch, lease_ms=1)
    run.lock.look()
    run.check(skip_schedules=False, dry_run=True)
    run.lock.take()
    run.check(skip_schedules=False)
    for part in run.src:
        ids = [_t(i) for i in c.zrange(part.keys.due, 0, batch - 1)]
        entries = run.take(part, ids, fresh=True) if ids else []
        if entries:
            if after_put:
                run.put(entries)
            return


def _mover(url: str, src: str, dst: str, batch: int, plan: list[int], out: list[str]) -> None:
    """Runs of src -> dst one after the other: a lease in ms, or -1 / -2 a run stopped after
    its first take / put (`_crash`)."""
    c = connect(url)
    try:
        for lease in plan:
            try:
                if lease < 0:
                    _crash(c, src, dst, batch, after_put=lease == -2)
                else:
                    move_queue(c, src, dst, batch=batch, lease_ms=lease)
            except MoveRefused as exc:  # a held lock, a lost one, another destination...
                out.append(f"refused {src}->{dst}: {exc}")
    except BaseException as exc:
        out.append(f"ERROR {src}->{dst}: {exc!r}")
    finally:
        c.close()


@pytest.mark.parametrize("seed", range(1, 1 + int(os.environ.get("MVR6_SEEDS", "2"))))
@pytest.mark.parametrize("shape", ["swap", "chain", "twin"])
@pytest.mark.parametrize("kind", ["plain", "partitioned"])
def test_threaded_moves_with_workers_run_each_job_once(
    client: redis.Redis, make_pq: MakePq, redis_url: str, kind: str, shape: str, seed: int
) -> None:
    # Three move threads at once (swap: a->b, b->a, a->b; chain: a->b, b->c, a->b; twin: a->b
    # three times: the lock refuses all but one, or a run takes over a lapsed lock), each
    # making six runs one after the other, drawn from a lease of 1 ms or 2 ms (lapses between
    # most steps: the run that lost it is refused its next take or finish), 200 ms, 30 s, or
    # a run stopped for good after its first take or put (its 1 ms lock left to expire),
    # while a worker runs jobs in every queue (a tenth fail their first attempt, retried at
    # once; a third's results expire after 1 ms; a fifth are keyed). Then reruns alone, then
    # the worker drains: every job completed exactly once, on its expected attempt, with its
    # payload; a keyed enqueue re-sent to any queue names its own job or a new one.
    # MVR6_SEEDS=50 runs 300 cases (passed: ~50 s).
    rng = random.Random(seed)
    with made_queues(client, "mvr6-a-", "mvr6-b-", "mvr6-c-") as plain:
        qs: list[Any] = (
            plain if kind == "plain" else [make_pq(partitions=2, suffix=f"-{s}") for s in "abc"]
        )
        a, b, c = qs
        expected: dict[str, Any] = {}
        keyed: dict[str, str] = {}
        sources = [a, b] if shape in ("swap", "chain") else [a]
        for n in range(300):
            q = rng.choice(sources)
            fail = rng.random() < 0.1
            payload = {"n": n, "from": q.name, "pad": "x" * rng.randrange(0, 40), "fail": fail}
            ttl = 1 if rng.random() < 0.33 else None
            key = f"k{n}" if rng.random() < 0.2 else None
            jid = q.enqueue("mvr6.s", payload, result_ttl_ms=ttl, key=key)
            expected[jid] = payload
            if key:
                keyed[key] = jid
        pairs = {
            "swap": [(a, b), (b, a), (a, b)],
            "chain": [(a, b), (b, c), (a, b)],
            "twin": [(a, b), (a, b), (a, b)],
        }[shape]
        workers = _Workers(redis_url, [p for q in qs for p in _parts(q)], expected)
        workers.thread.start()
        out: list[str] = []
        movers = [
            threading.Thread(
                target=_mover,
                args=(redis_url, s.name, d.name, 7, rng.choices(PLANS, k=6), out),
            )
            for s, d in pairs
        ]
        for t in movers:
            t.start()
        for t in movers:
            t.join()
        workers.stop.set()
        workers.thread.join()
        assert [o for o in out if o.startswith("ERROR")] == [] and workers.errors == []
        assert _reruns(client, *dict.fromkeys((s, d) for s, d in pairs)) == []
        assert _settled(client, *qs)
        while workers.one_round():
            pass
        left = [p.name for q in qs for p in _parts(q) if client.zcard(p.keys.due)]
        assert left == [] and workers.bad == []
        assert {j for j, n in workers.runs.items() if n != 1} == set()
        assert set(workers.runs) == set(expected)
        # A keyed enqueue re-sent anywhere names its own job or a new one, never another's.
        again = {(k, q.name): q.enqueue("mvr6.s", None, key=k) for k in keyed for q in qs}
        assert [kq for kq, j in again.items() if j != keyed[kq[0]] and j in expected] == []
        workers.client.close()
