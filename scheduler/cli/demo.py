"""`scheduler demo`: four jobs, two worker processes, and a timeline of what happened.

The tasks are real handlers in scheduler.cli.demo_tasks; the worker processes import its
`registry`. With `keep`, the private Redis outlives the demo so its jobs can be explored."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import redis
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from scheduler.admin.inspection import live_workers
from scheduler.cli.demo_tasks import FLAKY_BACKOFF, LEDGER, QUEUE
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


def run_demo(
    url: str | None, console: Console | None = None, timeout_s: float = 45.0, keep: bool = False
) -> int:
    """Run the demo on `url`, or on a private Redis started here. `keep`: that private Redis
    keeps running after the demo exits (its own session, so the terminal's Ctrl-C or hang-up
    does not reach it), and the commands to explore it are printed."""
    console = console or Console()
    with ExitStack() as stack:
        kept: PrivateRedis | None = None
        if url is None:
            try:
                server = PrivateRedis(detach=keep)
                if keep:
                    server.start()  # no cleanup: it outlives this process
                else:
                    stack.enter_context(server)
            except (NoServerBinary, RuntimeError) as exc:
                console.print(f"[red]error:[/] {exc}")
                return 1
            url, kept = server.url, (server if keep else None)
            console.print(f"Started a private Redis ({server.binary}) at {url}")
        code = _demo(url, console, stack, timeout_s)
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
    _timeline(console, q, client, jobs, deaths, t0, enqueued_ms)
    ok = [q.status(j) for j in jobs] == ["done", "done", "dead", "done"]
    console.print(
        "\n[green]All four jobs ended as expected.[/]"
        if ok
        else "\n[red]Some jobs did not end as expected.[/]"
    )
    return 0 if ok else 1


def _shown(stored: object) -> str:
    """Stored job text inside a markup line: control characters escaped, markup inert."""
    return escape(clean(stored))


def _timeline(
    console: Console,
    q: Queue,
    client: redis.Redis,
    jobs: dict[str, str],
    deaths: list[tuple[int, int, int]],
    t0: int,
    enqueued_ms: int,
) -> None:
    """From what outlives a lean finished job: its Job (state, attempts, run_at_ms, errors,
    result, finished_ms) and the handlers' ledger (when each attempt started)."""
    events: list[tuple[int, str, str]] = []
    started: dict[tuple[str, int], int] = {}  # (job id, attempt) -> server ms
    for raw in client.lrange(LEDGER, 0, -1):
        e = json.loads(raw)
        started[(e["job"], e["attempt"])] = e["at_ms"]
        events.append(
            (
                e["at_ms"],
                jobs.get(e["job"], e["job"]),
                f"started attempt {e['attempt']} in worker pid {e['pid']}",
            )
        )
    for pid_ms, pid, sig in deaths:
        events.append((pid_ms, "-", f"[red]worker pid {pid} died (signal {sig})[/]; restarted"))
    for job_id, label in jobs.items():
        j = q.get_job(job_id)
        f = j.fields
        due = "" if j.errors else f", due at {((j.run_at_ms or t0) - t0) / 1000:+.3f}s"
        events.append((enqueued_ms, label, "enqueued" + due))
        for err in j.errors:
            attempt = int(err["attempt"])
            if attempt < (j.max_attempts or 0):
                delay = FLAKY_BACKOFF.delay_ms(attempt)
                tail = (
                    f"[yellow]retry in {delay} ms[/] (backoff {FLAKY_BACKOFF.base_ms} ms x "
                    f"{FLAKY_BACKOFF.factor:g}^{attempt - 1})"
                )
            else:
                tail = "no attempts left"
            events.append(
                (
                    int(err["at_ms"]),
                    label,
                    f"attempt {attempt} failed: {_shown(err['type'])}: {_shown(err['message'])} "
                    f"-> {tail}",
                )
            )
        if j.state == "done":
            attempts = j.attempts or 0
            if attempts > 1 and (job_id, attempts) in started:
                events.append(
                    (
                        started[(job_id, attempts)] - 1,
                        label,
                        f"lease of attempt {attempts - 1} expired after {LEASE_MS} ms "
                        "-> claimed again",
                    )
                )
            events.append(
                (
                    int(f["finished_ms"]),
                    label,
                    f"[green]done[/] after {j.attempts} attempt(s): {_shown(j.result_json)}",
                )
            )
        elif j.state == "dead":
            events.append(
                (
                    int(f["dead_ms"]),
                    label,
                    f"[red]dead-lettered[/] ({_shown(j.dead_reason)}); see `scheduler dead list`",
                )
            )
    table = Table(title="What happened (server clock, from the first enqueue)")
    table.add_column("t", justify="right")
    table.add_column("job")
    table.add_column("event")
    for at, label, text in sorted(events, key=lambda e: e[0]):
        table.add_row(f"{(at - t0) / 1000:+.3f}s", label, text)
    console.print(table)
