"""`scheduler worker --processes N`: N worker processes under one supervisor.

Why processes: one worker is one Python process, so its handlers and its claim/complete work
share one core (the GIL). N processes use N cores. Each child is a whole `scheduler worker`
(its own connection, leases, heartbeat and worker id), so a child that dies takes nothing from
its siblings: its leases lapse and its jobs run again, as with any crashed worker.

The supervisor holds no Redis connection, runs no job and imports none of the user's code (a
registry that cannot be imported fails each child's first start: exit 4). It:
- starts each child in a process group of its own: a terminal's Ctrl-C reaches the supervisor
  only, which stops the children as below;
- on SIGTERM/SIGINT asks every child to stop gracefully (STOP_SIGNAL: idempotent, so a child
  that also got the service manager's own SIGTERM still has its grace period); on a second one
  kills them (their leases lapse; exit 130); exits when every child has; kills a child still
  running at the stop deadline (worker_pool_start.stop_deadline_s: past its own bounds, stuck
  where none of them acts, e.g. stopped by SIGSTOP; exit 1, its leases lapse), a reload's
  replaced one too;
- stops everything and exits with a child's code when a child of the first start fails before it
  is ready (the one-process codes: 3 Redis unreachable, 5 forbidden, ...), so a misconfigured
  pool fails as one worker would; the same, exit 5, when any child exits 5 later (an ACL
  permission removed mid-run, a password rotated): every child is the same Redis user, and a
  restart cannot help, so the service manager (RestartPreventExitStatus) and operators see it;
- restarts a child that exits once ready (the OOM killer, a crash), after 1 s doubling to 30 s,
  the wait reset once a child has run 60 s (a restarted one that exits before ready, with 0
  too, the same); one ready that stopped cleanly (exit 0: its --max-jobs or --max-memory-mb)
  at once, no sooner than 1 s after its start; never one an operator
  stopped (`scheduler workers stop|quiet`: EXIT_RETIRED or EXIT_QUIETED, the verb logged): its
  slot is retired, and once every slot is, it exits 0;
- on SIGHUP replaces the children one at a time with new processes (new code on disk), each
  old one stopping gracefully once its replacement is ready (`_reload`); a retired slot gets
  none, even when it was retired while its new process started (that one is stopped);
- on Linux, has each child ask the kernel to SIGTERM it if the supervisor dies (kill -9;
  `join_pool`): no orphaned worker keeps claiming unsupervised.

A child says it is ready (Redis reached, scripts loaded, metrics port bound) by writing
`ready [<metrics port>]` to the pipe named by READY_FD_ENV (worker_pool_child.py: the child's
side). With --metrics-port, the supervisor serves every ready child's metrics on that one port,
each sample labelled process="<index>" (worker_pool_metrics.py); the children serve theirs on
127.0.0.1 only."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import time
from collections.abc import Sequence

from scheduler.cli.worker_pool_child import FINAL_METRICS_ENV, RETIRED_BY, STOP_SIGNAL
from scheduler.cli.worker_pool_metrics import PoolMetrics
from scheduler.cli.worker_pool_proc import RESTART_FIRST_S, Child, exit_code, killed_by
from scheduler.cli.worker_pool_reload import Reload
from scheduler.core.exits import EXIT_FAILED, EXIT_FORBIDDEN, EXIT_FORCED, EXIT_OK

RESTART_MAX_S = 30.0
RESTART_RESET_S = 60.0  # a child that ran this long restarts after RESTART_FIRST_S again
_POLL_S = 0.2

log = logging.getLogger("scheduler.worker")


class Pool(Reload):
    """The supervisor of `n` children: argv[i] and env[i] are child i's command line and
    environment (worker_pool_start.child_commands); `metrics`, if given, serves the children's
    metrics (the pool tells it where they are); a child still running `stop_deadline_s` after
    it was asked to stop is killed (worker_pool_start.stop_deadline_s)."""

    def __init__(
        self,
        n: int,
        argv: Sequence[Sequence[str]],
        env: Sequence[dict[str, str]],
        metrics: PoolMetrics | None = None,
        stop_deadline_s: float | None = None,
    ) -> None:
        if not (len(argv) == len(env) == n >= 1):
            raise ValueError("one command line and one environment per process")
        self.children = [Child(i) for i in range(n)]
        self._argv, self._env, self._metrics = argv, env, metrics
        self._deadline_s = stop_deadline_s
        self._signals = 0  # SIGTERM/SIGINT received
        self._sent = 0  # stops sent to the children (the pool's own stop sends one too)
        self._forced = False  # the children were killed (a second signal)
        self._stop_exits: list[int] = []  # the children's codes once the stop began
        self._init_reload()

    def _start(self, child: Child) -> None:
        env = self._env[child.index]
        if self._metrics is not None:  # its last counts, carried on in its slot
            child.handoff = self._metrics.handoff_path()
            env = dict(env, **{FINAL_METRICS_ENV: child.handoff})
        child.start(self._argv[child.index], env)

    def _swapped(self, index: int) -> None:
        if self._metrics is not None:
            self._metrics.carry.forget(index)

    def _discard(self, child: Child) -> None:
        if self._metrics is not None:
            self._metrics.discard(child.handoff)

    # -- signals ------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP:
            self._hups += 1
        else:
            self._signals += 1

    def _forward(self) -> None:
        """One SIGTERM to the children per signal received, counting the one the pool's own
        stop sent: a user's first signal after that is not the children's second."""
        while self._sent < self._signals:
            self._terminate()

    def _terminate(self) -> None:
        """The first stop asks each child to stop gracefully (STOP_SIGNAL); a later one (the
        user's second signal) kills them: their leases lapse, as a worker's own second signal
        leaves them."""
        self._sent += 1
        sig = STOP_SIGNAL if self._sent == 1 else signal.SIGKILL
        if self._sent == 1:
            running = sum(1 for c in self._everyone() if c.running())
            log.info("stopping %d worker processes", running)
        else:
            self._forced = True
            log.warning("second signal: killing the worker processes, leases lapse on their own")
        self._queue.clear()
        for c in self._everyone():
            c.restart_at = None
            c.send(sig)

    def _everyone(self) -> list[Child]:
        extra = [self._incoming] if self._incoming is not None else []
        return [*self.children, *extra, *self._retiring]

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        old = {s: signal.signal(s, self._on_signal) for s in sigs}
        try:
            for c in self.children:
                self._start(c)
            return self._supervise(wake_r)
        finally:
            for c in self._everyone():  # an exception here must not leave children running
                c.kill()
            for s, h in old.items():
                signal.signal(s, h)
            signal.set_wakeup_fd(old_wakeup)
            os.close(wake_r)
            os.close(wake_w)

    def _supervise(self, wake_r: int) -> int:
        failed: int | None = None  # a first start's failure: the pool's exit code
        while True:
            self._forward()
            # Every child stopped by an operator (`scheduler workers stop --all`): the pool's stop.
            stopping = self._sent > 0 or all(c.retired for c in self.children)
            now = time.monotonic()
            for c in self._everyone():
                c.past_deadline(self._deadline_s, now)
            for c in self.children:
                if c.proc is not None and c.proc.poll() is not None:
                    code = self._reap(c, stopping, now)
                    if code is not None and failed is None:
                        failed = code
                        if self._sent == 0:
                            self._terminate()
                        stopping = True
                if c.proc is None and c.restart_at is not None and now >= c.restart_at:
                    if stopping:
                        c.restart_at = None
                    else:
                        self._restart(c, now)
            self._reload(stopping)
            if stopping and all(c.proc is None for c in self._everyone()):
                return failed if failed is not None else self._final_code()
            self._publish()
            self._wait(wake_r)

    def _publish(self) -> None:
        """Tell the metrics server each slot's current ready child: self.children holds the
        newest ready process of each slot (a reload's new one once it is ready, never the one
        it replaces), and the retired slots. A new tuple each time, never edited: its scrape
        threads read it as is."""
        if self._metrics is not None:
            self._metrics.slots = (
                {
                    c.index: c.metrics_port if c.proc is not None and c.ready else None
                    for c in self.children
                    if not c.retired
                },
                frozenset(c.index for c in self.children if c.retired),
            )

    def _restart(self, c: Child, now: float) -> None:
        try:
            self._start(c)
        except OSError as exc:  # no fork now (EAGAIN, ENOMEM): try again later, as for an exit
            c.restart_at = now + c.backoff_s
            log.error("worker process %d could not start: %s; retrying in %.1f s",
                      c.index + 1, exc, c.backoff_s)  # fmt: skip
            c.backoff_s = min(c.backoff_s * 2, RESTART_MAX_S)

    def _reap(self, c: Child, stopping: bool, now: float) -> int | None:
        """Child c exited: record it; plan its restart; return its code if it was a first
        start that failed before ready, or exit 5 (the pool then stops)."""
        assert c.proc is not None
        c.read_ready()
        code = exit_code(c.proc.returncode)
        verb = RETIRED_BY.get(code, "")  # stopped by an operator: 'stop' or 'quiet'
        if verb or (stopping and c.proc.returncode in (-STOP_SIGNAL, -signal.SIGTERM)):
            code = EXIT_OK  # an operator's stop, or stopped before it handled signals (starting)
        if c.killed_at_deadline:
            code = EXIT_FAILED  # stuck past its stop deadline: as a crashed worker
        # Killed by a signal (the OOM killer's SIGKILL): the pool's own exit is a crash's 1,
        # one of the table's codes, never the shell's 128+N.
        by = None if code in (EXIT_OK, EXIT_FAILED) else killed_by(c.proc.returncode)
        was_ready, first = c.ready, c.first_start
        pid = c.proc.pid
        c.proc, c.first_start = None, False
        c.close_ready()
        if self._metrics is not None:
            self._metrics.reaped(c.index, c.handoff)
        if stopping:
            if by:
                log.error("worker process %d (pid %d) was killed by %s while stopping: its jobs "
                          "run again once their leases lapse", c.index + 1, pid, by)  # fmt: skip
            self._stop_exits.append(EXIT_FAILED if by else code)
            return None
        if verb:
            self._retire(c, pid, verb)
            return None
        if first and not was_ready:
            log.error("worker process %d failed to start (%s): stopping the others",
                      c.index + 1, f"killed by {by}" if by else f"exit {code}")  # fmt: skip
            return code if code != EXIT_OK and not by else EXIT_FAILED
        if code == EXIT_FORBIDDEN:  # every child is the same Redis user: none would fare better
            log.error("worker process %d (pid %d) exited with code %d: Redis refused it for good "
                      "(a permission, its password); restarting cannot help: stopping the others",
                      c.index + 1, pid, code, extra={"worker_process": c.index + 1, "pid": pid,
                                                     "exit_code": code})  # fmt: skip
            return code
        # A planned stop (--max-jobs, its own SIGTERM): no backoff, but a process lives 1 s at
        # least per round (the doubling held --max-jobs 1 to a job per 30 s). Only a ready one
        # reaches those: an exit 0 before ready is a failed start, restarted with the backoff.
        if code == EXIT_OK and was_ready:
            c.restart_at = max(now, c.started_at + RESTART_FIRST_S)
            log.info("worker process %d (pid %d) stopped cleanly (--max-jobs/-memory-mb); starting "
                     "another", c.index + 1, pid, extra={"worker_process": c.index + 1,
                                                         "pid": pid})  # fmt: skip
            return None
        if now - c.started_at >= RESTART_RESET_S:
            c.backoff_s = RESTART_FIRST_S
        c.restart_at = now + c.backoff_s
        log.warning(
            "worker process %d (pid %d) exited with code %d; restarting in %.1f s",
            c.index + 1, pid, code, c.backoff_s,
            extra={"worker_process": c.index + 1, "pid": pid, "exit_code": code},
        )  # fmt: skip
        c.backoff_s = min(c.backoff_s * 2, RESTART_MAX_S)
        return None

    def _retire(self, c: Child, pid: int, verb: str) -> None:
        """Slot c's process (pid) was stopped by an operator: the slot is never started again."""
        c.retired = True
        left = sum(1 for k in self.children if not k.retired)
        log.info("worker process %d (pid %d) stopped by an operator (scheduler workers %s): not "
                 "replaced; %d of %d processes left%s", c.index + 1, pid, verb, left,
                 len(self.children), "" if left else ": the pool stops",
                 extra={"worker_process": c.index + 1, "pid": pid})  # fmt: skip

    def _final_code(self) -> int:
        """After a stop: 130 if the children were forced, else the first child that did not
        stop cleanly, else 0. A crash before the stop (its restart still pending) was logged
        and does not make a clean stop a failure."""
        if self._forced or EXIT_FORCED in self._stop_exits:
            return EXIT_FORCED
        return next((code for code in self._stop_exits if code != EXIT_OK), EXIT_OK)

    def _wait(self, wake_r: int) -> None:
        fds = [c.ready_fd for c in self._everyone() if c.ready_fd is not None]
        try:
            readable, _, _ = select.select([wake_r, *fds], [], [], _POLL_S)
        except InterruptedError:  # pragma: no cover - PEP 475 retries; a signal handler ran
            return
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 512)
        for c in self._everyone():
            if c.ready_fd is not None and c.ready_fd in readable:
                c.read_ready()
