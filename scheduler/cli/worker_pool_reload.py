"""The rolling reload of a worker pool on SIGHUP (worker_pool.py's supervisor): new processes,
the code on disk now, replace the children one at a time."""

from __future__ import annotations

import logging
import signal

from scheduler.cli.worker_pool_child import RETIRED_BY, STOP_SIGNAL
from scheduler.cli.worker_pool_proc import Child, exit_code, killed_by
from scheduler.core.exits import EXIT_FAILED

log = logging.getLogger("scheduler.worker")


class Reload:
    """The reload's state and step; Pool supplies the children and how one starts."""

    children: list[Child]
    _stop_exits: list[int]  # the children's codes once the pool's stop began (worker_pool.py)

    def _start(self, child: Child) -> None:
        raise NotImplementedError

    def _retire(self, child: Child, pid: int, verb: str) -> None:
        raise NotImplementedError

    def _swapped(self, index: int) -> None:
        """Slot index has a new process (its metrics start again)."""

    def _discard(self, child: Child) -> None:
        """A reload's process ended: its last counts, carried by no slot, are dropped."""

    def _init_reload(self) -> None:
        self._hups = 0  # SIGHUP received: replace the children one at a time
        self._queue: list[int] = []  # the reload's children still to replace
        self._incoming: Child | None = None  # the reload's new child, until it is ready
        self._reloads = 0  # reloads begun; _incoming_of: the one the new child belongs to
        self._incoming_of = 0
        self._retiring: list[Child] = []  # replaced children finishing their jobs

    def _reload(self, stopping: bool) -> None:
        """A rolling replacement, one child at a time: a new process (the code on disk now)
        starts beside the old one; once it is ready the old one is asked to stop (it finishes
        its running jobs within --grace). A new one that fails to start ends the reload and
        leaves the old ones working, so a bad deploy does not take the pool down.

        An operator's stop (`scheduler workers stop|quiet`) wins over the reload: a retired
        slot gets no new process (it is left out of the queue, and the new one of a slot
        retired while it started is stopped, never swapped in), and a new process that is
        itself stopped by an operator before it is swapped in (it runs under the slot's worker
        id) retires its slot: the old one is stopped too. The reload goes on with the next
        slot. An old one already replaced (stopping) that exits for an operator's stop retires
        nothing: its slot has its new process."""
        for c in list(self._retiring):
            if not c.running():
                c.close_ready()
                self._retiring.remove(c)
                self._ended_aside(c, "replaced", stopping)
        if self._hups and not stopping:
            self._hups, self._reloads = 0, self._reloads + 1
            self._queue = [c.index for c in self.children if not c.retired]
            log.info("reload: replacing %d worker processes one at a time", len(self._queue))
        if self._incoming is not None and not self._incoming_step(self._incoming, stopping):
            return
        while self._queue and not stopping:
            i = self._queue.pop(0)
            if self.children[i].running():  # one waiting for its restart gets the new code
                self._incoming, self._incoming_of = Child(i, first_start=False), self._reloads
                try:
                    self._start(self._incoming)
                except OSError as exc:
                    log.error("reload ended: worker process %d could not start: %s", i + 1, exc)
                    self._incoming, self._queue = None, []
                return

    def _incoming_step(self, inc: Child, stopping: bool) -> bool:
        """Swap the new process in once it is ready, or see it fail; True once it is done
        with (the reload may start the next slot's)."""
        inc.read_ready()
        if self.children[inc.index].retired:  # stopped by an operator meanwhile
            inc.send(STOP_SIGNAL)
            self._retiring.append(inc)
            self._incoming = None
            return True
        if inc.running():
            if not inc.ready or stopping:
                return False
            old, self.children[inc.index] = self.children[inc.index], inc
            self._swapped(inc.index)
            inc.first_start = False  # from now on, an exit is restarted like any other
            old.send(STOP_SIGNAL)
            self._retiring.append(old)
            self._incoming = None
            return False  # the next slot's once the loop comes round again, as before
        assert inc.proc is not None
        inc.close_ready()
        self._incoming = None
        self._ended_aside(inc, "new", stopping)
        verb = RETIRED_BY.get(exit_code(inc.proc.returncode), "")
        if verb and not stopping:  # the slot's operator stop, read by the new process
            old, self.children[inc.index] = self.children[inc.index], Child(inc.index)
            old.send(STOP_SIGNAL)
            if old.proc is not None:
                self._retiring.append(old)
            self._retire(self.children[inc.index], inc.proc.pid, verb)
            return True
        newer = self._incoming_of != self._reloads  # a SIGHUP came since: it goes on
        if not stopping:
            log.error("%sreload ended: the new worker process %d failed to start (exit %d); "
                      "%s", "an earlier " if newer else "", inc.index + 1,
                      exit_code(inc.proc.returncode), "the newer reload goes on"
                      if newer else "the running ones carry on")  # fmt: skip
        if not newer:
            self._queue = []
        return False

    def _ended_aside(self, c: Child, what: str, stopping: bool) -> None:
        """A process of a reload, not a slot's own (one replaced, finishing its jobs, or a new
        one not swapped in), ended: killed (a signal: the OOM killer's SIGKILL, or at the stop
        deadline) it is logged, and during the pool's stop makes it exit 1, as _reap does for
        a slot's child (docs/guide/workers.md); before, the pool exited 0 and said nothing."""
        assert c.proc is not None
        self._discard(c)
        rc = c.proc.returncode
        stopped = rc in (-STOP_SIGNAL, -signal.SIGTERM)  # asked to stop before it handled it
        by = "the stop deadline" if c.killed_at_deadline else None if stopped else killed_by(rc)
        if by is None:
            return
        log.error("%s worker process %d (pid %d) was killed by %s: its jobs run again once "
                  "their leases lapse", what, c.index + 1, c.proc.pid, by)  # fmt: skip
        if stopping:
            self._stop_exits.append(EXIT_FAILED)
