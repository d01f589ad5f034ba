"""A review of the session's diff from a user's side: the lazy `import scheduler` (be4beb5), the
partitioned setters' check-then-write (667ae57), progress sent ahead of a graceful stop's
release (d0994dc), and the queues from a URL re-sending on redis-py's default Retry (ab5c235,
docs 90e2aac). Fresh-interpreter checks run in subprocesses; the re-send checks go through a
small TCP proxy in front of the module's private server that loses one chosen reply."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from scheduler import (
    AsyncPartitionedQueue,
    AsyncQueue,
    JobContext,
    PartitionedQueue,
    Queue,
    Registry,
    connect_async,
)
from scheduler.core.keys import QueueKeys
from scheduler.worker import Worker, WorkerSettings
from tests.redis_server import RedisProcess

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def _fresh(code: str, stdin: bytes = b"") -> str:
    """`code` run by a fresh interpreter in the repository; its stdout (it must exit 0)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [PY, "-c", textwrap.dedent(code)],
        input=stdin,
        capture_output=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr.decode()
    return out.stdout.decode()


def _poll(cond: Callable[[], bool], bound_s: float = 20.0) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


# --- be4beb5: the lazy package ----------------------------------------------------------------


def test_star_import_in_a_fresh_process_gives_every_public_name_as_its_module_s() -> None:
    out = _fresh(
        """
        import importlib
        from scheduler import *
        import scheduler
        bad = []
        for name in scheduler.__all__:
            got = globals()[name]
            home = importlib.import_module(scheduler._HOMES[name])
            if got is not getattr(home, name):
                bad.append(name)
        print(len(scheduler.__all__), bad)
        """
    )
    count, bad = out.split(" ", 1)
    assert int(count) > 40 and bad.strip() == "[]"


_THREADS = """
import threading, scheduler
names = list(scheduler.__all__) * 3
barrier = threading.Barrier(len(names))
errors = []
def read(name):
    barrier.wait()
    try:
        getattr(scheduler, name)
        from scheduler.worker import Worker
    except BaseException as exc:
        errors.append(f"{name}: {type(exc).__name__}: {exc}")
ts = [threading.Thread(target=read, args=(n,)) for n in names]
for t in ts: t.start()
for t in ts: t.join(30)
print(sum(t.is_alive() for t in ts), errors[:1])
"""


def test_public_names_read_from_many_threads_at_once_in_fresh_processes() -> None:
    """Every thread starts together (a barrier): no error of a partly imported module, no
    deadlock. A race: up to 16 fresh processes, stopped at the first that errs."""
    for _ in range(16):
        out = _fresh(_THREADS)
        assert out.strip() == "0 []"


