"""A worker's complete / fail refused by the server because an operator changed the job while its
handler ran (from a review): its hash deleted or made another type, its token or state edited in
redis-cli, the job cancelled or moved to dead by hand, a queue key edited into another type, a
newer version taking the queue over. Not the lease that lapsed (tests/test_worker_lease_loss.py).

For each: the job is never lost (it runs again, or is parked visibly), the refusal is logged at
WARNING naming the job, the call and the server's status, counted under its glossary word and
given to the outcome hooks (docs/glossary.md, README "--metrics-port"), and the worker goes on
running other jobs. In-process workers on the module's private redis-server; the edit is made
while the handler waits on a gate, with heartbeats far apart so the settle is what meets it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis

from scheduler import Queue
from scheduler.core.connection import connect_async
from scheduler.core.keys import STORAGE_GENERATION
from scheduler.worker import EXIT_OK, Worker, WorkerSettings, logs
from scheduler.worker.outcomes import JobOutcome
from scheduler.worker.registry import JobContext, Registry
from tests.conftest import delete_queue, new_queue
from tests.redis_server import RedisProcess

registry = Registry()
GATES: dict[str, asyncio.Event] = {}  # job id -> set by the test once it has edited the job
RUNS: list[str] = []  # job ids, one per run started
HOOKED: list[tuple[str, str]] = []  # (outcome, job id) the outcome hooks were given


@registry.task(name="sr-gate")
async def gated(payload: Any, ctx: JobContext) -> str:
    RUNS.append(ctx.job_id)
    if payload.get("gate") and RUNS.count(ctx.job_id) == 1:  # its first run waits for the edit
        await GATES.setdefault(ctx.job_id, asyncio.Event()).wait()
    if payload.get("fail"):
        raise ValueError("failed on purpose")
    return "ok"


@registry.on_outcome
def _hooked(out: JobOutcome) -> None:
    HOOKED.append((out.outcome, out.ctx.job_id))


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def of(self, job_id: str) -> list[logging.LogRecord]:
        """The job's transition lines other than its claims."""
        return [
            r
            for r in self.records
            if getattr(r, "job_id", None) == job_id and getattr(r, "event", "") != "claimed"
        ]

    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]


