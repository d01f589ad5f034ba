"""Pausing a whole queue: its claims lease nothing until it is resumed (lua/queue_pause.lua,
lua/queue_resume.lua); enqueues are still accepted and leases already held run on."""

from __future__ import annotations

from scheduler.core import codec
from scheduler.operations.requests import Op, OpsBase, Script


class PausingOps(OpsBase):
    def pause(self) -> Op[str]:
        """'paused' | 'already' (it was: nothing written)."""
        return codec.s((yield Script("queue_pause", [])))

    def resume(self) -> Op[str]:
        """'resumed' (idle workers are woken) | 'active' (was not paused: nothing written)."""
        return codec.s((yield Script("queue_resume", [])))
