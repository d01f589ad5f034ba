"""A claimed job's payload is decoded off the event loop when it is large (scheduler/worker/
payload_decode.py): a claim's jobs start in one step of the loop, and each decoded its payload
there, so a batch of large payloads held every heartbeat (100 structured 512 KB ones: 2.8 s).
Small payloads, the common case, are still decoded at claim; a payload that is not JSON is
parked as InvalidPayload with the same text whatever its size.

What is counted is the payload text decoded on the loop's thread between two turns of it (a
callback that re-schedules itself marks each turn), never a duration."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis

import scheduler.worker.dispatch as dispatch
from scheduler import JobContext, JobSpec, Queue, Registry
from scheduler._spawn import RedisProcess
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.payload_decode import (
    OFF_LOOP_CHARS,
    STEP_CHARS,
    Undecodable,
    Undecoded,
    not_json,
)
from tests.embedded_worker import run_until

registry = Registry()
seen: list[tuple[str, int]] = []  # (job id, rows) as each handler got its payload
lock = threading.Lock()


@registry.task("pd.sync")
def sync_rows(payload: Any, ctx: JobContext) -> None:
    with lock:
        seen.append((ctx.job_id, len(payload.get("rows", []))))


@registry.task("pd.async")
async def async_rows(payload: Any, ctx: JobContext) -> None:
    seen.append((ctx.job_id, len(payload.get("rows", []))))


@dataclasses.dataclass
class Rows:
    rows: list[int]


@registry.task("pd.typed", payload_type=Rows)
async def typed_rows(payload: Rows, ctx: JobContext) -> None:
    seen.append((ctx.job_id, len(payload.rows)))


def rows(chars: int) -> dict[str, list[dict[str, Any]]]:
    """A structured payload (many small objects, the costly kind to decode) of about `chars`."""
    n = chars // 41
    return {"rows": [{"id": i, "name": f"item-{i:05d}", "qty": i % 7} for i in range(n)]}


class OnLoop:
    """Payload text decoded on the loop's thread, per turn of the loop (dispatch.load_stored)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.per_turn: Counter[int] = Counter()
        self.sizes: list[int] = []
        self._thread: list[int] = []
        self._turn = 0
        real = dispatch.load_stored  # type: ignore[attr-defined]

        def counting(text: str) -> Any:
            if self._thread and threading.get_ident() == self._thread[0]:
                self.per_turn[self._turn] += len(text)
                self.sizes.append(len(text))
            return real(text)

        monkeypatch.setattr(dispatch, "load_stored", counting)

    def setup(self, worker: Worker) -> None:
        loop = asyncio.get_running_loop()
        self._thread.append(threading.get_ident())

        def tick() -> None:  # once per turn: what runs between two ticks is one step
            self._turn += 1
            loop.call_soon(tick)

        loop.call_soon(tick)

    def worst(self) -> int:
        return max(self.per_turn.values(), default=0)


def run(url: str, name: str, n: int, done: Callable[[], bool], on: OnLoop) -> None:
    settings = WorkerSettings(queues=(name,), concurrency=n, batch_size=n, grace_s=0)
    assert run_until(url, registry, settings, done, setup=on.setup)


def fresh(server: RedisProcess) -> Queue:
    return Queue.from_url(server.url, "pd-" + uuid.uuid4().hex[:10])


@pytest.fixture(autouse=True)
def _clear() -> None:
    seen.clear()