@pytest.fixture
def lines() -> Iterator[Lines]:
    RUNS.clear()
    HOOKED.clear()
    GATES.clear()
    log = logging.getLogger(logs.LOGGER)
    handler, level = Lines(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


@pytest.fixture
def two(module_server: RedisProcess) -> Iterator[tuple[redis.Redis, Queue, Queue]]:
    admin = module_server.client()
    a, b = new_queue(admin, "sr-"), new_queue(admin, "sr-")
    yield admin, a, b
    delete_queue(admin, a)
    delete_queue(admin, b)
    admin.close()


async def poll(cond: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def run(
    server: RedisProcess,
    queues: tuple[str, ...],
    body: Callable[[Worker], Awaitable[None]],
    **kw: Any,
) -> tuple[int, Worker]:
    """An in-process worker of `queues` while body(worker) runs; then stopped: its exit code."""
    kw = {"lease_ms": 60_000, "heartbeat_ms": 5_000, "grace_s": 0, "concurrency": 4, **kw}
    seen: list[Worker] = []

    async def main() -> int:
        c = connect_async(server.url)
        w = Worker(c, registry, WorkerSettings(queues=queues, **kw))
        seen.append(w)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await body(w)
        finally:
            w.request_stop()
            code = await asyncio.wait_for(task, 30)
            await c.aclose()
        return code

    code = asyncio.run(main())
    return code, seen[0]


def outcomes(w: Worker, queue: str) -> dict[str, float]:
    """scheduler_jobs_total of `queue` by outcome (non-zero ones)."""
    out: dict[str, float] = {}
    for family in w.metrics.registry.collect():
        for s in family.samples:
            if s.name == "scheduler_jobs_total" and s.labels["queue"] == queue and s.value:
                out[s.labels["outcome"]] = s.value
    return out


def places(admin: redis.Redis, q: Queue, job_id: str) -> set[str]:
    """Where the job is: the sets holding it, and its state when finished."""
    got = {p for p in ("due", "leased", "dead") if admin.zscore(q.keys.prefix + p, job_id)}
    if admin.type(q.keys.job(job_id)) == "hash":
        state = admin.hget(q.keys.job(job_id), "state")
        if state in ("done", "cancelled"):
            got.add(str(state))
    return got


# -- the edits an operator makes while the handler runs -----------------------------------------
def _hash_deleted(admin: redis.Redis, q: Queue, jid: str) -> None:
    admin.delete(q.keys.job(jid))


def _hash_made_string(admin: redis.Redis, q: Queue, jid: str) -> None:
    admin.delete(q.keys.job(jid))
    admin.set(q.keys.job(jid), "edited")


def _record_deleted(admin: redis.Redis, q: Queue, jid: str) -> None:
    admin.delete(q.keys.job(jid), q.keys.spec(jid))


def _token_edited(admin: redis.Redis, q: Queue, jid: str) -> None:
    admin.hset(q.keys.job(jid), "token", "1-edited")


def _state_edited(admin: redis.Redis, q: Queue, jid: str) -> None:
    admin.hset(q.keys.job(jid), "state", "due")


def _cancelled(admin: redis.Redis, q: Queue, jid: str) -> None:
    assert q.cancel(jid)


def _moved_to_dead(admin: redis.Redis, q: Queue, jid: str) -> None:
    admin.zrem(q.keys.leased, jid)
    admin.zadd(q.keys.dead, {jid: int(time.time() * 1000)})
    admin.hset(q.keys.job(jid), mapping={"state": "dead", "dead_reason": "parked by hand"})


Edit = Callable[[redis.Redis, Queue, str], None]
# (edit, the worker's word, the server's status)
EDITS: dict[str, tuple[Edit, str, str]] = {
    "hash-deleted": (_hash_deleted, "stale", "stale"),
    "hash-made-string": (_hash_made_string, "stale", "missing"),
    "record-deleted": (_record_deleted, "stale", "missing"),
    "token-edited": (_token_edited, "stale", "stale"),
    "state-edited": (_state_edited, "stale", "stale"),
    "cancelled": (_cancelled, "cancelled", "cancelled"),
    "moved-to-dead": (_moved_to_dead, "stale", "stale"),
}


@pytest.mark.parametrize("call", ["complete", "fail"])
@pytest.mark.parametrize("edit", list(EDITS))
def test_a_settle_refused_for_a_hand_edit_is_logged_counted_hooked_and_loses_no_job(
    module_server: RedisProcess,
    two: tuple[redis.Redis, Queue, Queue],
    lines: Lines,
    edit: str,
    call: str,
) -> None:
    admin, q, _ = two
    change, word, status = EDITS[edit]
    jid = q.enqueue("sr-gate", {"gate": True, "fail": call == "fail"})
    after: list[str] = []

    async def body(w: Worker) -> None:
        await poll(lambda: jid in RUNS, "the job running")
        change(admin, q, jid)  # the loop is held here: no heartbeat meets the edit first
        GATES[jid].set()
        await poll(lambda: bool(lines.of(jid)), f"its {call} answered")
        after.append(q.enqueue("sr-gate", {}))  # the worker goes on
        await poll(lambda: q.status(after[0]) == "done", "the next job done")

    code, w = run(module_server, (q.name,), body)
    assert code == EXIT_OK
    (line,) = lines.of(jid)
    got = (line.levelno, line.__dict__.get("event"), line.__dict__.get("refused"))
    assert got == (logging.WARNING, word, call), lines.messages()
    assert line.__dict__.get("status") == status
    assert outcomes(w, q.name) == {word: 1, "done": 1}
    assert (word, jid) in HOOKED
    # Never lost: its lease lapses (forced here) and the next claim reaps it; or it is finished.
    if admin.zscore(q.keys.leased, jid) is not None:
        admin.zadd(q.keys.leased, {jid: 1})
        q.claim("sr-probe", limit=10, lease_ms=60_000)
    assert places(admin, q, jid), f"job {jid} is in no place after {edit}"


def test_one_refused_complete_leaves_the_others_of_its_batch_done(
    module_server: RedisProcess, two: tuple[redis.Redis, Queue, Queue], lines: Lines
) -> None:
    admin, q, _ = two
    gone = q.enqueue("sr-gate", {"gate": True})
    kept = q.enqueue("sr-gate", {"gate": True})

    async def body(w: Worker) -> None:
        await poll(lambda: gone in RUNS and kept in RUNS, "both jobs running")
        _hash_made_string(admin, q, gone)
        GATES[gone].set()
        GATES[kept].set()  # both end in the same tick: one complete_many
        await poll(lambda: bool(lines.of(gone)) and bool(lines.of(kept)), "both answered")

    code, w = run(module_server, (q.name,), body)
    assert code == EXIT_OK
    assert q.status(kept) == "done"
    assert [r.__dict__.get("event") for r in lines.of(kept)] == ["done"]
    assert outcomes(w, q.name) == {"stale": 1, "done": 1}


def test_a_fail_refused_for_a_key_edited_by_hand_is_sent_again_once_fixed(
    module_server: RedisProcess, two: tuple[redis.Redis, Queue, Queue], lines: Lines
) -> None:
    """dead edited into a string: the park is refused (CorruptKey), the worker backs off and
    keeps the lease; once the key is fixed the fail goes through with the handler's error."""
    admin, q, other = two
    jid = q.enqueue("sr-gate", {"gate": True, "fail": True}, max_attempts=1)
    elsewhere: list[str] = []

    async def body(w: Worker) -> None:
        await poll(lambda: jid in RUNS, "the job running")
        admin.set(q.keys.dead, "edited")
        GATES[jid].set()
        refused = "during report: CorruptKey"
        await poll(lambda: any(refused in m for m in lines.messages()), "the park refused")
        elsewhere.append(other.enqueue("sr-gate", {}))  # its other queue is served meanwhile
        await poll(lambda: other.status(elsewhere[0]) == "done", "the other queue's job done")
        admin.delete(q.keys.dead)  # the fix (doctor's, by hand here)
        await poll(lambda: q.status(jid) == "dead", "the fail sent again")

    code, w = run(module_server, (q.name, other.name), body)
    assert code == EXIT_OK
    job = q.get_job(jid)
    assert (job.fields.get("last_error_type"), job.fields.get("dead_reason")) == (
        "ValueError",
        "attempts exhausted",
    )
    assert outcomes(w, q.name) == {"dead": 1}
    assert ("dead", jid) in HOOKED


# -- findings (fixed) ------------------------------------------------------------------------------
@pytest.mark.parametrize("refusal", ["corrupt-key", "newer-storage"])
def test_a_fail_given_up_at_the_stop_is_logged_as_the_fail_it_was(
    module_server: RedisProcess,
    two: tuple[redis.Redis, Queue, Queue],
    lines: Lines,
    refusal: str,
) -> None:
    """The glossary: a refused complete, fail or release is logged with `refused=<call>`. A
    fail the server refuses until someone acts (a key edited by hand, a newer version's queue)
    is given up at the stop; its line said refused=complete."""
    admin, q, _ = two
    jid = q.enqueue("sr-gate", {"gate": True, "fail": True}, max_attempts=1)

    async def body(w: Worker) -> None:
        await poll(lambda: jid in RUNS, "the job running")
        if refusal == "corrupt-key":
            admin.set(q.keys.dead, "edited")
        else:
            admin.hset(q.keys.config, "generation", str(STORAGE_GENERATION + 1))
        GATES[jid].set()
        await poll(lambda: any("during report" in m for m in lines.messages()), "fail refused")

    code, _ = run(module_server, (q.name,), body)
    assert code == EXIT_OK
    assert any("given up at stop" in m for m in lines.messages()), lines.messages()
    (line,) = lines.of(jid)
    assert (line.__dict__.get("event"), line.__dict__.get("refused")) == ("stale", "fail")
    status = {"corrupt-key": "CorruptKey", "newer-storage": "NewerStorage"}[refusal]
    assert line.__dict__.get("status") == status  # the server's answer, as for any refusal


def test_a_running_job_whose_record_is_gone_is_reported_stale_not_expired(
    module_server: RedisProcess, two: tuple[redis.Redis, Queue, Queue], lines: Lines
) -> None:
    """The operator deletes a running job's record (hash and spec). The heartbeat answers
    'missing'; the worker stopped the run and said `expired` ("the lease ran out before the
    worker reported"), with no status: the lease had 60 s left. docs/glossary.md: `stale` is
    a result refused because ... the job is gone (`missing`)."""
    admin, q, _ = two
    jid = q.enqueue("sr-gate", {"gate": True})

    async def body(w: Worker) -> None:
        await poll(lambda: jid in RUNS, "the job running")
        _record_deleted(admin, q, jid)
        await poll(lambda: bool(lines.of(jid)), "the heartbeat meeting the edit")

    code, w = run(module_server, (q.name,), body, heartbeat_ms=50)
    assert code == EXIT_OK
    (line,) = lines.of(jid)
    assert (line.__dict__.get("event"), line.__dict__.get("status")) == ("stale", "missing")
    assert outcomes(w, q.name) == {"stale": 1}
