"""The runtime: starts the loops, notices one that dies, and runs the shutdown sequence
(see the package docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import AuthenticationError, RedisError

from scheduler.core import loop_guard
from scheduler.core.connection import UNREACHABLE, is_cluster, key_nodes
from scheduler.core.errors import SchedulerError
from scheduler.worker import settings as worker_settings
from scheduler.worker import signals, task_exits
from scheduler.worker.claiming import Claiming
from scheduler.worker.core import _Deadline, _Fatal, _within
from scheduler.worker.failures import error_text
from scheduler.worker.heartbeat import Heartbeats
from scheduler.worker.newer_outcomes import give_up_newer
from scheduler.worker.partitioned_start import expand_until_read
from scheduler.worker.settings import _SETTLE_S, _STOP_LOOP_S, EXIT_ERROR, EXIT_FORCED, EXIT_OK


class Worker(Claiming, Heartbeats):
    """One worker process's runtime (see the package docstring)."""

    _scripts_loaded = False  # by preflight(): run() loads them only when it was not called
    _ran = False  # run() was called: once per Worker

    async def preflight(self) -> None:
        """Raise (redis ConnectionError etc.) when Redis cannot be reached; load the scripts."""
        await self._load_scripts()
        self._check_pool()  # SettingsError: a URL pool too small (after the slot map's read)
        self._scripts_loaded = True
        await self._warn_paused()

    async def _load_scripts(self) -> None:
        """On a cluster, only on the primaries of this worker's queues: a node of other queues
        down must not keep it from starting, as it does not stop a running worker (its calls go
        one per node). One of its own queues' that does not answer is skipped too, while another
        answers: those queues are claimed once it does (their scripts loaded on NOSCRIPT)."""
        texts = [text for _, text in self._pipe.scripts.preload_commands()]
        client: Any = self.client
        if not is_cluster(client):
            await client.ping()
            for text in texts:
                await client.script_load(text)
        else:
            await client.initialize()  # the slot map key_nodes reads
            nodes = key_nodes(client, [q.keys.due for q in self.queues])
            down: list[str] = []
            for node in nodes:
                try:
                    await client.execute_command("PING", target_nodes=node)
                    for text in texts:
                        await client.execute_command("SCRIPT LOAD", text, target_nodes=node)
                except UNREACHABLE as exc:
                    if isinstance(exc, AuthenticationError) or len(down) + 1 == len(nodes):
                        raise
                    down.append(f"{node.name} ({type(exc).__name__}: {exc})")
            if down:
                self.log.warning("not answering at start, claimed from once they answer: the "
                                 "queues of %s", ", ".join(down))  # fmt: skip

    async def _warn_paused(self) -> None:
        """Say at start which queues are paused (Queue.pause): else a worker that claims
        nothing looks broken. Best effort: a queue that cannot be read is the claims' to say."""
        paused = []
        for q in self.queues:
            with contextlib.suppress(RedisError, SchedulerError):
                if (await q.aq.counts()).paused:
                    paused.append(q.name)
        if paused:
            self.log.warning("paused, so nothing is claimed from it until resumed (`scheduler "
                             "resume -q`): %s", ", ".join(paused))  # fmt: skip

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals > 1:
            self.log.warning("second signal: exiting now, leases lapse on their own")
            os._exit(EXIT_FORCED)
        self.log.info("signal %s: stopping (grace %.1fs)", signum, self.settings.grace_s)
        self.request_stop()

    def _on_loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # asyncio's own reports (e.g. a library's "Unclosed ..." at GC) go through our logger,
        # so --json-logs output stays one JSON object per line (the traceback in its `exc`).
        exc = context.get("exception")
        why = f": {type(exc).__name__}: {error_text(exc)}" if exc else ""
        self.log.warning("asyncio: %s%s", context.get("message", "unhandled"), why, exc_info=exc)

    async def run(self, *, install_signals: bool = True) -> int:
        """Claim and run jobs until stopped, then shut down gracefully.

        Stops on `request_stop()`, the first SIGTERM/SIGINT (a second one exits at once and
        leaves the leases to lapse) or a fatal error. Shutdown lets running handlers finish
        for `grace_s`, reports their outcomes and releases the jobs it did not finish.
        Cancelling the task running it shuts down the same way without the grace period,
        then raises CancelledError.

        Args:
            install_signals: handle SIGTERM/SIGINT on the running loop (False when embedding
                the worker in an application that handles signals itself).

        Returns:
            The process exit code: 0 after a clean stop, non-zero after a fatal error (see
            scheduler/core/exits.py). BadArgument: a second run() (a Worker runs once: make
            another), install_signals on a thread other than the main one, or a client first
            used in a parent process or on another loop still open (core/loop_guard.py)."""
        worker_settings.check_run(self._ran, install_signals)
        loop_guard.check(self.client, "redis.asyncio client")  # before any I/O, as a queue's
        self._loop = loop = asyncio.get_running_loop()
        if install_signals:  # and a forked child (a handler's helper) inherits none of it
            signals.install(loop, self._on_signal)
        self._ran = True
        uncontain = task_exits.install(loop)  # a sys.exit() in a handler's task fails its job
        # asyncio's reports through our log, on a loop with no handler of its own (the CLI):
        # an app's handler (its error reporter) stays in charge. Set last: a refused start
        # leaves the app's loop as it found it.
        ours = loop.get_exception_handler() is None
        if ours:
            loop.set_exception_handler(self._on_loop_exception)
        s = self.settings
        self.log.info("worker %s started: queues=%s concurrency=%d lease=%dms heartbeat=%dms",
                      self.id, ",".join(s.queues), s.concurrency, s.lease_ms,
                      s.heartbeat_ms)  # fmt: skip
        try:
            await self._serve()
        except asyncio.CancelledError:
            # An app stops what it started by cancelling it (a lifespan exit, a TaskGroup,
            # wait_for): the shutdown still runs, without grace (from the top if it was under
            # way), so no loop outlives run() and the jobs held are given back.
            self.log.warning("worker %s: run() cancelled; stopping without grace", self.id)
            self._no_grace = True
            await self._stop_sequence()
            raise
        finally:
            self._end_loops()
            self._threads.close()
            if ours and loop.get_exception_handler() == self._on_loop_exception:
                loop.set_exception_handler(None)
            if install_signals:
                signals.remove(loop)
            uncontain()
        self.log.info("worker %s stopped", self.id)
        return self._exit_code

    async def _serve(self) -> None:
        # A partitioned queue's logical name: its partitions (read before the first claim).
        await self._guarded("queues", expand_until_read(self, _SETTLE_S))
        beat = self._guarded("presence", self._beat_workers(), deadline_s=_SETTLE_S)
        await asyncio.gather(beat, self._preload())
        self._spawn(self._heartbeat_loop(), "heartbeat")
        self._spawn(self._reporter_loop(), "reporter")
        for keys in self._wake_groups():
            self._spawn(self._waker_loop(keys), f"waker:{keys[0]}")
        self._spawn(self._claim_loop(), "claim")
        await self._stop_claiming.wait()
        await self._stop_sequence()

    async def _preload(self) -> None:
        """An embedded worker's scripts (no preflight()): a complete met by NOSCRIPT takes two
        more round trips, a claim sent meanwhile ran first and reaped its lapsed lease. Best
        effort: a server down now loads them at their first NOSCRIPT."""
        if not self._scripts_loaded:
            with contextlib.suppress(Exception):
                await _within(self._load_scripts(), _SETTLE_S)

    async def _stop_sequence(self) -> None:
        """The shutdown (package docstring). Each step takes what is left, so a second run
        (run() cancelled meanwhile) finishes the first."""
        self.request_stop()
        fast = self._exit_code != EXIT_OK or self._no_grace  # no grace period
        grace_end = time.monotonic() + (0.0 if fast else self.settings.grace_s)
        wakers = self._tasks("waker")
        # a claim in flight may finish (its jobs are then given back), within the grace
        await self._wait_bounded(
            self._tasks("claim"), max(grace_end - time.monotonic(), _STOP_LOOP_S)
        )
        self._closed = True
        self._idle.set()  # lets the wakers see _closed
        for t in wakers:  # a wake-up pop holds nothing: cancel it now
            t.cancel()
        await self._shutdown(grace_end)
        self._stop_heartbeat.set()
        self._beat_now.set()
        await self._wait_bounded(self._tasks("heartbeat", "waker"), _STOP_LOOP_S)
        await self._guarded("presence", self._beat_workers(remove=True), deadline_s=2.0)

    def _end_loops(self) -> None:
        """run() is leaving: nothing it started may go on (a second cancellation can cut the
        shutdown short): every stop flag set, each loop and running handler cancelled."""
        self._closed = self._shutting_down = True
        self.request_stop()
        for flag in (self._stop_reporter, self._report_retry, self._stop_heartbeat,
                     self._beat_now, self._idle):  # fmt: skip
            flag.set()
        for r in list(self.running.values()):
            self._stop(r, "shutdown")
        for t in self._loops.values():
            t.cancel()

    def _tasks(self, *kinds: str) -> list[asyncio.Task[None]]:
        """The loops of these kinds started so far (a waker's name is waker:<key>)."""
        return [t for name, t in self._loops.items() if name.split(":")[0] in kinds]

    def _spawn(self, coro: Any, name: str) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._loop_ended)
        self._loops[name] = task

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        """A background loop ended: expected only once shutdown asked it to."""
        if task.cancelled():
            if not self._stop_claiming.is_set():
                self._fatal(EXIT_ERROR, f"loop {task.get_name()} was cancelled")
            return
        exc = task.exception()
        if isinstance(exc, _Fatal):
            self._fatal(exc.code, str(exc))
        elif exc is not None:
            self.log.error("loop %s died", task.get_name(), exc_info=exc)
            self._fatal(EXIT_ERROR, f"loop {task.get_name()} died: {type(exc).__name__}: {exc}")
        elif not self._stop_claiming.is_set():
            self._fatal(EXIT_ERROR, f"loop {task.get_name()} ended early")

    async def _wait_bounded(self, tasks: Sequence[asyncio.Task[None]], timeout_s: float) -> None:
        """Wait for tasks to end, at most timeout_s; cancel what is left and go on (a library
        may swallow a cancellation: the loop's own stop flag ends it later)."""
        tasks = [t for t in tasks if not t.done()]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=max(timeout_s, 0.0))
        for t in pending:
            self.log.warning("loop %s did not stop in %.1fs; cancelled", t.get_name(), timeout_s)
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=0.2)

    async def _guarded(self, what: str, coro: Any, deadline_s: float | None = None) -> None:
        """One call outside a loop (start-up / final presence beat): a transient error is
        logged and counted, a fatal one stops the worker."""
        try:
            await (coro if deadline_s is None else _within(coro, deadline_s))
        except _Deadline:
            self.log.warning("%s: no answer from Redis in %.1fs; going on", what, deadline_s)
        except Exception as exc:
            try:
                self._loop_error(what, exc)
            except _Fatal as fatal:
                self._fatal(fatal.code, str(fatal))
            except Exception as bug:
                self.log.error("%s failed", what, exc_info=bug)
                self._fatal(EXIT_ERROR, f"{what} failed: {type(bug).__name__}: {bug}")

    async def _shutdown(self, deadline: float) -> None:
        """After claiming stopped. See the module docstring for the order."""
        if self._exit_code != EXIT_OK or self._no_grace:
            deadline = time.monotonic()  # a fatal error (or a cancel) met meanwhile: no grace
        settle = time.monotonic() + _SETTLE_S
        # The jobs never started are taken before the first await: a run ending meanwhile must
        # not start one of them (_pump) after the stop.
        never = [*self._backlog, *self._behind.values(), *self._give_back]
        self._backlog.clear()
        self._behind.clear()
        self._give_back.clear()
        for r in never:  # never started: give them back at once
            r.finished = True
        never += await self._replay_claims(settle)  # claims whose answer was lost: their jobs
        await self._release(never, settle)
        # A fatal error met during the grace ends it (_fatal wakes this wait): the loop that
        # died may be the heartbeat loop, which also stops the runs whose lease ran out.
        while self.running and time.monotonic() < deadline and self._exit_code == EXIT_OK:
            self._slot_free.clear()
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self._slot_free.wait(), deadline - time.monotonic())
        # Reporter: stop it by its flag, let its call in flight end (bounded), then flush all.
        self._stop_reporter.set()
        self._report_retry.set()  # out of its backoff
        self._report.set()
        await self._wait_bounded(self._tasks("reporter"), _STOP_LOOP_S)
        self._restore_sending()  # a call that never returned: its reports are sent again here
        settle = time.monotonic() + _SETTLE_S
        await give_up_newer(self, settle)  # refused until an upgrade: not sent until the bound
        await self._flush(settle)
        leftover = list(self.running.values())
        for r in leftover:
            self._stop(r, "shutdown")
        await self._release(leftover, settle)
        unsent = len(self._completes) + len(self._fails)
        if unsent:
            self.log.error("%d outcomes could not be reported before exit; their jobs run again "
                           "after the lease", unsent)  # fmt: skip
