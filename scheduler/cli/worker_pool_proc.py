"""One child process of a worker pool, as the supervisor sees it (worker_pool.py): its process,
the pipe it says "ready" on (with its metrics port), and its restart plan."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.cli.worker_pool_child import POOL_PID_ENV, READY_FD_ENV, STOP_SIGNAL, parse_ready

RESTART_FIRST_S = 1.0

log = logging.getLogger("scheduler.worker")


def exit_code(returncode: int) -> int:
    """A child's exit status as a shell shows it (killed by signal N: 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def killed_by(returncode: int) -> str | None:
    """The signal that killed a child ('SIGKILL': the OOM killer's), None if it exited."""
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


@dataclass
class Child:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    ready_fd: int | None = None
    ready: bool = False
    metrics_port: int | None = None  # on 127.0.0.1, said with "ready"
    first_start: bool = True
    started_at: float = 0.0
    restart_at: float | None = None
    backoff_s: float = RESTART_FIRST_S
    retired: bool = False  # stopped by an operator (EXIT_RETIRED): not started again
    stop_sent_at: float | None = None  # when the supervisor first asked it to stop
    killed_at_deadline: bool = False  # still running at the stop deadline: killed
    handoff: str | None = None  # where it writes its last metrics (worker_pool_metrics.py)

    def start(self, argv: Sequence[str], env: dict[str, str]) -> None:
        r, w = os.pipe()
        env = dict(env, **{READY_FD_ENV: str(w), POOL_PID_ENV: str(os.getpid())})
        try:
            self.proc = subprocess.Popen(
                list(argv),
                env=env,
                pass_fds=(w,),
                stdin=subprocess.DEVNULL,
                process_group=0,  # a terminal's Ctrl-C reaches the supervisor only
            )
        except OSError:
            os.close(r)
            raise
        finally:
            os.close(w)
        self.ready_fd, self.ready, self.metrics_port = r, False, None
        self.started_at, self.restart_at = time.monotonic(), None
        self.stop_sent_at, self.killed_at_deadline = None, False
        log.info(
            "worker process %d started (pid %d)", self.index + 1, self.proc.pid,
            extra={"worker_process": self.index + 1, "pid": self.proc.pid},
        )  # fmt: skip

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            if sig == STOP_SIGNAL and self.stop_sent_at is None:
                self.stop_sent_at = time.monotonic()

    def past_deadline(self, deadline_s: float | None, now: float) -> bool:
        """Asked to stop over deadline_s ago and still running: kill it (once), log it, True.
        Its own bounds have all passed by then (worker_pool_start.stop_deadline_s): it is
        stuck where none of them can act (stopped: SIGSTOP), and its leases lapse."""
        if deadline_s is None or self.stop_sent_at is None or self.killed_at_deadline:
            return False
        if now - self.stop_sent_at < deadline_s or not self.running():
            return False
        assert self.proc is not None
        self.killed_at_deadline = True
        log.error(
            "worker process %d (pid %d) did not stop within %.0f s of the stop (frozen?): "
            "killed, its jobs run again once their leases lapse",
            self.index + 1, self.proc.pid, deadline_s,
            extra={"worker_process": self.index + 1, "pid": self.proc.pid},
        )  # fmt: skip
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        return True

    def read_ready(self) -> None:
        """Take the child's "ready" message if it is there (or the pipe's end)."""
        if self.ready_fd is None:
            return
        r, _, _ = select.select([self.ready_fd], [], [], 0)
        if not r:
            return
        message = os.read(self.ready_fd, 64)
        if message:
            self.ready, self.metrics_port = True, parse_ready(message)
        self.close_ready()  # ready, or EOF: the pipe has nothing more to say

    def close_ready(self) -> None:
        if self.ready_fd is not None:
            os.close(self.ready_fd)
            self.ready_fd = None

    def kill(self) -> None:
        """SIGKILL and reap, for the supervisor's own failure: no child may outlive it."""
        if self.running():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()
        self.close_ready()
