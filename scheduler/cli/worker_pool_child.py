"""The child's side of `scheduler worker --processes N` (worker_pool.py is the supervisor's):
joining the pool at start, saying when it is ready (and where its metrics are), and the signal
the supervisor stops it with."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys

from prometheus_client import CollectorRegistry, generate_latest

from scheduler.core.exits import EXIT_FAILED
from scheduler.worker import logs

READY_FD_ENV = "SCHEDULER_WORKER_READY_FD"
# Where a pool child with metrics writes its last counts once its worker returned (the supervisor
# carries them in its slot: worker_pool_metrics.py).
FINAL_METRICS_ENV = "SCHEDULER_WORKER_FINAL_METRICS"
POOL_PID_ENV = "SCHEDULER_WORKER_POOL_PID"
# The supervisor's "stop gracefully" to its children: not SIGTERM, which a child may also get
# from a service manager signalling the whole group (systemd's default KillMode), and whose
# second arrival means "exit now" to a worker. A child handles this one as a stop request that
# never counts as a signal (cli/worker.py); the user's second signal is sent on as SIGKILL.
STOP_SIGNAL = signal.SIGUSR1

# A pool child an operator stopped (`scheduler workers stop`: EXIT_RETIRED) or quieted
# (`scheduler workers quiet`: EXIT_QUIETED) exits with one of these codes, seen only by its
# supervisor, which retires its slot: never starts another in it (a stop that merely restarted
# it would not be one), reports it as a clean stop and names the verb in its log line. Outside
# the table of exit codes: no command ever exits with them (a lone worker exits 0).
EXIT_RETIRED = 86
EXIT_QUIETED = 87
RETIRED_BY = {EXIT_RETIRED: "stop", EXIT_QUIETED: "quiet"}  # exit code -> the operator's verb


def retired_code(verb: str) -> int:
    """The exit code of a pool child an operator stopped with `verb` ('stop' or 'quiet')."""
    return EXIT_QUIETED if verb == "quiet" else EXIT_RETIRED


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def join_pool() -> bool:
    """First thing in a pool's child (False elsewhere): ask the kernel (Linux) to SIGTERM this
    process when the supervisor dies, and leave if it already has. Done here, not between fork
    and exec: the supervisor's fork then runs no Python (preexec_fn is unsafe with threads)."""
    pid = os.environ.pop(POOL_PID_ENV, None)
    if pid is None:
        return False
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # a libc without prctl
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if str(os.getppid()) != pid:  # the supervisor died before prctl took effect
        sys.exit(EXIT_FAILED)
    return True


def notify_ready(metrics_port: int | None) -> None:
    """In a pool's child: tell the supervisor this worker started, and the loopback port of its
    metrics if it serves them (no-op outside a pool)."""
    fd = os.environ.pop(READY_FD_ENV, None)
    if fd is None:
        return
    try:
        os.write(int(fd), ready_message(metrics_port))
        os.close(int(fd))
    except (OSError, ValueError):  # the supervisor is gone; PDEATHSIG stops us
        pass


def hand_over_metrics(registry: CollectorRegistry) -> None:
    """In a pool's child whose worker has returned (nothing more is counted): its metrics, to
    the file the supervisor named, whole or not at all (no-op outside a pool)."""
    path = os.environ.pop(FINAL_METRICS_ENV, None)
    if path is None:
        return
    try:
        with open(path + ".tmp", "wb") as f:
            f.write(generate_latest(registry))
        os.replace(path + ".tmp", path)
    except OSError as exc:  # the supervisor's directory is gone: its slot starts again
        logs.console(f"last metrics not handed over: {exc}", logging.WARNING)


def ready_message(metrics_port: int | None) -> bytes:
    """`ready\n` or `ready <port>\n`: one write under PIPE_BUF, so the supervisor's one read
    gets it whole."""
    return b"ready\n" if metrics_port is None else b"ready %d\n" % metrics_port


def parse_ready(message: bytes) -> int | None:
    """The metrics port a ready message names (None: no metrics, or a message without one)."""
    words = message.split()
    if len(words) == 2 and words[0] == b"ready" and words[1].isdigit():
        return int(words[1])
    return None
