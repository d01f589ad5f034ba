"""A running job's progress (ctx.set_progress): any JSON value up to MAX_PROGRESS_BYTES, written
to the job's hash by the worker's next heartbeat round trip (lua/progress.lua)."""

from __future__ import annotations

from typing import Any

from scheduler.core.codec import encode_json
from scheduler.core.limits import MAX_PROGRESS_BYTES


class ProgressText(str):
    """JSON text encode_progress checked already (the heartbeat sends it as it is)."""


def encode_progress(value: Any) -> ProgressText:
    """`value` as JSON text, else InvalidPayload (not JSON-serialisable, or over the limit)."""
    return ProgressText(encode_json(value, "progress", MAX_PROGRESS_BYTES))
