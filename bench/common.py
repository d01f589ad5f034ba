"""Helpers shared by every system driver (run inside the driver subprocess).

Everything here needs only the standard library plus redis-py, which is installed both in the
peers' virtualenv and in the project's own environment (for ``systems/ours.py``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import redis

BENCH_DIR = Path(__file__).resolve().parent
LOG_DIR = BENCH_DIR / ".logs"

QUEUE = "bench"
COUNTER = "bench:count"
STARTS = "bench:starts"
PAD = "x" * 64

# Environment variables through which worker subprocesses learn where the private server is.
ENV_URL = "BENCH_REDIS_URL"
# run.py sets this to a file; every worker spawned here appends its process-group id to it, so
# run.py can kill leftovers if a driver subprocess is killed on timeout.
ENV_PIDFILE = "BENCH_PIDFILE"


def payload(i: int, timed: bool = False) -> dict[str, Any]:
    """The job payload every system sends: same shape and size for all of them."""
    return {"i": i, "t": 1 if timed else 0, "pad": PAD}


def env_url() -> str:
    return os.environ[ENV_URL]


def client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def handle_sync(r: redis.Redis, data: dict[str, Any]) -> None:
    """The handler body: bump the counter; timed jobs also record their start time."""
    if data.get("t"):
        r.rpush(STARTS, repr(time.time()))
    r.incr(COUNTER)


async def handle_async(r: Any, data: dict[str, Any]) -> None:
    """Async twin of :func:`handle_sync` (``r`` is a redis.asyncio client or compatible)."""
    if data.get("t"):
        await r.rpush(STARTS, repr(time.time()))
    await r.incr(COUNTER)


def reset(url: str) -> None:
    """Empty the PRIVATE server. Refuses anything that looks like the shared server."""
    if ":6379" in url:
        raise RuntimeError(f"refusing to flush {url}: that is the shared server")
    client(url).flushall()


def count(r: redis.Redis) -> int:
    return int(r.get(COUNTER) or 0)


def wait_count(
    r: redis.Redis, n: int, timeout: float, proc: subprocess.Popen[bytes] | None = None
) -> tuple[float, int, float, int]:
    """Poll the counter until it reaches ``n``.

    Returns ``(t_first, c_first, t_last, c_last)``: when the counter was first seen non-zero and
    its value then, and when polling stopped and the value then. Stops on timeout or when the
    worker process dies.
    """
    deadline = time.monotonic() + timeout
    t_first = 0.0
    c_first = 0
    c = 0
    while time.monotonic() < deadline:
        c = count(r)
        now = time.perf_counter()
        if c and not t_first:
            t_first, c_first = now, c
        if c >= n:
            return t_first, c_first, now, c
        if proc is not None and proc.poll() is not None and c == count(r):
            break
        time.sleep(0.002)
    return t_first, c_first, time.perf_counter(), c


def wait_until(pred: Callable[[], bool], timeout: float, step: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return False


def drain_rate(n: int, t_first: float, c_first: int, t_last: float, c_last: int) -> float:
    """Jobs/s over the window from the first completion seen to the last (excludes startup)."""
    if c_last < n:
        raise RuntimeError(f"only {c_last}/{n} jobs completed before the timeout")
    done = c_last - c_first
    span = t_last - t_first
    if done <= 0 or span <= 0:
        raise RuntimeError("drain finished within one poll; increase n")
    return done / span


def spawn(
    name: str, cmd: Sequence[str], url: str, extra_env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a worker subprocess in its own process group, logging to bench/.logs/<name>.log."""
    LOG_DIR.mkdir(exist_ok=True)
    env = dict(os.environ)
    env[ENV_URL] = url
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH_DIR), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra_env or {})
    log = open(LOG_DIR / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
    try:
        proc = subprocess.Popen(
            list(cmd),
            cwd=BENCH_DIR,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        log.close()
    pidfile = os.environ.get(ENV_PIDFILE)
    if pidfile:
        with open(pidfile, "a") as f:
            f.write(f"{proc.pid}\n")
    return proc


def stop(proc: subprocess.Popen[bytes], grace: float = 3.0) -> None:
    """Stop a process started by :func:`spawn` and everything in its process group."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    # Children (prefork pools, scheduler helpers) may outlive the leader: kill the group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(2)


@contextlib.contextmanager
def running(
    name: str, cmd: Sequence[str], url: str, extra_env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    proc = spawn(name, cmd, url, extra_env)
    try:
        yield proc
    finally:
        stop(proc)


def bin_path(exe: str) -> str:
    """Path of a console script installed next to the running interpreter."""
    return str(Path(sys.executable).parent / exe)


def log_tail(name: str, lines: int = 15) -> str:
    path = LOG_DIR / f"{name}.log"
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def wait_ready(
    r: redis.Redis,
    send_one: Callable[[], None],
    proc: subprocess.Popen[bytes],
    name: str,
    timeout: float = 30.0,
) -> None:
    """Send one warm-up job and wait until the worker has run it (the worker is then ready)."""
    before = count(r)
    send_one()
    if not wait_until(lambda: count(r) > before or proc.poll() is not None, timeout):
        raise RuntimeError(f"worker not ready after {timeout}s: {log_tail(name)}")
    if count(r) <= before:
        raise RuntimeError(f"worker exited with {proc.returncode}: {log_tail(name)}")


def collect_lateness(
    r: redis.Redis, n: int, due: float, timeout: float, proc: subprocess.Popen[bytes] | None = None
) -> list[float]:
    """Wait for ``n`` start stamps in STARTS; return lateness in ms relative to ``due``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if int(r.llen(STARTS)) >= n:
            break
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.01)
    stamps = [float(x) for x in r.lrange(STARTS, 0, -1)]
    if len(stamps) < n:
        raise RuntimeError(f"only {len(stamps)}/{n} scheduled jobs started within the timeout")
    return [(s - due) * 1000.0 for s in stamps]


def due_in(delay_s: float) -> float:
    """The instant the simultaneous jobs are due: the first whole second >= now + delay_s.

    Whole seconds, because some peers only accept integer epoch seconds (saq).
    """
    return float(int(time.time() + delay_s + 0.999))


def lateness_timeout(delay_s: float, n: int) -> float:
    return delay_s + 20.0 + n / 100.0


def memory_baseline(r: redis.Redis) -> int:
    """used_memory minus client buffers, so connections opened by a library do not count."""
    info: dict[str, Any] = r.info("memory")
    return int(info["used_memory"]) - int(info.get("mem_clients_normal", 0))
