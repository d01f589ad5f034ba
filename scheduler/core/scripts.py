"""Find the Lua files, expand `-- @include "lib/x.lua"` lines, and the one driver that runs the
requests of sans-I/O operations (scheduler.operations.ops) on a connection.

The driver is written once, as a generator (`Scripts.drive`): it turns requests into wire
commands, sends them as one pipeline, handles NOSCRIPT (after SCRIPT FLUSH or a restart) by
loading the missing scripts and re-sending only the calls that did not run, and hands back
each request's reply or its (translated) error. `run_sync` / `run_async` are the only I/O."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from redis.exceptions import NoPermissionError, NoScriptError, ResponseError

from scheduler.core import cluster_io, direct_io
from scheduler.core.connection import is_cluster
from scheduler.core.lua_prune import prune
from scheduler.core.script_errors import translate
from scheduler.operations.ops import Commands, Request, Script, ScriptPipeline

TRANSITIONS = (
    "enqueue",
    "claim",
    "heartbeat",
    "progress",  # a handler's ctx.set_progress, sent with the heartbeat (lua/progress.lua)
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
    "schedule_run",  # run a schedule once now, beside its slots
    "worker_beat",
    "repair",  # doctor --fix's entry to lib/job.lua's moves (lua/repair.lua)
    "dead_migrate",  # one bounded step of converting an old dead LIST (lib/job.lua)
    "dead_retention",  # the opt-in dead-letter retention settings
    "dead_match",  # the dead-letter task / error-type filter, a page per call (read only)
    "queue_pause",
    "queue_resume",
    "reschedule",
    "move_out",  # scheduler queue move: waiting jobs into the source's `moving` set
    "move_in",  # ... written into the destination, same ids
    "move_done",  # ... deleted from the source
    "durable_mark",  # a write for WAIT after an enqueue that wrote nothing (wait_replicas)
)
_INCLUDE = re.compile(r'^-- @include "([^"]+)"\s*$', re.MULTILINE)


def lua_dir() -> Path:
    """The installed package's `scheduler/lua`, else the repository's top-level `lua/`
    (an editable install has no copy inside the package)."""
    packaged = Path(str(resources.files("scheduler"))) / "lua"
    if (packaged / "claim.lua").is_file():
        return packaged
    repo = Path(__file__).resolve().parents[2] / "lua"
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
    """The expanded text of one transition, as sent to Redis: its libs' unused top-level
    locals left out (scheduler.core.lua_prune)."""
    return prune(_expand(lua_dir(), f"{name}.lua", set(), (f"{name}.lua",), clock))


Wire = tuple[Any, ...]  # one command as sent: ("EVALSHA", sha, nkeys, *keys, *args)
# NOSCRIPT (a restart, a failover, SCRIPT FLUSH): the calls that got it are sent again after a
# SCRIPT LOAD, then, if a flush raced that load too, as EVAL with the script's text, which
# cannot answer NOSCRIPT. Retrying loads alone was a race a busy flusher could win every time:
# a flush every 3 ms beat 12 load-then-send round trips in a row under CI load
# (tests/faults/test_durability.py).
_NOSCRIPT_RETRIES = 2  # a load and resend, then EVAL


@dataclass(frozen=True)
class Batch:
    """What the driver asks the I/O to do: SCRIPT LOAD `loads` (one call each), then send
    `cmds` as one pipeline and answer with their replies, errors as values. `routes[i]` is the
    key whose cluster slot `cmds[i]` belongs to (its request's first script KEY; "" when it
    has none): on a Redis Cluster the I/O sends each command to the primary of that slot, in
    order, so a WAIT follows its writes on the node that took them (core/cluster_io.py)."""

    loads: list[str]
    cmds: list[Wire]
    routes: list[str] = field(default_factory=list, compare=False)


Drive = Generator[Batch, list[Any], list[Any]]


class Scripts:
    """The transitions' texts and SHA1s for one clock, and the driver built on them."""

    def __init__(self, client: Any = None, *, clock: str = "server") -> None:
        # `client` is accepted for compatibility; the driver holds no connection.
        if clock not in ("server", "test"):
            raise ValueError(f"unknown clock {clock!r}")
        self.clock = clock
        self._text: dict[str, str] = {}
        self.sha: dict[str, str] = {}
        for name in TRANSITIONS:
            text = source(name, clock)
            sha = hashlib.sha1(text.encode()).hexdigest()
            self.sha[name] = sha
            self._text[sha] = text

    def preload_commands(self) -> list[tuple[str, str]]:
        """(name, text) of every script, for SCRIPT LOAD at start-up: on a real server this
        compiles them, so a broken script fails at start and not at the first claim."""
        return [(name, source(name, self.clock)) for name in TRANSITIONS]

    def evalsha(self, keys: Sequence[str], call: Script) -> Wire:
        # Every argument a str: hiredis.pack_command turns an int into text with a call that
        # runs pending signal handlers, and one that raises (Ctrl-C, a SIGTERM handler's
        # sys.exit) crashed the interpreter there (SIGSEGV, hiredis 3.5; direct_io._pack).
        return ("EVALSHA", self.sha[call.name], str(len(keys)), *keys, *call.args)

    def drive(self, items: Sequence[tuple[Sequence[str], Request]]) -> Drive:
        """items: (script KEYS, request). Returns, per request, its reply or the error its
        reply carried (a script's `CODE detail` translated by core/script_errors.py translate).
        Connection errors are the I/O's: they propagate from run_sync / run_async."""
        cmds: list[Wire] = []
        routes: list[str] = []
        spans: list[tuple[int, int, bool, Sequence[str]]] = []  # (first, end, is a list, KEYS)
        for keys, req in items:
            first = len(cmds)
            if isinstance(req, Script):
                cmds.append(self.evalsha(keys, req))
            elif isinstance(req, ScriptPipeline):
                cmds.extend(self.evalsha(keys, c) for c in req.calls)
                if req.wait is not None:
                    cmds.append(("WAIT", *req.wait))
            elif isinstance(req, Commands):
                cmds.extend(req.cmds)
            else:
                raise TypeError(f"not a request: {req!r}")
            routes.extend([keys[0] if keys else ""] * (len(cmds) - len(routes)))
            spans.append((first, len(cmds), not isinstance(req, Script), keys))
        replies = yield Batch([], cmds, routes)
        for attempt in range(_NOSCRIPT_RETRIES):
            missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
            if not missing:
                break
            # Those calls did not run, so sending them again is safe. A WAIT must follow the
            # writes it waits for: send it again after them.
            missing += [i for i, c in enumerate(cmds) if c[0] == "WAIT" and i > missing[0]]
            resend = [cmds[i] for i in missing]
            if attempt == 0:
                shas = dict.fromkeys(str(c[1]) for c in resend if c[0] == "EVALSHA")
                loads = [self._text[s] for s in shas]
            else:  # a flush raced the load too: the text itself (it also caches the script)
                loads = []
                resend = [
                    ("EVAL", self._text[str(c[1])], *c[2:]) if c[0] == "EVALSHA" else c
                    for c in resend
                ]
            again = yield Batch(loads, resend, [routes[i] for i in missing])
            for i, r in zip(missing, again, strict=True):
                if attempt and _eval_refused(r):
                    continue  # the ACL roles have no EVAL: not run, its NOSCRIPT stays the reply
                replies[i] = r
        out: list[Any] = []
        for first, end, is_list, keys in spans:
            part = replies[first:end]
            err = next((r for r in part if isinstance(r, BaseException)), None)
            if err is not None:
                err = translate(err, keys) if isinstance(err, ResponseError) else err
                if is_list:  # the other calls' replies: what a pipeline's refusal left written
                    setattr(err, "pipeline_replies", part)  # noqa: B010 - any exception
                out.append(err)
            else:
                out.append(part if is_list else part[0])
        return out


