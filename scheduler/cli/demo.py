"""`scheduler demo`: five jobs, two worker processes, and a timeline of what happened.

The tasks are real handlers in scheduler.cli.demo_tasks; the worker processes import its
`registry`. With `keep`, the private Redis outlives the demo so its jobs can be explored."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console

from scheduler.admin.inspection import live_workers
from scheduler.cli.demo_tasks import FLAKY_BACKOFF, LEDGER, QUEUE, RETRY_AFTER_MS
from scheduler.cli.demo_timeline import Run, print_timeline
from scheduler.cli.embedded import NoServerBinary, PrivateRedis
from scheduler.client.queue import Queue
from scheduler.core.connection import connect
from scheduler.core.safety import clean, redact, safe

LEASE_MS, HEARTBEAT_MS = 2_000, 500
TASKS = "scheduler.cli.demo_tasks:registry"


def _spawn(url: str) -> subprocess.Popen[bytes]:
    # The URL only in the environment (the worker's --url reads REDIS_URL): a password in argv
    # would be in every process listing.
    env = dict(os.environ, SCHEDULER_DEMO_URL=url, REDIS_URL=url)
    cmd = [
        sys.executable,
        "-c",
        "from scheduler.cli.main import main; main()",
        "worker",
        TASKS,
        "--queue",
        QUEUE,
        "--concurrency",
        "4",
        "--lease-ms",
        str(LEASE_MS),
        "--heartbeat-ms",
        str(HEARTBEAT_MS),
        "--grace",
        "2",
        "--log-level",
        "WARNING",
    ]
    return subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


class _Stopped(BaseException):
    """SIGTERM or SIGHUP while the demo runs, raised (as Ctrl-C's KeyboardInterrupt is) so that
    its clean-up runs: a BaseException, which no `except Exception` on the way swallows."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGTERM (`kill`, `timeout`, an IDE's stop button) and SIGHUP (the terminal closed) raise
    _Stopped while the demo runs: their default action ended the process without its clean-up,
    leaving its Redis, workers and dir behind. Raised once: a second signal does not cut the
    clean-up short. The previous handlers are put back after."""
    if threading.current_thread() is not threading.main_thread():  # only it gets signals
        yield
        return
    raised = False

    def stop(signum: int, frame: object) -> None:
        nonlocal raised
        if not raised:
            raised = True
            raise _Stopped(signum)

    # One ignored already (nohup: the hang-up it asked to ignore) stays ignored.
    ours = [s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) != signal.SIG_IGN]
    previous = {s: signal.signal(s, stop) for s in ours}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


def run_demo(
    url: str | None, console: Console | None = None, timeout_s: float = 45.0, keep: bool = False
) -> int:
    """Run the demo on `url`, or on a private Redis started here. `keep`: that private Redis
    keeps running after the demo has finished (its own session, so the terminal's Ctrl-C or
    hang-up does not reach it), and the commands to explore it are printed. Stopped before its
    end (Ctrl-C, SIGTERM, SIGHUP), the demo leaves nothing running, `keep` or not: its workers
    and its private Redis are stopped and that Redis's dir removed. SIGTERM / SIGHUP: 128+N."""
    console = console or Console()
    try:
        with _stop_on_signals():
            return _run(url, console, timeout_s, keep)
    except _Stopped as stop:
        with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
            console.print(f"Stopped by {signal.Signals(stop.signum).name}.", highlight=False)
        return 128 + stop.signum


def _run(url: str | None, console: Console, timeout_s: float, keep: bool) -> int:
    with ExitStack() as stack:
        kept: PrivateRedis | None = None
        if url is None:
            try:
                server = PrivateRedis(detach=keep)
                # Stopped and its dir removed as the demo ends, unless a --keep demo finished.
                stack.enter_context(server)
            except (NoServerBinary, RuntimeError) as exc:
                console.print(f"[red]error:[/] {exc}")
                return 1
            url, kept = server.url, (server if keep else None)
            console.print(f"Started a private Redis ({server.binary}) at {url}")
        code = _demo(url, console, stack, timeout_s)
        if keep:
            stack.pop_all()  # it finished (its workers stopped): the server outlives the demo
    if keep:
        _explore(console, url, kept)
    else:
        console.print(
            f"Try: {_command()} demo --keep (leaves the Redis to explore)  |  its tasks: "
            "scheduler/cli/demo_tasks.py  |  docs: README.md",
            markup=False,
            highlight=False,
        )
    return code


def _command() -> str:
    """How to run `scheduler` from this shell: after `make demo` the venv's bin is not on PATH."""
    if shutil.which("scheduler"):
        return "scheduler"
    beside = Path(sys.executable).with_name("scheduler")  # the venv's, unresolved
    if not beside.exists():
        return f"{shlex.quote(sys.executable)} -m scheduler"
    with contextlib.suppress(ValueError):
        return shlex.quote(str(beside.relative_to(Path.cwd())))
    return shlex.quote(str(beside))


def _explore(console: Console, url: str, kept: PrivateRedis | None) -> None:
    """The commands to try on what the demo left behind (plain text: copy-pasteable). A URL
    with a password is never printed: the commands then read it from REDIS_URL."""
    secret = redact(url) != url
    where = "" if secret else f" --url {shlex.quote(url)}"
    cmd = _command()
    lines = [
        f"{cmd} stats{where} --queue {QUEUE}",
        f"{cmd} jobs list{where} --queue {QUEUE}",
        f"{cmd} dead list{where} --queue {QUEUE}",
        f"{cmd} workers{where} --queue {QUEUE}",
        f"{cmd} dashboard{where} --queue {QUEUE}",  # http://127.0.0.1:8080/
        f"{cmd} worker {TASKS}{where} --queue {QUEUE}",
    ]
    console.print("")
    if kept is not None and kept.proc is not None:
        console.print(
            f"Kept the Redis running: pid {kept.proc.pid}, socket {kept.socket}",
            markup=False,
            highlight=False,
        )
    console.print(f"URL: {safe(url)}", markup=False, highlight=False)
    if secret:
        console.print(
            "Its password is not printed: export REDIS_URL=<the URL you gave> first.",
            markup=False,
            highlight=False,
        )
    console.print("Try (the last one runs the demo's tasks as-is):", markup=False)
    for line in lines:
        console.print(f"  {clean(line)}", markup=False, highlight=False, soft_wrap=True)
    if kept is not None and kept.proc is not None:
        console.print(
            f"Stop it: kill {kept.proc.pid} && rm -rf {shlex.quote(kept.dir)}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def _demo(url: str, console: Console, stack: ExitStack, timeout_s: float) -> int:
    client = connect(url)  # any URL form the CLI takes (Sentinel, Cluster too)
    q = Queue(client, QUEUE)
    for key in client.scan_iter(match=q.keys.pattern()):
        client.delete(key)
    client.delete(LEDGER)
    workers = [_spawn(url), _spawn(url)]
    deaths: list[tuple[int, int, int]] = []  # (server ms, pid, signal)

    def stop_workers() -> None:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(10)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()

    stack.callback(stop_workers)
    # Both workers up before the jobs: a late worker claims all due jobs at once, and crashy
    # would then kill charge's first attempt with it (a slow or loaded machine).
    up_by = time.monotonic() + timeout_s / 3
    while len(live_workers(client, q.keys)[0]) < 2 and time.monotonic() < up_by:
        time.sleep(0.05)
    t0 = q.counts().now_ms
    jobs = {
        q.enqueue("demo.greet", {"name": "now"}): "greet (due now)",
        q.enqueue("demo.greet", {"name": "later"}, delay_ms=5_000): "greet (due in 5 s)",
        q.enqueue(
            "demo.charge", {"amount": 42}, max_attempts=3, backoff=FLAKY_BACKOFF
        ): "charge (always fails)",
        # Due a little later, so the worker it kills holds no other job at that moment.
        q.enqueue("demo.crashy", {}, delay_ms=1_500): "crashy (kills its worker)",
        # Kept whole once done: a lean finished job drops its errors, the RetryLater's among them.
        q.enqueue(
            "demo.webhook",
            {"event": "order.paid"},
            max_attempts=3,
            backoff=FLAKY_BACKOFF,
            keep_payload=True,
        ): "webhook (retry after 2 s)",
    }
    # The demo's own record of when: a lean finished job keeps no enqueued_ms (lua/complete.lua).
    enqueued_ms = q.counts().now_ms
    console.print(
        f"Enqueued {len(jobs)} jobs on queue '{QUEUE}' for 2 worker processes "
        f"(lease {LEASE_MS} ms, heartbeat {HEARTBEAT_MS} ms)\n"
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for i, w in enumerate(workers):
            if w.poll() is not None and w.returncode != 0:
                deaths.append((q.counts().now_ms, w.pid, -w.returncode))
                workers[i] = _spawn(url)  # a supervisor (systemd, k8s) would do this
        states = [q.status(j) for j in jobs]
        if all(s in ("done", "dead") for s in states):
            break
        time.sleep(0.05)
    stop_workers()
    print_timeline(console, q, client, Run(jobs, deaths, t0, enqueued_ms, LEASE_MS))
    ok = _as_expected(q, list(jobs))
    console.print(
        "\n[green]All five jobs ended as expected.[/]"
        if ok
        else "\n[red]Some jobs did not end as expected.[/]"
    )
    return 0 if ok else 1


def _as_expected(q: Queue, ids: list[str]) -> bool:
    """Each job ended as its story says, in enqueue order: the webhook done on its second
    attempt after its first asked for later (a RetryLater, not a crash or an ordinary error)."""
    if [q.status(j) for j in ids] != ["done", "done", "dead", "done", "done"]:
        return False
    webhook = q.get_job(ids[4])
    if webhook.attempts != 2 or [e["type"] for e in webhook.errors] != ["RetryLater"]:
        return False
    # Its retry was due when the handler asked, not after its backoff (the server's record).
    return (webhook.run_at_ms or 0) - int(webhook.errors[0]["at_ms"]) == RETRY_AFTER_MS
