"""Find the Lua files, expand `-- @include "lib/x.lua"` lines, and register one redis-py Script
per transition. redis-py's Script does EVALSHA and reloads by itself after SCRIPT FLUSH or a
restart (NOSCRIPT), in plain calls and in pipelines."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

TRANSITIONS = (
    "enqueue",
    "claim",
    "heartbeat",
    "complete",
    "fail",
    "release",
    "cancel",
    "requeue_dead",
    "purge_dead",
    "counts",
    "schedule_upsert",
    "schedule_pause",
    "schedule_resume",
    "schedule_remove",
    "schedule_refill",
    "worker_beat",
)
_INCLUDE = re.compile(r'^-- @include "([^"]+)"\s*$', re.MULTILINE)


def lua_dir() -> Path:
    """The installed package's `scheduler/lua`, else the repository's top-level `lua/`
    (an editable install has no copy inside the package)."""
    packaged = Path(str(resources.files("scheduler"))) / "lua"
    if (packaged / "claim.lua").is_file():
        return packaged
    repo = Path(__file__).resolve().parent.parent / "lua"
    if (repo / "claim.lua").is_file():
        return repo
    raise FileNotFoundError("the Lua scripts are missing (neither packaged nor in ./lua)")


def _expand(root: Path, name: str, seen: set[str], chain: tuple[str, ...], clock: str) -> str:
    text = (root / name).read_text()

    def include(m: re.Match[str]) -> str:
        lib = m.group(1)
        if lib == "lib/clock.lua" and clock == "test":
            lib = "lib/clock_test.lua"
        if lib in chain:
            raise ValueError("include cycle: " + " -> ".join((*chain, lib)))
        if lib in seen:
            return f"-- (already included {lib})"
        seen.add(lib)
        body = _expand(root, lib, seen, (*chain, lib), clock)
        return f"-- begin {lib}\n{body}\n-- end {lib}"

    return _INCLUDE.sub(include, text)


@cache
def source(name: str, clock: str = "server") -> str:
    """The expanded text of one transition, as sent to Redis."""
    return _expand(lua_dir(), f"{name}.lua", set(), (f"{name}.lua",), clock)


class Scripts:
    """One registered Script per transition, bound to one client (sync or asyncio)."""

    def __init__(self, client: Any, *, clock: str = "server") -> None:
        if clock not in ("server", "test"):
            raise ValueError(f"unknown clock {clock!r}")
        self.client = client
        self.clock = clock
        self._by_name: dict[str, Any] = {
            name: client.register_script(source(name, clock)) for name in TRANSITIONS
        }

    def __getitem__(self, name: str) -> Any:
        return self._by_name[name]

    def preload_commands(self) -> list[tuple[str, str]]:
        """(name, text) of every script, for SCRIPT LOAD at start-up: on a real server this
        compiles them, so a broken script fails at start and not at the first claim."""
        return [(name, source(name, self.clock)) for name in TRANSITIONS]
