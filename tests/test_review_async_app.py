"""Review: an app developer's asyncio use of the client (AsyncQueue in a web app).

What a FastAPI / Starlette app does with it: one AsyncQueue made at import time (or in the
lifespan) and shared by every request handler; bursts of concurrent enqueues with a mix of
options (client/enqueue_batcher.py shares their script calls), each caller expecting the answer
it would have had alone; waiting for a job's outcome; closing the queue at shutdown; the same
queue driven by several event loops in turn (asyncio.run per test, a TestClient per test);
the blocking Queue called from an async handler. Every check runs on a private server
(module_server), never the shared one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from scheduler import (
    AsyncPartitionedQueue,
    AsyncQueue,
    BadArgument,
    InvalidPayload,
    JobCancelled,
    JobDead,
    JobNotFound,
    Queue,
    ResultTimeout,
    open_queue_async,
)
from scheduler._spawn import RedisProcess
from scheduler.core import loop_guard
from scheduler.core.connection import connect, connect_async
from tests.redis_server import is_cluster_run

pytestmark = pytest.mark.skipif(is_cluster_run(), reason="a private single server")


@pytest.fixture
def url(module_server: RedisProcess) -> Iterator[str]:
    yield module_server.url


@pytest.fixture
def sync(url: str) -> Iterator[redis.Redis]:
    c = connect(url)
    yield c
    c.close()


def _child(fn: Any) -> int:
    """Run fn() in a forked child; its exit code (0: fn returned True, 3: it raised)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            code = 0 if fn() else 2
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _transports(aq: AsyncQueue) -> list[Any]:
    """The socket transports of the queue's pooled connections now."""
    writers = [getattr(c, "_writer", None) for c in loop_guard._connections(aq.client)]
    return [w.transport for w in writers if w is not None]


def _close(aq: AsyncQueue, seen: list[Any]) -> None:
    """Close the queue's connections whichever loop they were opened on (all closed by now),
    and the sockets of `seen`: a redis-py disconnect that failed on a closed loop dropped its
    transport with the socket still open."""
    loop_guard._drop_connections(aq.client)
    for t in seen:
        if getattr(t, "_sock", None) is not None:
            with contextlib.suppress(Exception):
                t._call_connection_lost(None)
    with contextlib.suppress(Exception):
        asyncio.run(aq.client.aclose())


# --- defects ------------------------------------------------------------------------------------


def test_preload_is_guarded_like_every_other_call_of_a_queue_kept_across_loops(
    url: str, queue_name: str
) -> None:
    """manual.md "Asyncio": a queue kept across asyncio.run() calls (pytest-asyncio's loop per
    test, a TestClient per test) works in each; a call from another loop still open is refused
    with BadArgument. A lifespan calls `preload()` first, as examples/fastapi_app does: on the
    second run it raised a raw RuntimeError (a Future "attached to a different loop", or
    "Event loop is closed"), and beside an open loop the same, never BadArgument."""
    aq = AsyncQueue(connect_async(url), queue_name)  # made at import time, say
    asyncio.run(aq.enqueue("t", job_id="first"))  # the first app run (its loop now closed)
    seen = _transports(aq)

    async def second_lifespan() -> str:
        await aq.preload()  # the lifespan's start-up call: the new loop's first call
        return await aq.enqueue("t", job_id="second")

    try:
        assert asyncio.run(second_lifespan()) == "second"
    finally:
        _close(aq, seen)

    # The same queue, its loop open in another thread: a second loop's preload is refused.
    other = AsyncQueue(connect_async(url), queue_name)
    first = asyncio.new_event_loop()
    runner = threading.Thread(target=first.run_forever, daemon=True)
    runner.start()
    try:
        asyncio.run_coroutine_threadsafe(other.counts(), first).result(10)

        async def from_another_loop() -> None:
            await asyncio.wait_for(other.preload(), 10)

        with pytest.raises(BadArgument, match="event loop"):
            asyncio.run(from_another_loop())
    finally:
        asyncio.run_coroutine_threadsafe(other.aclose(), first).result(10)
        first.call_soon_threadsafe(first.stop)
        runner.join(10)
        first.close()


