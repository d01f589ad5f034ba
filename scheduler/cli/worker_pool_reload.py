"""The rolling reload of a worker pool on SIGHUP (worker_pool.py's supervisor): new processes,
the code on disk now, replace the children one at a time."""

from __future__ import annotations

import logging

from scheduler.cli.worker_pool_child import STOP_SIGNAL
from scheduler.cli.worker_pool_proc import Child, exit_code

log = logging.getLogger("scheduler.worker")


class Reload:
    """The reload's state and step; Pool supplies the children and how one starts."""

    children: list[Child]

    def _start(self, child: Child) -> None:
        raise NotImplementedError

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
        leaves the old ones working, so a bad deploy does not take the pool down."""
        for c in list(self._retiring):
            if not c.running():
                c.close_ready()
                self._retiring.remove(c)
        if self._hups and not stopping:
            self._hups, self._reloads = 0, self._reloads + 1
            self._queue = [c.index for c in self.children]
            log.info("reload: replacing %d worker processes one at a time", len(self.children))
        inc = self._incoming
        if inc is not None:
            inc.read_ready()
            if inc.running() and inc.ready and not stopping:
                old, self.children[inc.index] = self.children[inc.index], inc
                inc.first_start = False  # from now on, an exit is restarted like any other
                old.send(STOP_SIGNAL)
                self._retiring.append(old)
                self._incoming = None
            elif not inc.running():
                assert inc.proc is not None
                newer = self._incoming_of != self._reloads  # a SIGHUP came since: it goes on
                if not stopping:
                    log.error("%sreload ended: the new worker process %d failed to start "
                              "(exit %d); %s", "an earlier " if newer else "", inc.index + 1,
                              exit_code(inc.proc.returncode), "the newer reload goes on"
                              if newer else "the running ones carry on")  # fmt: skip
                inc.close_ready()
                self._incoming = None
                if not newer:
                    self._queue = []
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
