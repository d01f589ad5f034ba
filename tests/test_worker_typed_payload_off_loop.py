"""A large payload's typed build (a task's payload_type: dataclass, pydantic model) is done off
the event loop where its JSON decode is (scheduler/worker/payload_decode.py), for an async
handler too: it ran on the loop in the handler's wrapper, so a big model's validation held
every heartbeat and every other job's start. A small payload's build stays on the loop (the hot
path: a thread's hand-over would cost more than it).

Whether the loop was free while a build ran is probed from inside the build: it asks the loop to
run a callback and waits for it (bounded); a build on the loop's thread is one no callback can
interleave with. Never a duration.

A payload that cannot be decoded (not JSON, or not the typed shape) ends as a small one does,
whatever its size: same error type and text, attempts, dead line and metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import uuid
from typing import Any

import pydantic
import pytest
import redis

from scheduler import JobContext, JobSpec, Queue, Registry
from scheduler._spawn import RedisProcess
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.payload_decode import OFF_LOOP_CHARS, Undecodable, Undecoded
from scheduler.worker.payloads import PayloadMisfit
from tests.embedded_worker import run_until

registry = Registry()
# (kind, job's row count, the loop ran a callback while the build ran)
built: list[tuple[str, int, bool]] = []
seen: list[tuple[str, str, Any]] = []  # (task, job id, what the handler got)
_loop: list[tuple[asyncio.AbstractEventLoop, int]] = []  # the worker's loop and its thread


def probe(kind: str, n_rows: int) -> None:
    loop, thread = _loop[0]
    if threading.get_ident() == thread:
        free = False  # on the loop's thread: nothing else runs there until the build returns
    else:
        ran = threading.Event()
        loop.call_soon_threadsafe(ran.set)
        free = ran.wait(30)  # a liveness bound: it is set at the loop's next turn
    built.append((kind, n_rows, free))


@dataclasses.dataclass
class Rows:
    rows: list[Any]
    note: str = ""

    def __post_init__(self) -> None:
        if self.note.startswith("refuse"):
            raise ValueError("rows refused by their own check")
        if self.note.startswith("boom"):  # not a check: an error, retried as a handler's is
            raise RuntimeError("boom in __post_init__")
        probe("dataclass", len(self.rows))


class RowsModel(pydantic.BaseModel):
    rows: list[dict[str, Any]]

    @pydantic.model_validator(mode="after")
    def _probe(self) -> RowsModel:
        probe("pydantic", len(self.rows))
        return self


@registry.task("tpo.dc", payload_type=Rows)
async def dc(payload: Rows, ctx: JobContext) -> None:
    seen.append(("tpo.dc", ctx.job_id, payload))


@registry.task("tpo.pyd", payload_type=RowsModel)
async def pyd(payload: RowsModel, ctx: JobContext) -> None:
    seen.append(("tpo.pyd", ctx.job_id, payload))


@registry.task("tpo.sync", payload_type=Rows)
def sync_dc(payload: Rows, ctx: JobContext) -> None:
    seen.append(("tpo.sync", ctx.job_id, payload))


def rows(chars: int) -> list[dict[str, Any]]:
    return [{"id": i, "name": f"item-{i:05d}", "qty": i % 7} for i in range(chars // 41)]


def setup_probe(worker: Worker) -> None:
    _loop[:] = [(asyncio.get_running_loop(), threading.get_ident())]


def fresh(server: RedisProcess) -> Queue:
    return Queue.from_url(server.url, "tpo-" + uuid.uuid4().hex[:10])


@pytest.fixture(autouse=True)
def _clear() -> None:
    built.clear()
    seen.clear()


@pytest.mark.parametrize(("task", "kind"), [("tpo.dc", "dataclass"), ("tpo.pyd", "pydantic")])
def test_a_large_typed_payload_is_built_off_the_loop_a_small_one_on_it(
    module_server: RedisProcess, task: str, kind: str
) -> None:
    """Before: the large ones' builds ran on the loop's thread ((kind, n, False))."""
    q = fresh(module_server)
    large, small = rows(OFF_LOOP_CHARS * 3), rows(2 * 1024)
    ids = q.enqueue_many([JobSpec(task, {"rows": r}) for r in (large, large, small, small)])
    settings = WorkerSettings(queues=(q.name,), concurrency=4, batch_size=4, grace_s=0)
    assert run_until(module_server.url, registry, settings, lambda: len(seen) == 4,
                     setup=setup_probe)  # fmt: skip
    assert sorted(built) == sorted([(kind, len(large), True)] * 2 + [(kind, len(small), False)] * 2)
    got = {job_id: len(p.rows) for _, job_id, p in seen}
    assert got == dict(zip(ids, [len(large)] * 2 + [len(small)] * 2, strict=True))
    assert {type(p) for _, _, p in seen} == {Rows if kind == "dataclass" else RowsModel}


mw_registry = Registry()
mw_seen: list[Any] = []


@mw_registry.middleware
async def strip(call_next: Any, payload: Any, ctx: JobContext) -> Any:
    mw_seen.append(type(payload))  # the decoded JSON, never the typed object
    payload.pop("drop", None)  # in place: the build must see what the middleware passed on
    return await call_next(payload, ctx)


@mw_registry.task("tpo.mw", payload_type=Rows)
async def mw_dc(payload: Rows, ctx: JobContext) -> None:
    seen.append(("tpo.mw", ctx.job_id, payload))


def test_under_an_async_middleware_the_build_is_off_the_loop_of_what_it_passes_on(
    module_server: RedisProcess,
) -> None:
    q = fresh(module_server)
    large = rows(OFF_LOOP_CHARS * 2)
    q.enqueue_many([JobSpec("tpo.mw", {"rows": large, "drop": 1})])
    settings = WorkerSettings(queues=(q.name,), grace_s=0)
    assert run_until(module_server.url, mw_registry, settings, lambda: len(seen) == 1,
                     setup=setup_probe)  # fmt: skip
    assert built == [("dataclass", len(large), True)]
    assert mw_seen == [dict]
    assert isinstance(seen[0][2], Rows) and len(seen[0][2].rows) == len(large)


PAD = "p" * OFF_LOOP_CHARS
BAD = {  # how a payload is bad -> its stored text, small and large
    "not json": ('{"rows": [], "x": NaN}', f'{{"rows": [], "note": "{PAD}", "x": NaN}}'),
    "unknown field": ('{"rows": [], "pad": "p"}', f'{{"rows": [], "pad": "{PAD}"}}'),
    "own check": ('{"rows": [], "note": "refuse"}', f'{{"rows": [], "note": "refuse{PAD}"}}'),
    "not an object": ("[1]", f'["{PAD}"]'),
    "build raises": ('{"rows": [], "note": "boom"}', f'{{"rows": [], "note": "boom{PAD}"}}'),
}
CASES = [
    (how, task)
    for how in sorted(BAD)
    for task in ("tpo.dc", "tpo.pyd", "tpo.sync")
    # RowsModel has no own check, and no __post_init__
    if task != "tpo.pyd" or how not in ("own check", "build raises")
]


def records(worker: Worker, into: list[logging.LogRecord]) -> None:
    log = logging.getLogger("scheduler.test." + uuid.uuid4().hex[:8])
    log.propagate = False
    log.setLevel(logging.INFO)

    class ToList(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            into.append(record)

    log.handlers[:] = [ToList()]
    worker.log = log


@pytest.mark.parametrize(("how", "task"), CASES)
def test_a_large_bad_payload_ends_exactly_as_a_small_one(
    module_server: RedisProcess, how: str, task: str
) -> None:
    """Each on its own queue, one worker for both: the job's fields, its dead line and its
    queue's metrics (outcomes, runs timed, done) are the same for the small and the large. A
    misfit or an error of the build is raised where the small one's is (the handler's wrapper),
    though the large one's build ran with its decode, off the loop."""
    raw = redis.Redis.from_url(module_server.url)
    small_q, large_q = fresh(module_server), fresh(module_server)
    ids = []
    for q, text in zip((small_q, large_q), BAD[how], strict=True):
        (job_id,) = q.enqueue_many([JobSpec(task, {"rows": []}, max_attempts=1)])
        raw.hset(q.keys.job(job_id), "payload", text)
        ids.append(job_id)
    logged: list[logging.LogRecord] = []
    workers: list[Worker] = []

    def setup(worker: Worker) -> None:
        setup_probe(worker)
        records(worker, logged)
        workers.append(worker)

    def ended() -> bool:
        return all(
            q.status(j) in ("dead", "done") for q, j in zip((small_q, large_q), ids, strict=True)
        )

    settings = WorkerSettings(queues=(small_q.name, large_q.name), grace_s=0)
    assert run_until(module_server.url, registry, settings, ended, setup=setup)
    fields = [q.get_job(j).fields for q, j in zip((small_q, large_q), ids, strict=True)]
    got = [(f["state"], f.get("last_error_type"), f.get("last_error"), f["attempts"])
           for f in fields]  # fmt: skip
    if how == "unknown field" and task == "tpo.pyd":  # pydantic ignores an extra field
        assert [g[0] for g in got] == ["done", "done"]
    else:
        error_type = "RuntimeError" if how == "build raises" else "InvalidPayload"
        assert got[0][:2] == ("dead", error_type) and got[0][3] == "1"
        assert got[1] == got[0]
    m = workers[0].metrics

    def counted(q: Queue) -> tuple[Any, ...]:
        st = m.per_task(q.name, task)
        outcomes = sorted((o, n) for (qn, t, o), n in m._outcomes.items() if qn == q.name)
        return outcomes, st.done, sum(st.duration.counts), sum(st.lateness.counts)

    assert counted(small_q) == counted(large_q)
    ended_lines = {
        r.job_id: (r.event, hasattr(r, "duration_ms"), getattr(r, "error_type", None))  # type: ignore[attr-defined]
        for r in logged
        if getattr(r, "event", "") in ("dead", "done")
    }
    assert ended_lines[ids[0]] == ended_lines[ids[1]]


