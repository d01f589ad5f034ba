"""Start-up checks for workers and the CLI: warn about Redis settings that break (or weaken)
"never lost", and refuse to start on the breaking ones when asked to be strict."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

from scheduler.errors import SchedulerError
from scheduler.health import Finding, check_server, read_server, read_server_async


class UnsafeServer(SchedulerError):
    """Strict mode refused to start: the server's settings can lose jobs."""

    def __init__(self, findings: list[Finding]) -> None:
        super().__init__(
            "refusing to start (strict): "
            + "; ".join(f"{f.message} (fix: {f.fix})" for f in findings)
        )
        self.findings = findings


def check_or_warn(client: Any, *, strict: bool, log: Callable[[str], object]) -> list[Finding]:
    """Read the server's settings (sync redis.Redis client) and log one line per finding with
    its fix. With strict=True, raise UnsafeServer when any finding is an 'error'. Returns the
    findings. A user not allowed INFO gets one warning and nothing is refused."""
    try:
        info, config = read_server(client)
    except RedisError as exc:
        return _report([_unreadable(exc)], strict=strict, log=log)
    return _report(check_server(info, config), strict=strict, log=log)


async def check_or_warn_async(
    client: Any, *, strict: bool, log: Callable[[str], object]
) -> list[Finding]:
    """check_or_warn for a redis.asyncio client (the worker's)."""
    try:
        info, config = await read_server_async(client)
    except RedisError as exc:
        return _report([_unreadable(exc)], strict=strict, log=log)
    return _report(check_server(info, config), strict=strict, log=log)


def _unreadable(exc: Exception) -> Finding:
    return Finding("settings-unreadable", "warning",
                   f"cannot read the server's settings ({exc}); durability is unchecked",
                   "grant the user +info")  # fmt: skip


def _report(found: list[Finding], *, strict: bool, log: Callable[[str], object]) -> list[Finding]:
    for f in found:
        log(f"redis {f.severity}: {f.message} [{f.code}]; fix: {f.fix}")
    errors = [f for f in found if f.severity == "error"]
    if strict and errors:
        raise UnsafeServer(errors)
    return found