def test_preload_in_a_forked_child_is_refused_and_the_parent_keeps_its_replies(
    url: str, queue_name: str
) -> None:
    """manual.md "Forks": an AsyncQueue the parent used is refused in a forked child with
    BadArgument, nothing sent. `preload()` (a worker's lifespan start-up call) was not: it sent
    SCRIPT LOAD on the parent's connection from the child, and the parent's next enqueue waited
    its whole socket_timeout and raised redis TimeoutError (its job written all the same)."""
    aq = AsyncQueue(connect_async(url + "?socket_timeout=2"), queue_name)
    loop = asyncio.new_event_loop()  # the parent's loop stays open across the fork
    try:
        loop.run_until_complete(aq.counts())

        def refused() -> bool:
            async def go() -> bool:
                try:
                    await asyncio.wait_for(aq.preload(), 5)
                except BadArgument as exc:
                    return "fork" in str(exc)
                return False

            return asyncio.run(go())

        child = _child(refused)

        async def parent() -> list[object]:
            got: list[object] = []
            for i in range(3):
                try:
                    got.append(await aq.enqueue("t", job_id=f"p{i}"))
                except Exception as exc:  # what the parent's own call answered
                    got.append(type(exc).__name__)
            return got

        assert (child, loop.run_until_complete(parent())) == (0, ["p0", "p1", "p2"])
    finally:
        loop.run_until_complete(aq.aclose())
        loop.close()


