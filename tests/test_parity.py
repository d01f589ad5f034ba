"""AsyncQueue offers every public method Queue offers (same names, parameters and defaults, as
coroutines), and the public surface is documented: every public method of both clients and
every name in `scheduler.__all__` has a docstring. The comparison is computed from the classes,
so a method added to Queue only (or without a docstring) fails here without editing this file."""

from __future__ import annotations

import asyncio
import gc
import inspect
import time
from typing import Any

import redis.asyncio as aredis

import scheduler
from scheduler import AsyncQueue, JobSpec, Queue
from scheduler._spawn import RedisProcess

# Methods only the asyncio client needs (closing a redis.asyncio connection is itself async),
# and their sync counterparts.
ASYNC_ONLY = {"aclose"}
SYNC_ONLY = {"close"}


def _public(cls: type) -> dict[str, Any]:
    return {n: inspect.getattr_static(cls, n) for n in dir(cls) if not n.startswith("_")}


def _func(attr: Any) -> Any:
    if isinstance(attr, classmethod | staticmethod):
        return attr.__func__
    if isinstance(attr, property):
        return attr.fget
    return attr


def _params(attr: Any) -> list[tuple[str, Any, Any]]:
    sig = inspect.signature(_func(attr))
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def parity_problems(sync_cls: type, async_cls: type) -> list[str]:
    """Every way async_cls falls short of being the asyncio twin of sync_cls."""
    sync, aio = _public(sync_cls), _public(async_cls)
    missing = sorted(set(sync) - set(aio) - SYNC_ONLY)
    problems = [f"{n}: missing from {async_cls.__name__}" for n in missing]
    problems += [
        f"{n}: only in {async_cls.__name__}" for n in sorted(set(aio) - set(sync) - ASYNC_ONLY)
    ]
    for name in sorted(set(sync) & set(aio)):
        s, a = sync[name], aio[name]
        if type(s) is not type(a):
            problems.append(f"{name}: {type(s).__name__} vs {type(a).__name__}")
            continue
        if not callable(_func(s)):
            continue  # a plain attribute: same name is all there is to compare
        if _params(s) != _params(a):
            problems.append(f"{name}: parameters {_params(s)} vs {_params(a)}")
        plain = inspect.isfunction(s)
        if plain and not inspect.iscoroutinefunction(a):
            problems.append(f"{name}: not a coroutine function in {async_cls.__name__}")
        if plain and inspect.iscoroutinefunction(s):
            problems.append(f"{name}: a coroutine function in {sync_cls.__name__}")
    return problems


def undocumented(cls: type) -> list[str]:
    out = []
    for name, attr in _public(cls).items():
        f = _func(attr)
        if callable(f) and not (inspect.getdoc(f) or "").strip():
            out.append(f"{cls.__name__}.{name}")
    return sorted(out)


def test_async_queue_has_every_queue_method_with_the_same_signature() -> None:
    assert parity_problems(Queue, AsyncQueue) == []


def test_the_comparison_catches_a_method_added_to_queue_only() -> None:
    class Wider(Queue):
        def extra(self, job_id: str, *, timeout_s: float = 1.0) -> None:
            """Only here."""

    class Drifted(AsyncQueue):
        async def cancel(self, job_id: str, force: bool = False) -> str:
            """Another parameter."""
            return ""

        def counts(self) -> Any:  # not a coroutine
            """Blocking by mistake."""

    assert parity_problems(Wider, AsyncQueue) == ["extra: missing from AsyncQueue"]
    problems = parity_problems(Queue, Drifted)
    assert any(p.startswith("cancel: parameters") for p in problems), problems
    assert "counts: not a coroutine function in Drifted" in problems, problems


def test_every_public_method_of_both_clients_has_a_docstring() -> None:
    assert undocumented(Queue) == []
    assert undocumented(AsyncQueue) == []


def _own_doc(obj: Any) -> str:
    doc = (inspect.getdoc(obj) or "").strip()
    # A dataclass without a docstring gets its signature as __doc__: that documents nothing.
    return "" if doc.startswith(f"{getattr(obj, '__name__', '')}(") else doc


def test_every_exported_name_has_a_docstring() -> None:
    missing = [n for n in scheduler.__all__ if not _own_doc(getattr(scheduler, n))]
    assert missing == []


def test_every_public_method_of_the_exported_classes_has_a_docstring() -> None:
    classes = [getattr(scheduler, n) for n in scheduler.__all__]
    missing = [u for c in classes if inspect.isclass(c) for u in undocumented(c)]
    assert missing == []


def test_the_docstring_check_catches_an_undocumented_method() -> None:
    class Bare(Queue):
        def extra(self) -> None:
            pass

    assert "Bare.extra" in undocumented(Bare)
    assert "Queue.extra" not in undocumented(Queue)


def test_async_list_jobs_and_dead_ids_answer_as_queue_does(redis_url: str, q: Queue) -> None:
    """The two AsyncQueue methods added for parity, against a real Redis."""

    async def main() -> tuple[list[str], list[str], list[str]]:
        aq = AsyncQueue(aredis.Redis.from_url(redis_url, decode_responses=True), q.name)
        try:
            ids = await aq.enqueue_many([JobSpec("t", {"n": i}) for i in range(3)])
            batch = await aq.claim("w", limit=1)
            job = batch.jobs[0]
            await aq.fail(job.id, job.token, ValueError("x"), retryable=False)
            due = [j.id for j in await aq.list_jobs("due")]
            dead = await aq.dead_ids(error_type="ValueError")
            none = await aq.dead_ids(task="other")
            assert due == [j.id for j in q.list_jobs("due")] == ids[1:]
            return due, dead, none
        finally:
            await aq.aclose()

    _, dead, none = asyncio.run(main())
    assert dead == q.dead_ids(error_type="ValueError") != []
    assert none == []


def test_queues_close_their_connection_as_context_managers(module_server: RedisProcess) -> None:
    admin = module_server.client()

    def clients(want: int) -> int:
        """The server's client count, once it is `want` (or after 2 s): the server sees a
        closed socket on its next loop turn, maybe after this call's CLIENT LIST."""
        for _ in range(200):
            n = len(admin.client_list())
            if n == want:
                return n
            time.sleep(0.01)
        return n

    gc.collect()  # another test's client dropped earlier closes now, not during the block
    base = len(admin.client_list())  # this one, and any other test's client still open
    with Queue.from_url(module_server.url, "ctx") as q:
        q.enqueue("t", {})
        assert clients(base + 1) == base + 1
    assert clients(base) == base  # closed on leaving the block

    async def main() -> None:
        async with AsyncQueue.from_url(module_server.url, "ctx") as aq:
            await aq.enqueue("t", {})
            assert clients(base + 1) == base + 1
        assert clients(base) == base

    asyncio.run(main())
