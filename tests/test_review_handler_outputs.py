"""What a handler hands back to the worker (its result, its exception), from a review: a
hostile or changing value must settle its own job (done, retried or parked) and leave the
worker claiming and its other jobs unharmed. Each test failed on the code it was written
against. In-process workers on the module's private redis-server."""

from __future__ import annotations

import asyncio
import functools
import gc
import warnings
from typing import Any

import pytest
import redis.asyncio as aredis

from scheduler import Queue
from scheduler.core.errors import BadArgument
from scheduler.worker import EXIT_OK, Worker, WorkerSettings
from scheduler.worker.registry import JobContext, Registry
from tests.conftest import delete_queue, new_queue
from tests.fixtures.polling import poll
from tests.redis_server import RedisProcess

registry = Registry()


class Unnamed(type):
    """A metaclass whose classes' __name__ is not text (a proxy / mock library's trick)."""

    @property
    def __name__(cls) -> Any:  # type: ignore[override]
        return 42


class OddlyNamed(Exception, metaclass=Unnamed):
    pass


class Text(str):
    """A str subclass that refuses to be sliced."""

    def __getitem__(self, key: Any) -> Any:
        raise RuntimeError("no slicing")


class TextMessage(Exception):
    def __str__(self) -> str:
        return Text("a message of a str subclass")


class ExitingMessage(Exception):
    def __str__(self) -> str:
        raise SystemExit(9)


class Custom(BaseException):
    pass