def _pickled_values() -> list[Any]:
    """Every public exception (made from its own signature's required arguments) and a few
    models."""
    import inspect

    import scheduler
    from scheduler import Backoff, QueueCounts, RetryLater

    values: list[Any] = [
        Backoff(),
        QueueCounts(now_ms=1, due=2, scheduled=3, leased=4, dead=5, oldest_due_ms=None, lapsed=0),
        RetryLater(1000),
    ]
    for name in sorted(scheduler.__all__):
        kind = getattr(scheduler, name)
        if not isinstance(kind, type) or not issubclass(kind, Exception) or kind is RetryLater:
            continue
        params = list(inspect.signature(kind.__init__).parameters.values())[1:]
        required = [p for p in params if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
        values.append(kind(*[f"{name}-{i}" for i in range(len(required))] or ["message"]))
    return values


def test_public_exceptions_and_models_unpickle_in_a_process_that_only_imported_scheduler() -> None:
    values = _pickled_values()
    blob = pickle.dumps(values)
    out = _fresh(
        """
        import pickle, sys
        import scheduler
        values = pickle.loads(sys.stdin.buffer.read())
        for v in values:
            kind = getattr(scheduler, type(v).__name__)
            print(type(v).__name__, kind is type(v), isinstance(v, kind), repr(str(v)))
        print(isinstance(values[-1], scheduler.SchedulerError))
        """,
        stdin=blob,
    )
    lines = out.strip().splitlines()
    assert lines[-1] == "True"
    for v, line in zip(values, lines, strict=False):
        assert line == f"{type(v).__name__} True True {str(v)!r}"
    assert len(lines) == len(values) + 1 > 20


def test_help_of_the_package_lists_the_lazy_classes_and_dir_names_them() -> None:
    out = _fresh(
        """
        import pydoc, scheduler
        names = dir(scheduler)
        print(all(n in names for n in scheduler.__all__), "_HOMES" in names)
        text = pydoc.render_doc(scheduler, renderer=pydoc.plaintext)
        print("class Queue" in text, "class AsyncQueue" in text, "open_queue(" in text)
        """
    )
    assert out.split() == ["True", "False", "True", "True", "True"]


def test_submodules_the_old_import_loaded_are_attributes_after_a_bare_import() -> None:
    out = _fresh(
        """
        import scheduler
        print(scheduler.core.errors.JobNotFound is scheduler.JobNotFound)
        print(scheduler.client.queue.Queue is scheduler.Queue)
        """
    )
    assert out.split() == ["True", "True"]


def test_the_worker_s_names_and_misspelt_names_after_a_bare_import() -> None:
    out = _fresh(
        """
        import scheduler
        print(scheduler.JobNotFound.__module__ == "scheduler.core.errors")
        print(scheduler.worker.Worker.__module__, "Worker" in dir(scheduler.worker))
        from scheduler.worker import Worker, WorkerSettings
        print(Worker is scheduler.worker.runtime.Worker, WorkerSettings.__name__)
        for bad in ("Queeu", "runtime"):
            try:
                getattr(scheduler, bad)
            except AttributeError as exc:
                print("AttributeError", bad in str(exc))
        try:
            from scheduler import Nope  # noqa
        except ImportError as exc:
            print("ImportError", "Nope" in str(exc))
        """
    )
    assert out.split("\n")[:6] == [
        "True",
        "scheduler.worker.runtime True",
        "True WorkerSettings",
        "AttributeError True",
        "AttributeError True",
        "ImportError True",
    ]


def test_a_subclass_of_the_lazy_queue_is_a_queue_and_keeps_from_url(
    module_server: RedisProcess,
) -> None:
    import scheduler

    class Mine(scheduler.Queue):
        pass

    with Mine.from_url(module_server.url, "sub-q") as q:
        assert isinstance(q, Queue) and type(q) is Mine
        job = q.enqueue("t", {"n": 1})
        assert q.get_job(job).payload() == {"n": 1}
        q.cancel(job)


def test_every_command_s_help_is_the_same_lazily_and_after_loading_every_command() -> None:
    """`scheduler X --help` in a fresh process (X loaded alone) against the help of X once every
    module registered (what docs/cli.md is made from), and the top-level list's summaries."""
    out = _fresh(
        """
        import json
        from click.testing import CliRunner
        from scheduler.cli.main import SUMMARIES, main
        runner = CliRunner()
        lazy = {n: runner.invoke(main, [n, "--help"]).output for n in sorted(SUMMARIES)}
        top_lazy = runner.invoke(main, ["--help"]).output
        main.register_all()
        full = {n: runner.invoke(main, [n, "--help"]).output for n in sorted(SUMMARIES)}
        top_full = runner.invoke(main, ["--help"]).output
        print(json.dumps([[n for n in lazy if lazy[n] != full[n]], top_lazy == top_full,
                          sorted(main.commands) == sorted(SUMMARIES)]))
        """
    )
    assert out.strip() == "[[], true, true]"


# --- 667ae57: a partitioned queue's checked change --------------------------------------------


@pytest.fixture
def pq(client: redis.Redis, queue_name: str) -> Iterator[PartitionedQueue]:
    p = PartitionedQueue.create(client, queue_name, partitions=3)
    yield p
    for part in p.parts:
        client.delete(QueueKeys(part.name).config)


def _configs(client: redis.Redis, pq: PartitionedQueue) -> list[Any]:
    return [
        client.hgetall(QueueKeys(p.name).config)
        if client.type(QueueKeys(p.name).config) == "hash"
        else client.type(QueueKeys(p.name).config)
        for p in pq.parts
    ]


@pytest.mark.parametrize("asyncio_client", [False, True], ids=["sync", "asyncio"])
@pytest.mark.parametrize("change", ["pause", "retention", "aging"])
def test_one_partition_refusing_for_real_refuses_the_change_with_nothing_written(
    client: redis.Redis, redis_url: str, pq: PartitionedQueue, change: str, asyncio_client: bool
) -> None:
    """No injection: the last partition's config key edited by hand into a string."""
    bad = QueueKeys(pq.parts[2].name).config
    client.delete(bad)
    client.set(bad, "hand edit")
    before = _configs(client, pq)

    def act(q: Any) -> Any:
        if change == "pause":
            return q.pause()
        if change == "retention":
            return q.set_dead_retention(max_count=7)
        return q.set_priority_aging(5)

    with pytest.raises(Exception) as err:
        if asyncio_client:

            async def main() -> None:
                ac = connect_async(redis_url)
                try:
                    await act(AsyncPartitionedQueue(ac, pq.layout))
                finally:
                    await ac.aclose()

            asyncio.run(main())
        else:
            act(pq)
    assert bad in str(err.value)
    assert _configs(client, pq) == before
    client.delete(bad)


def test_pause_then_resume_of_a_partitioned_queue_answers_and_writes_every_partition(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    assert pq.pause() == "paused"
    assert pq.pause() == "already"
    job = pq.enqueue("t", {})
    assert pq.claim("w", lease_ms=10_000).jobs == []
    assert pq.resume() == "resumed"
    pq.cancel(job)


# --- d0994dc: progress ahead of a graceful stop's release -------------------------------------


class _Run:
    """A Worker on its own loop in a thread (connected to `url`), stopped on request."""

    def __init__(self, url: str, registry: Registry, settings: WorkerSettings) -> None:
        self.loop = asyncio.new_event_loop()
        self.records: list[logging.LogRecord] = []
        log = logging.getLogger(f"review7.{id(self)}")
        log.setLevel(logging.DEBUG)
        log.propagate = False
        handler = logging.Handler()
        handler.emit = self.records.append  # type: ignore[method-assign,assignment]
        log.addHandler(handler)
        self.client = connect_async(url)
        self.worker = Worker(self.client, registry, settings, logger=log)
        self.codes: list[int] = []
        self.thread = threading.Thread(
            target=lambda: self.codes.append(
                self.loop.run_until_complete(self.worker.run(install_signals=False))
            )
        )
        self.thread.start()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.worker.request_stop)

    def join(self) -> None:
        self.thread.join(30)
        assert not self.thread.is_alive()
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()

    def logged(self, text: str) -> bool:
        return any(text in r.getMessage() for r in list(self.records))


def _long_task(registry: Registry, started: threading.Semaphore) -> None:
    @registry.task("long")
    async def long(payload: dict[str, Any], ctx: JobContext) -> None:
        if payload.get("progress") is not None:
            ctx.set_progress(payload["progress"])
        started.release()
        await asyncio.sleep(60)  # stopped by the shutdown


def test_a_stop_of_a_worker_of_several_queues_keeps_each_run_s_progress(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    qs = [Queue(client, f"{queue_name}-{i}") for i in range(3)]
    jobs = [
        qs[0].enqueue("long", {"progress": {"q": 0}}),
        qs[1].enqueue("long", {}),  # sets none
        qs[2].enqueue("long", {"progress": "two"}),
        qs[2].enqueue("long", {"progress": [2, 2]}),
    ]
    owner = [qs[0], qs[1], qs[2], qs[2]]
    registry, started = Registry(), threading.Semaphore(0)
    _long_task(registry, started)
    settings = WorkerSettings(
        queues=tuple(q.name for q in qs), heartbeat_ms=20_000, lease_ms=60_000, grace_s=0
    )
    run = _Run(redis_url, registry, settings)
    try:
        for _ in jobs:
            assert started.acquire(timeout=15)
    finally:
        run.stop()
        run.join()
    assert [q.status(j) for q, j in zip(owner, jobs, strict=True)] == ["due"] * 4
    got = [q.get_job(j).progress for q, j in zip(owner, jobs, strict=True)]
    assert got == [{"q": 0}, None, "two", [2, 2]]


def test_a_run_cancelled_before_the_stop_keeps_no_progress_set_after_the_cancel(
    redis_url: str, q: Queue
) -> None:
    registry = Registry()
    go_on, set_after = threading.Event(), threading.Event()

    @registry.task("c")
    async def c(payload: dict[str, Any], ctx: JobContext) -> None:
        ctx.set_progress("before")
        await asyncio.to_thread(go_on.wait, 20)
        ctx.set_progress("after the cancel")
        set_after.set()
        await asyncio.sleep(60)

    job = q.enqueue("c", {})
    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=50, lease_ms=60_000, grace_s=0)
    run = _Run(redis_url, registry, settings)
    try:
        assert _poll(lambda: q.get_job(job).progress == "before")
        assert q.cancel(job) == "leased"
        go_on.set()
        assert set_after.wait(15)
    finally:
        run.stop()
        run.join()
    got = q.get_job(job)
    assert (got.state, got.progress) == ("cancelled", "before")


class _Proxy:
    """TCP in front of a server's unix socket. `lose_reply_to(marker)`: the next request holding
    `marker` runs, its reply is dropped and the connection cut. `down()` / `up()`: every
    connection cut and new ones refused, or served again."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.lock = threading.Lock()
        self.marker: bytes | None = None
        self.lost = 0
        self.refused = 0
        self.is_down = False
        self.socks: set[socket.socket] = set()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        threading.Thread(target=self._accept, daemon=True).start()

    def lose_reply_to(self, marker: bytes) -> None:
        with self.lock:
            self.marker = marker

    def down(self) -> None:
        with self.lock:
            self.is_down = True
            socks = list(self.socks)
        self._cut(*socks)

    def up(self) -> None:
        with self.lock:
            self.is_down = False

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            if self.is_down:
                with self.lock:
                    self.refused += 1
                down.close()
                continue
            up = socket.socket(socket.AF_UNIX)
            up.connect(self.upstream)
            state = {"drop": False}
            with self.lock:
                self.socks.update((down, up))
            threading.Thread(target=self._pump, args=(down, up, state, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, state, False), daemon=True).start()

    def _cut(self, *socks: socket.socket) -> None:
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
            with self.lock:
                self.socks.discard(s)

    def _pump(
        self, src: socket.socket, dst: socket.socket, state: dict[str, bool], req: bool
    ) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if req:
                    with self.lock:
                        if self.marker is not None and self.marker in data:
                            self.marker, state["drop"] = None, True
                elif state["drop"]:
                    with self.lock:
                        self.lost += 1
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._cut(src, dst)

    def close(self) -> None:
        self.listener.close()
        with self.lock:
            socks = list(self.socks)
        self._cut(*socks)


@pytest.fixture
def proxy(module_server: RedisProcess) -> Iterator[_Proxy]:
    p = _Proxy(module_server.socket)
    yield p
    p.close()


def test_a_stop_while_redis_is_briefly_down_sends_the_progress_on_the_release_s_next_try(
    proxy: _Proxy, module_server: RedisProcess, queue_name: str
) -> None:
    direct = Queue(module_server.client(), queue_name)
    job = direct.enqueue("long", {"progress": {"sent": 9}})
    registry, started = Registry(), threading.Semaphore(0)
    _long_task(registry, started)
    settings = WorkerSettings(queues=(queue_name,), heartbeat_ms=20_000, lease_ms=60_000, grace_s=0)
    run = _Run(proxy.url, registry, settings)
    try:
        assert started.acquire(timeout=15)
        proxy.down()
        run.stop()
        assert _poll(lambda: run.logged("during release"))  # its first try failed
        proxy.up()
    finally:
        proxy.up()
        run.stop()
        run.join()
    got = direct.get_job(job)
    assert (got.state, got.progress) == ("due", {"sent": 9})


# --- ab5c235: the queues from a URL re-send ---------------------------------------------------


def test_an_enqueue_whose_reply_was_lost_is_sent_again_and_makes_one_job(
    proxy: _Proxy, module_server: RedisProcess, queue_name: str
) -> None:
    with Queue.from_url(proxy.url, queue_name) as q:
        q.enqueue("warm", {})  # scripts loaded, connection made
        proxy.lose_reply_to(b"lost-reply-task")
        job = q.enqueue("lost-reply-task", {"n": 1})
        assert proxy.lost == 1
        keyed = None
        proxy.lose_reply_to(b"keyed-task")
        keyed = q.enqueue("keyed-task", {"n": 2}, key="k1")
        assert proxy.lost == 2
        assert q.enqueue("keyed-task", {"n": 3}, key="k1") == keyed
        ids = [j.id for j in q.list_jobs("due", limit=10)]
    assert sorted(ids) == sorted([ids[0], job, keyed]) and len(set(ids)) == 3
    direct = Queue(module_server.client(), queue_name)
    assert direct.get_job(job).payload() == {"n": 1}


def test_an_async_queue_from_url_re_sends_an_enqueue_whose_reply_was_lost(
    proxy: _Proxy, module_server: RedisProcess, queue_name: str
) -> None:
    async def main() -> tuple[str, list[str]]:
        q = AsyncQueue.from_url(proxy.url, queue_name)
        try:
            await q.enqueue("warm", {})
            proxy.lose_reply_to(b"lost-async-task")
            job = await q.enqueue("lost-async-task", {"n": 1})
            return job, [j.id for j in await q.list_jobs("due", limit=10)]
        finally:
            await q.aclose()

    job, ids = asyncio.run(main())
    assert proxy.lost == 1 and job in ids and len(ids) == 2


def test_a_cancel_whose_reply_was_lost_answers_as_documented(
    proxy: _Proxy, queue_name: str
) -> None:
    """Re-sent: 'cancelled' (Queue.cancel's docstring)."""
    with Queue.from_url(proxy.url, queue_name) as q:
        q.cancel(q.enqueue("t", {}))  # its script loaded: the lost reply is the cancel's
        job = q.enqueue("t", {})
        proxy.lose_reply_to(job.encode())
        assert q.cancel(job) == "cancelled"
        assert proxy.lost == 1 and q.status(job) == "cancelled"


def test_a_requeue_dead_whose_reply_was_lost_answers_as_documented(
    proxy: _Proxy, queue_name: str
) -> None:
    """Re-sent after a lost reply: the job moved once (due, its dead entry gone), and the count
    is this call's ('How many this call moved', requeue_dead's docstring): 0."""
    with Queue.from_url(proxy.url, queue_name) as q:
        job = q.enqueue("t", {}, max_attempts=1)
        (claimed,) = q.claim("w", lease_ms=10_000).jobs
        q.fail(claimed.id, claimed.token, ValueError("boom"), retryable=False)
        assert q.status(job) == "dead"
        assert q.requeue_dead([q.enqueue("t", {})]) == 0  # its script loaded (a due job: skipped)
        proxy.lose_reply_to(job.encode())
        moved = q.requeue_dead([job])
        assert proxy.lost == 1 and q.status(job) == "due"
        assert moved == 0 and job not in [d.id for d in q.list_jobs("dead", limit=10)]
        assert [j.id for j in q.list_jobs("due", limit=10)].count(job) == 1


def test_a_result_wait_whose_blocking_pop_reply_was_lost_still_returns_the_result(
    proxy: _Proxy, module_server: RedisProcess, queue_name: str
) -> None:
    direct = Queue(module_server.client(), queue_name)
    job = direct.enqueue("t", {})
    got: list[Any] = []
    with Queue.from_url(proxy.url, queue_name) as q:
        proxy.lose_reply_to(b"BLMOVE")
        waiter = threading.Thread(target=lambda: got.append(q.result(job, timeout_s=20)))
        waiter.start()
        (claimed,) = direct.claim("w", lease_ms=10_000).jobs
        assert _poll(lambda: proxy.marker is None)  # the wait's pop was sent
        direct.complete(claimed.id, claimed.token, {"ok": 1})
        waiter.join(25)
    assert got == [{"ok": 1}]


def test_a_queue_from_url_with_url_options_still_re_sends(proxy: _Proxy, queue_name: str) -> None:
    url = proxy.url + "?protocol=3&socket_timeout=5&health_check_interval=1"
    with Queue.from_url(url, queue_name) as q:
        q.enqueue("warm", {})
        proxy.lose_reply_to(b"opts-task")
        job = q.enqueue("opts-task", {})
        assert proxy.lost == 1 and q.status(job) == "due"


def test_the_pickled_queue_stays_refused_and_the_retry_is_not_shared_between_queues(
    module_server: RedisProcess,
) -> None:
    """plain_retry is a copy: two queues' Retry objects are distinct (one's backoff state or a
    caller's update_supported_errors does not reach the other)."""
    with Queue.from_url(module_server.url, "a") as a, Queue.from_url(module_server.url, "b") as b:
        ra = a.client.connection_pool.connection_kwargs["retry"]
        rb = b.client.connection_pool.connection_kwargs["retry"]
        assert ra is not rb and ra.get_retries() == rb.get_retries() > 0
        with pytest.raises(Exception):  # noqa: B017
            pickle.dumps(a)