def test_a_prebuilt_payload_is_handed_over_for_its_own_payload_only() -> None:
    """What the wrapper gets for the payload decoded with it: the object built (or the build's
    error, raised there); for any other payload (a middleware's), a build of that one."""
    _loop[:] = [(asyncio.new_event_loop(), -1)]  # probe(): a build never on this thread
    loop = _loop[0][0]
    try:
        big = loop.run_until_complete(Undecoded('{"rows": [1, 2]}').off_loop_for(Rows))
        mine = loop.run_until_complete(big.typed(Rows, big.data))
        assert built == [("dataclass", 2, True)]  # with the decode, once
        assert type(mine) is Rows and mine.rows == [1, 2]
        other = loop.run_until_complete(big.typed(Rows, {"rows": [3]}))
        assert type(other) is Rows and other.rows == [3]
        assert built[1:] == [("dataclass", 1, True)]
        bad = loop.run_until_complete(Undecoded('{"rows": [], "x": 1}').off_loop_for(Rows))
        with pytest.raises(PayloadMisfit, match="unexpected keyword argument 'x'"):
            loop.run_until_complete(bad.typed(Rows, bad.data))
        with pytest.raises(Undecodable):
            loop.run_until_complete(Undecoded("[NaN]").off_loop_for(Rows))
    finally:
        loop.close()
