"""Pausing a whole queue: its claims lease nothing until it is resumed (lua/queue_pause.lua,
lua/queue_resume.lua); enqueues are still accepted and leases already held run on."""

from __future__ import annotations

from scheduler.core import codec
from scheduler.operations.queue_config import ConfigOps
from scheduler.operations.requests import Op, Script


class PausingOps(ConfigOps):
    def pause(self) -> Op[str]:
        """'paused' | 'already' (it was: nothing written)."""
        return codec.s((yield Script("queue_pause", [])))

    def resume(self) -> Op[str]:
        """'resumed' (idle workers are woken) | 'active' (was not paused: nothing written)."""
        return codec.s((yield Script("queue_resume", [])))

    def check_pause(self) -> Op[None]:
        """pause's and resume's refusals alone, as plain commands (the scripts': a partitioned
        queue's own name, a newer version's storage, a config of another type), nothing
        written: asked of every partition of a partitioned queue before any is changed, so one
        refusing refuses the whole change (else the others are paused and the error, that
        partition's, says 'nothing written')."""
        yield from self._config_refusals()
