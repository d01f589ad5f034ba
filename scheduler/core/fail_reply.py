"""fail's arguments and reply (lua/fail.lua): the handler's error made UTF-8-safe and bounded,
a URL password it quotes hidden (stored, it is shown by `jobs show`, `dead list` and the
dashboard to whoever reads the queue), and the retry-or-dead outcome read back. Re-exported
by codec.py for callers."""

from __future__ import annotations

import random
from typing import Any

from scheduler.core.errors import BadArgument, SchedulerError, raise_for_status
from scheduler.core.limits import check_int, check_lease, s, stored_int_in
from scheduler.core.models import FailOutcome
from scheduler.core.safety import redact

_MAX_MESSAGE = 2_000
_MAX_TRACEBACK = 8_000


def _utf8(text: str) -> str:
    """Text a handler produced (error messages), made UTF-8-safe instead of refused."""
    return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")


def fail_args(
    job_id: str,
    token: str,
    error: BaseException | tuple[str, str, str],
    *,
    retryable: bool,
    delay_ms: int | None,
) -> list[str]:
    check_lease(job_id, token)
    if not isinstance(retryable, bool):  # None or 0 would park it, "no" retry it
        raise BadArgument(f"retryable must be a bool, got {retryable!r:.40}")
    if isinstance(error, BaseException):
        import traceback

        etype = type(error).__name__
        # The exception's own methods may raise: the job still gets its outcome.
        try:
            message = str(error)
        except Exception as bad:
            message = f"<{etype} message could not be read: {type(bad).__name__}>"
        try:
            tb = "".join(traceback.format_exception(error))
        except Exception:
            tb = ""
    elif (
        isinstance(error, tuple | list)
        and len(error) == 3
        and all(isinstance(x, str) for x in error)
    ):
        etype, message, tb = error
    else:
        raise BadArgument(
            f"error must be an exception or a (type, message, traceback) tuple of str, "
            f"got {error!r:.200}"
        )
    delay = "" if delay_ms is None else str(check_int(delay_ms, "delay_ms"))
    return [
        job_id,
        token,
        "1" if retryable else "0",
        _utf8(etype[:200]),
        _utf8(redact(message[: 4 * _MAX_MESSAGE])[:_MAX_MESSAGE]),
        _utf8(redact(tb[-4 * _MAX_TRACEBACK :])[-_MAX_TRACEBACK:]),
        repr(random.random()),
        delay,
    ]


def parse_fail(reply: Any, job_id: str, token: str) -> FailOutcome:
    status, detail = s(reply[0]), s(reply[1])
    raise_for_status(status, job_id, token)
    if status == "retry":
        run_at_ms = stored_int_in(detail, "run_at_ms")
        if run_at_ms is None:
            raise SchedulerError(f"fail answered an unreadable run_at_ms {detail!r}")
        return FailOutcome("retry", run_at_ms=run_at_ms)
    return FailOutcome("dead", dead_reason=detail)