def test_an_async_handlers_large_payloads_are_decoded_off_the_loop(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the 8 payloads (1.6 MB) were decoded in the one step that started the claim."""
    q, on, payload = fresh(module_server), OnLoop(monkeypatch), rows(200 * 1024)
    ids = q.enqueue_many([JobSpec("pd.async", payload) for _ in range(8)])
    run(module_server.url, q.name, 8, lambda: len(seen) == 8, on)
    assert sorted(seen) == sorted((i, len(payload["rows"])) for i in ids)
    assert [s for s in on.sizes if s >= OFF_LOOP_CHARS] == []
    assert on.worst() <= STEP_CHARS


@pytest.mark.parametrize("task", ["pd.sync", "pd.async"])
def test_a_claims_payloads_decoded_on_the_loop_are_bounded_in_total(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch, task: str
) -> None:
    """Each payload is below OFF_LOOP_CHARS; together (1.6 MB) they were one step's decode."""
    q, on, payload = fresh(module_server), OnLoop(monkeypatch), rows(40 * 1024)
    ids = q.enqueue_many([JobSpec(task, payload) for _ in range(40)])
    run(module_server.url, q.name, 40, lambda: len(seen) == 40, on)
    assert sorted(seen) == sorted((i, len(payload["rows"])) for i in ids)
    assert 0 < on.worst() <= STEP_CHARS  # some at claim (the fast path), no more than the step's


@pytest.mark.parametrize("task", ["pd.sync", "pd.async"])
def test_small_payloads_are_still_decoded_at_claim(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch, task: str
) -> None:
    q, on = fresh(module_server), OnLoop(monkeypatch)
    q.enqueue_many([JobSpec(task, rows(2 * 1024)) for _ in range(20)])
    run(module_server.url, q.name, 20, lambda: len(seen) == 20, on)
    assert len(on.sizes) == 20  # each on the loop, none handed to a thread


def records(worker: Worker, into: list[logging.LogRecord]) -> None:
    log = logging.getLogger("scheduler.test." + uuid.uuid4().hex[:8])
    log.propagate = False
    log.setLevel(logging.INFO)

    class ToList(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            into.append(record)

    log.handlers[:] = [ToList()]
    worker.log = log


@pytest.mark.parametrize("task", ["pd.sync", "pd.async"])
def test_a_large_payload_that_is_not_json_is_parked_as_a_small_one_is(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch, task: str
) -> None:
    """Same error type and text, not retried, its handler never called, and no run time (its
    dead line has no duration_ms): as at claim, though a large one is decoded as it starts."""
    q, raw = fresh(module_server), redis.Redis.from_url(module_server.url)
    small, large, fine = q.enqueue_many([JobSpec(task, {"x": 1}) for _ in range(3)])
    raw.hset(q.keys.job(small), "payload", '{"x": NaN}')
    raw.hset(q.keys.job(large), "payload", f'{{"pad": "{"p" * OFF_LOOP_CHARS}", "x": NaN}}')
    logged: list[logging.LogRecord] = []
    on = OnLoop(monkeypatch)

    def setup(worker: Worker) -> None:
        on.setup(worker)
        records(worker, logged)

    def ended() -> bool:
        return [q.status(j) for j in (small, large, fine)] == ["dead", "dead", "done"]

    settings = WorkerSettings(queues=(q.name,), grace_s=0)
    assert run_until(module_server.url, registry, settings, ended, setup=setup)
    assert len(on.sizes) == 2 and max(on.sizes) < 20  # the large one: off the loop
    bad = [q.get_job(j).fields for j in (small, large)]
    assert [(f["last_error_type"], f["last_error"], f["attempts"]) for f in bad] == [
        ("InvalidPayload", bad[0]["last_error"], "1")
    ] * 2
    assert bad[0]["last_error"].startswith("payload is not valid JSON (NaN is not JSON")
    assert [j for j, _ in seen] == [fine]
    dead = [r for r in logged if getattr(r, "event", "") == "dead"]
    assert sorted(r.job_id for r in dead) == sorted([small, large])  # type: ignore[attr-defined]
    assert [hasattr(r, "duration_ms") for r in dead] == [False, False]


def test_a_large_payload_that_misfits_its_payload_type_is_parked_at_once(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    q, raw = fresh(module_server), redis.Redis.from_url(module_server.url)
    misfit, fine = q.enqueue_many([JobSpec("pd.typed", {"rows": [1]}) for _ in range(2)])
    raw.hset(q.keys.job(misfit), "payload", f'{{"rows": [], "pad": "{"p" * OFF_LOOP_CHARS}"}}')
    on = OnLoop(monkeypatch)
    run(
        module_server.url,
        q.name,
        2,
        lambda: [q.status(misfit), q.status(fine)] == ["dead", "done"],
        on,
    )
    fields = q.get_job(misfit).fields
    assert (fields["last_error_type"], fields["attempts"]) == ("InvalidPayload", "1")
    assert "the task's payload_type Rows refuses the stored payload" in fields["last_error"]
    assert seen == [(fine, 1)]
    assert max(on.sizes) < OFF_LOOP_CHARS  # the misfit's: decoded off the loop, then refused


def test_an_undecoded_payload_is_decoded_on_the_loop_when_no_thread_can_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_thread(*_: Any) -> Any:
        raise RuntimeError("can't start new thread")

    loop = asyncio.new_event_loop()
    try:
        monkeypatch.setattr(loop, "run_in_executor", no_thread)
        big = loop.run_until_complete(Undecoded('{"a": [1]}').off_loop_for(None))
        assert big.data == {"a": [1]}
        with pytest.raises(Undecodable) as bad:
            loop.run_until_complete(Undecoded("[Infinity]").off_loop_for(None))
    finally:
        loop.close()
    assert str(bad.value) == not_json(ValueError("Infinity is not JSON (enqueue refuses it: "
                                                 "written by hand?)"))  # fmt: skip