def test_the_fastapi_example_answers_a_malformed_job_id_with_a_client_error(
    url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example is the template an app copies; its /jobs/{job_id} catches JobNotFound only,
    while get_job also raises BadArgument for an id outside 1-128 of [A-Za-z0-9_.:-] (its
    docstring says so). Any client can send one (`/jobs/a%20b`): the server logged a
    traceback and answered 500."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from examples.fastapi_app.app import app

    monkeypatch.setenv("REDIS_URL", url)
    monkeypatch.setenv("SCHEDULER_QUEUE", queue_name)
    with TestClient(app, raise_server_exceptions=False) as http:
        assert http.get("/jobs/nonexistent").status_code == 404  # as the example means
        codes = [http.get(f"/jobs/{bad}").status_code for bad in ("a%20b", "x" * 129, "a+b")]
    assert all(400 <= c < 500 for c in codes), codes


def test_the_flask_example_answers_a_malformed_job_id_with_404(url: str, queue_name: str) -> None:
    """The same as the FastAPI example's: Flask's /jobs/<job_id> caught JobNotFound only, and a
    malformed id (get_job's BadArgument) answered 500. A Django view reads its job id from its
    own row (never from the request), so it has no such input."""
    pytest.importorskip("flask")
    from examples.flask_app.app import create_app

    http = create_app(url, queue_name).test_client()
    codes = [http.get(f"/jobs/{bad}").status_code for bad in ("nonexistent", "a%20b", "x" * 129)]
    assert codes == [404, 404, 404]
    assert http.get("/jobs/a+b").status_code == 404


def test_opening_a_queue_on_a_client_kept_across_loops_is_guarded_as_its_calls(
    url: str, queue_name: str
) -> None:
    """open_queue_async, AsyncPartitionedQueue.open and .create read the layout (a GET) on the
    client they are given before any queue call: a client made at import time and opened in
    each app run's lifespan failed there with "Event loop is closed" on the second run (the
    closed loop's connection), and beside another open loop or in a forked child it was not
    refused. Each now goes through the loop guard, as the queues' own calls do."""
    client = connect_async(url)  # made at import time, say
    plain = AsyncQueue(client, queue_name)  # the client's connections, for _transports
    asyncio.run(AsyncPartitionedQueue.create(client, queue_name, partitions=2))  # the first run
    seen = _transports(plain)
    openers: list[Callable[[], Awaitable[AsyncQueue | AsyncPartitionedQueue]]] = [
        lambda: open_queue_async(client, queue_name),
        lambda: AsyncPartitionedQueue.open(client, queue_name),
        lambda: AsyncPartitionedQueue.create(client, queue_name, partitions=2),
    ]
    got = []
    try:
        for i, opener in enumerate(openers):  # a lifespan per run: opening is its first call

            async def run(opener: Any = opener, i: int = i) -> str:
                q: AsyncQueue | AsyncPartitionedQueue = await opener()
                return await q.enqueue("t", job_id=f"run{i}")

            got.append(asyncio.run(run()))
            seen += _transports(plain)
    finally:
        _close(plain, seen)
    assert got == ["run0", "run1", "run2"]

    # The client's loop open in another thread: opening from a second loop is refused.
    other = connect_async(url)
    first = asyncio.new_event_loop()
    runner = threading.Thread(target=first.run_forever, daemon=True)
    runner.start()
    try:
        asyncio.run_coroutine_threadsafe(open_queue_async(other, queue_name), first).result(10)
        for again in (open_queue_async, AsyncPartitionedQueue.open):
            with pytest.raises(BadArgument, match="event loop"):
                asyncio.run(asyncio.wait_for(again(other, queue_name), 10))
    finally:
        asyncio.run_coroutine_threadsafe(other.aclose(), first).result(10)
        first.call_soon_threadsafe(first.stop)
        runner.join(10)
        first.close()


def test_opening_a_queue_in_a_forked_child_is_refused_and_the_parent_keeps_its_replies(
    url: str, queue_name: str
) -> None:
    """manual.md "Forks": a client the parent used is refused in a forked child, nothing sent;
    open_queue_async sent its GET on the parent's connection from the child."""
    client = connect_async(url + "?socket_timeout=2")
    loop = asyncio.new_event_loop()  # the parent's loop stays open across the fork
    try:
        pq = loop.run_until_complete(AsyncPartitionedQueue.create(client, queue_name, partitions=2))

        def refused() -> bool:
            async def go() -> bool:
                for opener in (open_queue_async, AsyncPartitionedQueue.open):
                    try:
                        await asyncio.wait_for(opener(client, queue_name), 5)
                    except BadArgument as exc:
                        if "fork" not in str(exc):
                            return False
                    else:
                        return False
                return True

            return asyncio.run(go())

        child = _child(refused)

        async def parent() -> list[object]:
            got: list[object] = []
            for i in range(3):
                try:
                    got.append(await pq.enqueue("t", job_id=f"p{i}"))
                except Exception as exc:  # what the parent's own call answered
                    got.append(type(exc).__name__)
            return got

        assert (child, loop.run_until_complete(parent())) == (0, ["p0", "p1", "p2"])
    finally:
        loop.run_until_complete(client.aclose())
        loop.close()


# --- what held ----------------------------------------------------------------------------------


def _answers(got: list[Any]) -> list[Any]:
    """Answers with generated ids named by first appearance (chosen ids kept as they are)."""
    names: dict[str, str] = {}
    out: list[Any] = []
    for g in got:
        if isinstance(g, BaseException):
            out.append((type(g).__name__, str(g)))
        elif g.startswith("c-"):
            out.append(g)
        else:
            out.append(names.setdefault(g, f"gen{len(names)}"))
    return out


def _burst() -> list[tuple[str, Any, dict[str, Any]]]:
    later = datetime.now(UTC) + timedelta(hours=1)
    return [
        ("t", {"n": 0}, {}),  # these two go out at once, alone; the rest wait, one batch
        ("t", {"n": 1}, {}),
        ("t", {"n": 2}, {"delay_ms": 60_000}),
        ("t", {"n": 3}, {"run_at": later}),
        ("t", {"n": 4}, {"key": "K"}),
        ("t", {"n": 5}, {"key": "K"}),  # the same key: the job of n=4
        ("t", {"n": 6}, {"job_id": "c-p", "priority": 7}),
        ("t", {"n": 7}, {"after": ["c-p"], "job_id": "c-child"}),
        ("t", object(), {}),  # a bad payload among them: this caller only
        ("t", {"n": 9}, {"job_id": "c-p"}),  # a chosen id again: the first job's
        ("t", {"n": 10}, {"after": ["c-missing"]}),  # refused by the server: this caller only
        ("t", {"n": 11}, {"key": "K2", "job_id": "c-k2"}),
        ("t", {"n": 12}, {"after": ["c-k2"], "concurrency_key": "ck", "concurrency_limit": 1}),
        ("bad name!", {"n": 13}, {}),
        ("t", {"n": 14}, {"rate_limit": "2/1s", "start_within_ms": 60_000}),
        ("t", {"n": 15}, {"key": "K3", "key_ttl_ms": 60_000, "priority": 9}),
        ("t", {"n": 16}, {}),
    ]


def test_a_concurrent_burst_answers_each_caller_as_the_same_calls_in_turn(
    url: str, queue_name: str, sync: redis.Redis
) -> None:
    """An import-time AsyncQueue, the calls of one burst of request handlers gathered: each
    caller gets what the blocking Queue answers the same calls made one after another (the
    same id, the duplicate's id, the same typed error), and the jobs stored are the same."""
    aq = AsyncQueue.from_url(url, queue_name + "-a")  # at import time: no loop yet
    qs = Queue(sync, queue_name + "-s")
    calls = _burst()

    in_turn: list[Any] = []
    for task, payload, kw in calls:
        try:
            in_turn.append(qs.enqueue(task, payload, **kw))
        except Exception as exc:
            in_turn.append(exc)

    async def handlers() -> list[Any]:
        try:
            burst = [aq.enqueue(task, payload, **kw) for task, payload, kw in calls]
            return await asyncio.gather(*burst, return_exceptions=True)
        finally:
            await aq.aclose()

    burst = asyncio.run(handlers())
    assert _answers(burst) == _answers(in_turn)
    assert isinstance(burst[8], InvalidPayload) and isinstance(burst[13], BadArgument)
    assert isinstance(burst[10], BadArgument) and "after=c-missing" in str(burst[10])
    qa = Queue(sync, queue_name + "-a")
    for a, s in zip(burst, in_turn, strict=True):
        if isinstance(a, str):
            ja, js = qa.get_job(a), qs.get_job(s)
            shown = ("priority", "parents", "ckey", "rcount")
            assert ja.state == js.state and ja.payload() == js.payload()
            assert [ja.fields.get(f) for f in shown] == [js.fields.get(f) for f in shown]


def test_two_hundred_handlers_on_a_two_connection_pool_are_all_answered(
    url: str, queue_name: str
) -> None:
    """README: concurrent enqueues share script calls, two connections at most, so a pool far
    smaller than the burst answers every caller; the bad ones get their own refusal."""

    async def main() -> list[Any]:
        client = aredis.Redis.from_url(url, decode_responses=True, max_connections=2)
        aq = AsyncQueue(client, queue_name)
        try:
            calls = [
                aq.enqueue("t", {"i": i}, after=["nope"] if i % 50 == 7 else None)
                for i in range(200)
            ]
            got = await asyncio.gather(*calls, return_exceptions=True)
            assert (await aq.counts()).due == 196
            return got
        finally:
            await aq.aclose()

    got = asyncio.run(main())
    bad = [i for i, g in enumerate(got) if not isinstance(g, str)]
    assert bad == [7, 57, 107, 157]
    assert all(isinstance(got[i], BadArgument) for i in bad)


def test_awaiting_results_each_outcome_and_a_cancelled_wait(url: str, queue_name: str) -> None:
    """`await aq.result(...)`: the handler's result, JobDead, JobCancelled, ResultTimeout, and an
    asyncio.timeout around it ends the wait and takes the waiter out of result_wait."""

    async def main() -> None:
        aq = AsyncQueue.from_url(url, queue_name)
        try:
            done = await aq.enqueue("t")
            dead = await aq.enqueue("t", max_attempts=1)
            gone = await aq.enqueue("t")
            slow = await aq.enqueue("t")
            waits = [asyncio.ensure_future(aq.result(i, timeout_s=20)) for i in (done, dead, gone)]
            timed = asyncio.ensure_future(aq.result(slow, timeout_s=0.2))
            await asyncio.sleep(0)
            tokens = {j.id: j.token for j in (await aq.claim("w", limit=10)).jobs}
            await aq.complete(done, tokens[done], {"ok": 1})
            await aq.fail(dead, tokens[dead], ValueError("boom"))
            await aq.cancel(gone)
            got = await asyncio.gather(*waits, timed, return_exceptions=True)
            assert got[0] == {"ok": 1}
            assert isinstance(got[1], JobDead) and got[1].error_type == "ValueError"
            assert isinstance(got[2], JobCancelled)
            assert isinstance(got[3], ResultTimeout)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await aq.result(await aq.enqueue("t", job_id="waited"), timeout_s=30)
            assert await aq.client.exists(aq.keys.result_wait("waited")) == 0
            with pytest.raises(JobNotFound):
                await aq.result("no-such-job", timeout_s=1)
        finally:
            await aq.aclose()

    asyncio.run(main())


def test_closing_with_calls_in_flight_then_using_it_again(url: str, queue_name: str) -> None:
    """aclose() while a burst is in flight: no caller hangs; each gets its id, or, for a call
    whose connection was closed under it, redis-py's ConnectionError (its job may be written,
    as for any lost answer). The queue then reconnects on its next call (redis-py's pool)."""

    async def main() -> None:
        aq = AsyncQueue.from_url(url, queue_name)
        await aq.enqueue("t")
        calls = [asyncio.ensure_future(aq.enqueue("t", {"i": i})) for i in range(40)]
        await asyncio.sleep(0)
        await aq.aclose()
        got = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30)
        assert all(isinstance(g, str | redis.ConnectionError) for g in got), got
        assert sum(isinstance(g, str) for g in got) >= 38
        assert await aq.status(await aq.enqueue("t", job_id="again")) == "due"
        await aq.aclose()

    asyncio.run(main())


