"""Start-up checks for workers and the CLI: warn about Redis settings that break (or weaken)
"never lost", and refuse to start on the breaking ones when asked to be strict."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

from scheduler.errors import SchedulerError
from scheduler.health import Finding, check_server, read_server


class UnsafeServer(SchedulerError):
    """Strict mode refused to start: the server's settings can lose jobs."""

    def __init__(self, findings: list[Finding]) -> None:
        super().__init__(
            "refusing to start (strict): "
            + "; ".join(f"{f.message} (fix: {f.fix})" for f in findings)
        )
        self.findings = findings


def findings_for(info: dict[str, Any], config: dict[str, str]) -> list[Finding]:
    """check_server, made honest about what a user without CONFIG can see: with no CONFIG
    values and AOF off, RDB snapshots may still be on, so 'persistence-off' is not proven."""
    found = check_server(info, config)
    if config:
        return found
    out = []
    for f in found:
        if f.code == "persistence-off":
            f = Finding(
                "persistence-unknown", "warning",
                "AOF is off and CONFIG is not allowed to this user, so RDB snapshots cannot be "
                "checked: a restart may lose every job",
                "redis-cli CONFIG SET appendonly yes (as an admin)",
            )  # fmt: skip
        out.append(f)
    return out


def check_or_warn(client: Any, *, strict: bool, log: Callable[[str], object]) -> list[Finding]:
    """Read the server's settings (sync redis.Redis client) and log one line per finding with
    its fix. With strict=True, raise UnsafeServer when any finding is an 'error'. Returns the
    findings. A user not allowed INFO gets one warning and nothing is refused."""
    try:
        info, config = read_server(client)
    except RedisError as exc:
        return _report([_unreadable(exc)], strict=strict, log=log)
    return _report(findings_for(info, config), strict=strict, log=log)


async def check_or_warn_async(
    client: Any, *, strict: bool, log: Callable[[str], object]
) -> list[Finding]:
    """check_or_warn for a redis.asyncio client (the worker's)."""
    try:
        info: dict[str, Any] = {}
        for section in _INFO_SECTIONS:
            info.update(await client.info(section))
    except RedisError as exc:
        return _report([_unreadable(exc)], strict=strict, log=log)
    config: dict[str, str] = {}
    try:
        for name in _CONFIG_NAMES:
            config.update({k: str(v) for k, v in (await client.config_get(name)).items()})
    except RedisError:  # NOPERM for least-privilege users: INFO alone is checked
        config = {}
    return _report(findings_for(info, config), strict=strict, log=log)


_INFO_SECTIONS = ("server", "persistence", "memory")
_CONFIG_NAMES = ("maxmemory-policy", "appendfsync", "save")


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
