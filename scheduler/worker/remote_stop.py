"""A stop an operator asked for (`scheduler workers quiet|stop`, the dashboard's buttons; the
request is admin/worker_stop.py's): the presence beat hands it over (lua/worker_beat.lua), in
the call it makes every heartbeat interval anyway, so it costs no round trip of its own.

`stop` is a SIGTERM's stop (request_stop: claiming ends, the running jobs get --grace, then
those still running are released; exit 0). `quiet` claims nothing more and stops once every
job it holds has ended, however long that takes (a `stop` later cuts it short); it stays
listed, heart-beating, meanwhile. Both are logged with the CLI's words."""

from __future__ import annotations

from typing import Any

from scheduler.core.vocabulary import STOP_VERBS
from scheduler.worker.execution import Running
from scheduler.worker.self_stop import SelfStop


def request_of(reply: Any) -> str:
    """The request a worker_beat reply hands over: 'quiet', 'stop' or '' (none)."""
    if not isinstance(reply, list | tuple) or len(reply) < 2:
        return ""
    verb = reply[1].decode() if isinstance(reply[1], bytes) else reply[1]
    return verb if verb in STOP_VERBS else ""


class RemoteStop(SelfStop):
    """The operator's quiet / stop, acted on through the self-stop's and SIGTERM's path."""

    _asked = ""  # the stop under way ('' | 'quiet' | 'stop'), sent back with each beat

    @property
    def operator_stop(self) -> str:
        """'quiet' or 'stop' once an operator asked this worker to stop, else ''."""
        return self._asked

    def _stop_asked(self, replies: list[Any]) -> list[BaseException]:
        """Act on the request of a presence beat's replies (one per queue); the errors among
        them, for the caller to raise."""
        for verb in map(request_of, replies):
            self._act(verb)
        return [r for r in replies if isinstance(r, BaseException)]

    def _act(self, verb: str) -> None:
        """Once per verb; a quiet after a stop is nothing more."""
        if not verb or verb == self._asked or self._asked == "stop":
            return
        self._asked = verb
        if verb == "stop":
            self.log.info("stop requested (scheduler workers stop): stopping (grace %.1fs)",
                          self.settings.grace_s)  # fmt: skip
            self.request_stop()
            return
        self.log.info("quiet requested (scheduler workers quiet): claiming no more jobs; "
                      "stopping once the %d jobs held end", len(self._held))  # fmt: skip
        if not self._held:
            self.request_stop()

    def _quota(self, room: int) -> int:
        """Nothing more is claimed once a stop is asked (a quiet's jobs held run on)."""
        return 0 if self._asked else super()._quota(room)

    def _forget(self, r: Running) -> None:
        super()._forget(r)
        if self._asked == "quiet" and not self._held:
            self.request_stop()
