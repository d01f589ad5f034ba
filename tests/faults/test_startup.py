"""Start-up checks on real servers: unsafe settings are logged with their fix, and refused when
strict; a safe server passes silently; a least-privilege user is checked as far as it can see."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis
import redis.asyncio as aredis

from scheduler.admin.startup import UnsafeServer, check_or_warn, check_or_warn_async
from tests.faults.conftest import DURABLE, Server


def codes(client: redis.Redis, strict: bool = False) -> tuple[set[str], list[str]]:
    lines: list[str] = []
    found = check_or_warn(client, strict=strict, log=lines.append)
    return {f.code for f in found}, lines


def test_safe_server_passes_silently(start_server: Callable[..., Server]) -> None:
    server = start_server(*DURABLE, "--maxmemory-policy", "noeviction")
    assert codes(server.admin(), strict=True) == (set(), [])

    async def run() -> list[str]:
        lines: list[str] = []
        client = aredis.Redis.from_url(server.url, decode_responses=True)
        await check_or_warn_async(client, strict=True, log=lines.append)
        await client.aclose()
        return lines

    assert asyncio.run(run()) == []


def test_persistence_off_warns_or_refuses(start_server: Callable[..., Server]) -> None:
    server = start_server()  # --save '' --appendonly no
    found, lines = codes(server.admin())
    assert found == {"persistence-off"}
    assert "CONFIG SET appendonly yes" in lines[0]
    with pytest.raises(UnsafeServer) as refused:
        check_or_warn(server.admin(), strict=True, log=lambda _: None)
    assert [f.code for f in refused.value.findings] == ["persistence-off"]


def test_eviction_policy_and_relaxed_fsync(start_server: Callable[..., Server]) -> None:
    server = start_server("--appendonly", "yes", "--maxmemory-policy", "allkeys-lru")
    found, _ = codes(server.admin())
    assert found == {"eviction-policy", "fsync-relaxed"}
    with pytest.raises(UnsafeServer):
        check_or_warn(server.admin(), strict=True, log=lambda _: None)
    server.admin().config_set("maxmemory-policy", "noeviction")
    found, _ = codes(server.admin(), strict=True)  # a warning alone never refuses
    assert found == {"fsync-relaxed"}


def test_least_privilege_user_is_checked_as_far_as_it_can_see(
    start_server: Callable[..., Server],
) -> None:
    server = start_server("--maxmemory-policy", "volatile-lru")
    admin = server.admin()
    admin.acl_setuser("infoonly", enabled=True, passwords=["+pw"], keys=["sched:*"],
                      commands=["-@all", "+info", "+ping", "+hello", "+auth"])  # fmt: skip
    admin.acl_setuser("nothing", enabled=True, passwords=["+pw"], commands=["-@all", "+hello"])
    infoonly = redis.Redis.from_url(f"unix://infoonly:pw@{server.socket}", decode_responses=True)
    found, _ = codes(infoonly)
    # The eviction policy is visible through INFO; RDB snapshots are not (no CONFIG).
    assert found == {"eviction-policy", "persistence-unknown"}
    nothing = redis.Redis.from_url(f"unix://nothing:pw@{server.socket}", decode_responses=True)
    assert codes(nothing, strict=True)[0] == {"settings-unreadable"}