class Raising(dict[str, Any]):
    """A mapping whose items() (what the JSON encoder reads) raises `exc`."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(a=1)
        self.exc = exc

    def items(self) -> Any:
        raise self.exc


@registry.task(name="ho-ok")
async def ok(payload: Any, ctx: JobContext) -> Any:
    return {"ok": ctx.job_id}


class Changing(dict[str, Any]):
    """State a handler returns and later code changes (another job, a cache refresh), made
    deterministic: the first read (the worker's check) sees {"n": 1}, every later one a value
    JSON cannot hold."""

    reads = 0

    def items(self) -> Any:
        self.reads += 1
        return super().items() if self.reads == 1 else [("n", {1, 2})]


@registry.task(name="ho-shared")
async def shared(payload: Any, ctx: JobContext) -> Any:
    return Changing(n=1)


@registry.task(name="ho-raise")
async def raise_it(payload: Any, ctx: JobContext) -> Any:
    raise {"named": OddlyNamed("x"), "text": TextMessage(), "exit": ExitingMessage()}[payload]


@registry.task(name="ho-raise-sync")
def raise_it_sync(payload: Any, ctx: JobContext) -> Any:
    raise {"exit": ExitingMessage()}[payload]


@registry.task(name="ho-result")
async def result(payload: Any, ctx: JobContext) -> Any:
    return Raising(
        {"exit": SystemExit(3), "custom": Custom(), "runtime": RuntimeError("no")}[payload]
    )


@registry.task(name="ho-result-sync")
def result_sync(payload: Any, ctx: JobContext) -> Any:
    return Raising({"exit": SystemExit(3), "custom": Custom()}[payload])


async def _work(payload: Any, ctx: JobContext) -> Any:
    return {"ran": True}


@registry.task(name="ho-wrapped")
@functools.wraps(_work)
def wrapped(payload: Any, ctx: JobContext) -> Any:
    return _work(payload, ctx)  # a sync wrapper of an async def (a decorator's usual slip)


def _settled(q: Queue, ids: list[str]) -> bool:
    return all(q.status(i) in ("done", "dead") for i in ids)


def run_jobs(server: RedisProcess, q: Queue, task: str, payload: Any) -> str:
    """Runs one `task` job among innocent ones on an in-process worker; asserts the worker
    kept running and the innocents were done. Returns the job's id once settled."""
    innocents = [q.enqueue("ho-ok", max_attempts=1) for _ in range(3)]
    job = q.enqueue(task, payload, max_attempts=1)
    innocents += [q.enqueue("ho-ok", max_attempts=1) for _ in range(3)]

    async def main() -> None:
        client = aredis.Redis(unix_socket_path=server.socket, decode_responses=True)
        settings = WorkerSettings(
            queues=(q.name,), concurrency=4, grace_s=1, lease_ms=30_000, heartbeat_ms=1_000
        )
        w = Worker(client, registry, settings)
        run = asyncio.create_task(w.run(install_signals=False))
        try:
            await poll(
                lambda: run.done() or _settled(q, [job, *innocents]),
                lambda: f"the jobs to settle: {[q.status(i) for i in [job, *innocents]]}",
                timeout_s=15,
            )
            assert not run.done(), f"the worker stopped (exit {run.result()})"
            # The server's state changes before the worker reads its report's reply: a job
            # settled in Redis leaves the worker's books a moment later, never kept for good.
            await poll(
                lambda: run.done() or not (w._held or w.running),
                lambda: f"the worker to let go of the settled jobs: {sorted(w._held)}",
                timeout_s=10,
            )
            assert not run.done(), f"the worker stopped (exit {run.result()})"
        finally:
            w.request_stop()
            code = await asyncio.wait_for(run, 20)
            await client.aclose()
        assert code == EXIT_OK

    asyncio.run(main())
    assert [q.status(i) for i in innocents] == ["done"] * len(innocents)
    return job


@pytest.fixture()
def hq(module_server: RedisProcess) -> Any:
    q = new_queue(module_server.client(), "rs-")
    yield q
    delete_queue(q.client, q)


def test_a_result_changed_after_its_handler_returned_is_stored_as_it_was(
    module_server: RedisProcess, hq: Queue
) -> None:
    """Before: the result was checked when the handler returned and encoded again when sent;
    changed in between, the second encoding raised in the reporter, which died: the worker
    exited 1 and none of the batch's outcomes were stored (they ran again after the lease)."""
    job = run_jobs(module_server, hq, "ho-shared", None)
    got = hq.get_job(job)
    assert got is not None and got.state == "done"
    assert got.result_json == '{"n":1}'  # what the handler returned, as it was then


@pytest.mark.parametrize("kind", ["named", "text"])
def test_an_exception_that_describes_itself_oddly_fails_only_its_job(
    module_server: RedisProcess, hq: Queue, kind: str
) -> None:
    """An exception class whose __name__ is not a str (a metaclass), or whose __str__ returns
    a str subclass: before, the (type, message, traceback) built from it was refused when
    the fail call was built, in the reporter, which died (worker exit 1, batch unreported)."""
    job = run_jobs(module_server, hq, "ho-raise", kind)
    got = hq.get_job(job)
    assert got is not None and got.state == "dead"
    assert got.dead_reason == "attempts exhausted"
    assert got.fields["last_error_type"] == ("TextMessage" if kind == "text" else "OddlyNamed")
    if kind == "text":
        assert got.fields["last_error"] == "a message of a str subclass"


@pytest.mark.parametrize("task", ["ho-raise", "ho-raise-sync"])
def test_an_exception_whose_str_raises_system_exit_fails_only_its_job(
    module_server: RedisProcess, hq: Queue, task: str
) -> None:
    """Before: the SystemExit from __str__ (read on the event loop to report the failure)
    escaped asyncio and ended the worker's process; a handler raising SystemExit itself was
    already contained."""
    job = run_jobs(module_server, hq, task, "exit")
    got = hq.get_job(job)
    assert got is not None and got.state == "dead"
    assert got.fields["last_error_type"] == "ExitingMessage"
    assert "could not be read" in got.fields["last_error"]


@pytest.mark.parametrize(
    ("task", "kind"),
    [
        ("ho-result", "exit"),
        ("ho-result-sync", "exit"),
        ("ho-result", "custom"),
        ("ho-result-sync", "custom"),
        ("ho-result", "runtime"),
    ],
)
def test_a_result_whose_encoding_raises_parks_only_its_job(
    module_server: RedisProcess, hq: Queue, task: str, kind: str
) -> None:
    """A result whose own method raises while it is encoded. Before: SystemExit ended the
    worker's process; any other BaseException left the job leased (and heartbeated) for as
    long as the worker lived, its slot taken; an Exception parked it with its message alone."""
    job = run_jobs(module_server, hq, task, kind)
    got = hq.get_job(job)
    assert got is not None and got.state == "dead"
    assert got.dead_reason == "non-retryable error"
    assert got.fields["last_error_type"] == "InvalidResult"
    name = {"exit": "SystemExit", "custom": "Custom", "runtime": "RuntimeError"}[kind]
    assert name in got.fields["last_error"]


@pytest.mark.parametrize("value", [ValueError, None, 3])
def test_non_retryable_not_a_collection_of_classes_is_refused_typed(value: Any) -> None:
    """`non_retryable=ValueError` (the likeliest slip) raised a bare TypeError."""
    with pytest.raises(BadArgument, match="non_retryable"):
        Registry().task(name="t", non_retryable=value)


def test_non_retryable_given_as_a_generator_keeps_its_classes() -> None:
    """Before: the check read the generator, the registration then stored it empty, so the
    errors named there were retried."""
    reg = Registry()
    classes: Any = (c for c in (ValueError, KeyError))

    @reg.task(name="t", non_retryable=classes)
    def t(payload: Any, ctx: JobContext) -> None:
        return None

    assert reg.get("t").non_retryable == (ValueError, KeyError)


def test_a_sync_handler_returning_a_coroutine_says_so_and_closes_it(
    module_server: RedisProcess, hq: Queue
) -> None:
    """An async def behind a sync wrapper runs in a thread and hands back its coroutine,
    never awaited. Before: parked with "result is not JSON-serialisable: Object of type
    coroutine ...", and Python's "coroutine was never awaited" warning at garbage collection."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        job = run_jobs(module_server, hq, "ho-wrapped", None)
        gc.collect()
    got = hq.get_job(job)
    assert got is not None and got.state == "dead"
    assert got.fields["last_error_type"] == "InvalidResult"
    assert "returned a coroutine" in got.fields["last_error"]
    assert not [w for w in seen if "never awaited" in str(w.message)]