def _eval_refused(reply: Any) -> bool:
    """EVAL itself refused by the user's ACL (docs/security.md's roles have EVALSHA only), not
    a command inside the script: the worker retries a NOSCRIPT, it stops on a NOPERM."""
    return isinstance(reply, NoPermissionError) and "'eval'" in str(reply)


def run_sync(client: Any, drive: Drive) -> list[Any]:
    """Drive on a blocking redis-py client (a RedisCluster: per-node pipelines, cluster_io)."""
    if is_cluster(client):
        return cluster_io.run_sync(client, drive)
    try:
        batch = next(drive)
        while True:
            for text in batch.loads:
                client.script_load(text)
            if len(batch.cmds) == 1:  # no pipeline object for the common single call
                try:
                    replies = [direct_io.call_sync(client, batch.cmds[0])]
                except ResponseError as exc:
                    replies = [exc]
            else:
                replies = direct_io.pipeline_sync(client, batch.cmds)
            batch = drive.send(replies)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def run_one_sync(client: Any, scripts: Scripts, keys: Sequence[str], req: Request) -> Any:
    """One request's reply on a blocking client; an error reply is raised, translated. A single
    script call on a non-cluster client is sent straight, without the driver's batch
    bookkeeping (issue 16; `python bench/single_call_ab.py`); a NOSCRIPT reply (the call did
    not run) and every other request go through `drive`, which loads and sends again."""
    if type(req) is Script and not is_cluster(client):
        try:
            return direct_io.call_sync(client, scripts.evalsha(keys, req))
        except NoScriptError:
            pass
        except ResponseError as exc:
            raise translate(exc, keys) from None
    (reply,) = run_sync(client, scripts.drive([(keys, req)]))
    if isinstance(reply, BaseException):
        raise reply
    return reply


async def run_one_async(client: Any, scripts: Scripts, keys: Sequence[str], req: Request) -> Any:
    """The asyncio twin of run_one_sync."""
    if type(req) is Script and not is_cluster(client):
        try:
            return await direct_io.call_async(client, scripts.evalsha(keys, req))
        except NoScriptError:
            pass
        except ResponseError as exc:
            raise translate(exc, keys) from None
    (reply,) = await run_async(client, scripts.drive([(keys, req)]))
    if isinstance(reply, BaseException):
        raise reply
    return reply


async def run_async(client: Any, drive: Drive) -> list[Any]:
    """Drive on a redis.asyncio client (direct_io.pipeline_async for several commands)."""
    if is_cluster(client):
        return await cluster_io.run_async(client, drive)
    try:
        batch = next(drive)
        while True:
            for text in batch.loads:
                await client.script_load(text)
            if len(batch.cmds) == 1:
                try:
                    replies = [await direct_io.call_async(client, batch.cmds[0])]
                except ResponseError as exc:
                    replies = [exc]
            else:
                replies = await direct_io.pipeline_async(client, batch.cmds)
            batch = drive.send(replies)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