def test_the_blocking_queue_inside_an_async_handler(url: str, queue_name: str) -> None:
    """README "Using it": the blocking Queue's result() is refused on a thread running a loop
    (it would stall it), works through asyncio.to_thread; its quick calls work as they are."""
    q = Queue.from_url(url, queue_name)

    async def handler() -> None:
        job_id = q.enqueue("t", {"from": "async"})
        with pytest.raises(BadArgument, match="event loop"):
            q.result(job_id, timeout_s=0.1)
        with pytest.raises(ResultTimeout):
            await asyncio.to_thread(q.result, job_id, timeout_s=0.1)
        assert q.get_job(job_id).payload() == {"from": "async"}

    try:
        asyncio.run(handler())
    finally:
        q.close()


def test_a_lifespan_queue_made_at_import_serves_one_app_run_after_another(
    url: str, queue_name: str
) -> None:
    """A FastAPI app whose AsyncQueue is made at import time and closed by the lifespan: a
    TestClient per test runs the lifespan on a new loop each time, and each run works."""
    pytest.importorskip("fastapi")
    from contextlib import asynccontextmanager

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    queue = AsyncQueue.from_url(url, queue_name)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        try:
            yield
        finally:
            await queue.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.post("/jobs")
    async def submit() -> dict[str, str]:
        return {"id": await queue.enqueue("t")}

    ids = []
    for _ in range(3):
        with TestClient(app) as http:
            ids.append(http.post("/jobs").json()["id"])
    assert len(set(ids)) == 3
