"""Start-up checks for workers and the CLI: warn about Redis settings that break (or weaken)
"never lost", and refuse to start on the breaking ones when asked to be strict."""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio.sentinel import MasterNotFoundError as AsyncMasterNotFoundError
from redis.exceptions import AuthenticationError, MovedError, RedisError, ResponseError
from redis.sentinel import MasterNotFoundError

from scheduler.admin.health import (
    Finding,
    at_node,
    check_server,
    read_server,
    read_server_async,
    server_nodes,
)
from scheduler.admin.redis_cli import connection_flags, fix_line
from scheduler.core.connection import UNREACHABLE, is_cluster, key_nodes
from scheduler.core.errors import BadArgument, SchedulerError, edited_by_hand, newer_storage
from scheduler.core.errors import is_permission_error as is_permission_error  # the CLI's
from scheduler.core.keys import STORAGE_GENERATION, QueueKeys
from scheduler.core.safety import redact, safe

APP_ROLE_HINT = "connect as a user with the app role of docs/security.md"
OPERATOR_ROLE_HINT = "connect as a user with the operator role of docs/security.md"
CREDENTIALS_HINT = "check the URL's user and password (redis://user:password@host/)"
# A key refused to a user that may run the command: its key patterns, not its role, leave the
# queue out (a per-tenant user pointed at another tenant's queue).
KEYS_HINT = "give the Redis user a key pattern that covers them (docs/security.md)"
_NO_MASTER = (MasterNotFoundError, AsyncMasterNotFoundError)
_NOPERM_COMMAND = re.compile(r"permissions? to run the '([^']+)' command")


def credentials_hint(exc: BaseException) -> str:
    """What to check after a refused login: the URL's user and password, unless the error names
    what itself (a sentinel's refusal: core/sentinel.py SentinelRefused.hint)."""
    hint = getattr(exc, "hint", None)
    return hint if isinstance(hint, str) else CREDENTIALS_HINT


def permission_message(
    exc: BaseException, hint: str, where: str = "", key_hint: str | None = None
) -> str:
    """One line naming what the ACL refused (the command, or a key, of `where`: the queues
    given) and the role to use (`hint`; a key's refusal: `key_hint` when given)."""
    m = _NOPERM_COMMAND.search(str(exc))
    if m is not None:  # the refused command says it all
        command = m.group(1).upper().replace("|", " ")
        return safe(f"permission denied: the Redis user may not run {command}; {hint}")
    text = str(exc)
    keys = "key" in text
    what = "the keys" if keys else "a command" + (" in a script" if "script" in text else "")
    what += f" of {where}" if where else ""
    hint = key_hint if keys and key_hint else hint
    return safe(f"permission denied: the Redis user may not use {what} ({exc}); {hint}")


def queues_where(names: Sequence[str]) -> str:
    """permission_message's `where` for the queues a command or a page was given (the first
    three), each with its key pattern: the one clue to a key pattern that leaves it out."""
    named = []
    for name in names[:3]:
        try:
            named.append(f"queue {name!r} ({QueueKeys(name).pattern()})")
        except BadArgument:  # not a queue name: nothing of it was read
            continue
    return ", ".join(named) + (", ..." if len(names) > 3 and named else "")


def refusal_line(exc: BaseException, hint: str, where: str = "") -> str:
    """The one line of a refused permission (the command, or the keys of `where`, and `hint`:
    the role to use; a key's refusal: KEYS_HINT) or of a refused login (what to check)."""
    if is_permission_error(exc):
        return permission_message(exc, hint, where, KEYS_HINT)
    return safe(f"Redis refused the credentials: {exc}; {credentials_hint(exc)}")


def certificate_refused(exc: BaseException) -> bool:
    """A TLS handshake that refused the server's certificate (another CA, a host name it does
    not name, expired): every try fails alike until the URL or the certificate changes. Not a
    Sentinel lookup's (MasterNotFoundError): one sentinel that did not answer may yet."""
    seen: BaseException | None = exc
    for _ in range(8):  # redis-py's ConnectionError (a cluster's) around it
        if seen is None or isinstance(seen, _NO_MASTER):
            return False
        if isinstance(seen, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(
            seen
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def url_refusal(exc: BaseException, url: str | None) -> str | None:
    """The line of a refusal only another URL mends (exit 2: no restart, no doctor helps), or
    None: a certificate refused, a database the server does not have, or a plain URL of a
    Redis Cluster node whose queue another node serves (MOVED)."""
    at = redact(url) if url else "the server"
    if certificate_refused(exc):
        why = "check the URL's ssl_ca_certs and host name (docs/security.md, TLS)"
        return safe(
            f"the server's TLS certificate at {at} was refused: {str(exc).rstrip('.')}; {why}"
        )
    if isinstance(exc, MovedError):
        cluster = "redis+cluster://host:port,host:port/ or ?cluster=1 (docs/cluster.md)"
        return safe(f"{at} is a node of a Redis Cluster, the queue's slot is served by "
                    f"{exc.host}:{exc.port} (MOVED): give a cluster URL, {cluster}")  # fmt: skip
    if isinstance(exc, ResponseError) and str(exc).startswith("DB index"):
        why = "the URL's database (/N or ?db=N) must be below the server's `databases` setting"
        return safe(f"Redis at {at} refused the database: {exc}; {why}")
    return None


class AccessDenied(SchedulerError):
    """The Redis user may not do what the worker needs on one of its queues."""


async def check_access_async(
    client: Any, queues: Sequence[str], *, skip_down: bool = False
) -> None:
    """Touch each queue's keys as a worker will, before it runs: a read, and a write that
    changes nothing (no job id is empty). A user whose ACL leaves a queue out is refused here
    with one line instead of a crash in the claim loop. Raises AccessDenied. With `skip_down`,
    on a cluster, a queue whose node does not answer is skipped; every queue unreachable
    raises."""
    down = 0
    for name in queues:
        k = QueueKeys(name)
        try:
            await client.exists(k.due, k.leased, k.dead, k.wake)
            # Before the write: a newer layout's `due` may be of another type (WRONGTYPE).
            await _refuse_newer_storage(client, name, k)
            await client.zrem(k.due, "")
        except UNREACHABLE as exc:
            # A refused password is no node down (it is a ConnectionError in redis-py).
            if not skip_down or not is_cluster(client) or isinstance(exc, AuthenticationError):
                raise
            down += 1
            if down == len(queues):
                raise
            continue
        except RedisError as exc:
            if is_permission_error(exc):
                raise AccessDenied(
                    permission_message(exc, APP_ROLE_HINT, where=f"queue {name!r} ({k.pattern()})")
                ) from None
            raise


async def _refuse_newer_storage(client: Any, name: str, k: QueueKeys) -> None:
    """NewerStorage when a newer version stores the queue (its claims would all be refused:
    restarting cannot help, an upgrade can)."""
    try:
        generation = await client.hget(k.config, "generation")
    except ResponseError as exc:
        if edited_by_hand(exc):  # a config of another type holds no generation (doctor names it)
            return
        raise
    refused = newer_storage(name, generation, STORAGE_GENERATION)
    if refused is not None:
        raise refused


class UnsafeServer(SchedulerError):
    """Strict mode refused to start: the server's settings can lose jobs."""

    def __init__(self, findings: list[Finding], flags: Sequence[str] = ()) -> None:
        # Each fix made to reach the checked server, as the warnings' (a bare `redis-cli`
        # would reconfigure whatever answers on localhost:6379).
        fixes = [fix_line(f.fix, list(flags), f.node) for f in findings]
        super().__init__(
            "refusing to start (strict): "
            + "; ".join(f"{f.message} (fix: {fix})" for f, fix in zip(findings, fixes, strict=True))
        )
        self.findings = findings


def check_or_warn(
    client: Any, *, strict: bool, log: Callable[[str], object], url: str | None = None
) -> list[Finding]:
    """Read the server's settings (sync redis.Redis client) and log one line per finding with
    its fix (its `redis-cli` given the flags that reach `url`'s server: admin/redis_cli.py).
    With strict=True, raise UnsafeServer when any finding is an 'error'. Returns the
    findings. A user not allowed INFO gets one warning and nothing is refused. On a Redis
    Cluster every primary is read, and a finding names its node."""
    found: list[Finding] = []
    for node in server_nodes(client):
        try:
            found += at_node(node, check_server(*read_server(client, node)))
        except RedisError as exc:
            found += at_node(node, [_unreadable(exc)])
    return _report(found, strict=strict, log=log, flags=_flags(url, client))


async def check_or_warn_async(
    client: Any,
    *,
    strict: bool,
    log: Callable[[str], object],
    keys: Sequence[str] = (),
    url: str | None = None,
) -> list[Finding]:
    """check_or_warn for a redis.asyncio client (the worker's). With `keys` (a worker's
    queues), a cluster's primaries holding them only: the others' durability is not the
    worker's, and one of them being down must not slow its start."""
    found: list[Finding] = []
    for node in key_nodes(client, keys) if keys else server_nodes(client):
        try:
            found += at_node(node, check_server(*await read_server_async(client, node)))
        except RedisError as exc:
            found += at_node(node, [_unreadable(exc)])
    master = await _sentinel_master_async(client) if url else None
    return _report(found, strict=strict, log=log, flags=_flags(url, None, master))


def _flags(url: str | None, client: Any, master: tuple[str, int] | None = None) -> list[str]:
    return connection_flags(url, client, master) if url else []


async def _sentinel_master_async(client: Any) -> tuple[str, int] | None:
    """The master an asyncio Sentinel client reaches now (None: not Sentinel, or no answer)."""
    get = getattr(getattr(client, "connection_pool", None), "get_master_address", None)
    if get is None:
        return None
    try:
        host, port = await get()
        return str(host), int(port)
    except Exception:  # no sentinel answers: the fix line stays bare
        return None


def _unreadable(exc: Exception) -> Finding:
    return Finding(
        "settings-unreadable",
        "warning",
        f"cannot read the server's settings ({exc}); durability is unchecked",
        "grant the user +info",
    )


def _report(
    found: list[Finding], *, strict: bool, log: Callable[[str], object], flags: list[str]
) -> list[Finding]:
    for f in found:
        fix = fix_line(f.fix, flags, f.node)
        log(f"server settings ({f.severity}): {f.message} [{f.code}]; fix: {fix}")
    errors = [f for f in found if f.severity == "error"]
    if strict and errors:
        raise UnsafeServer(errors, flags)
    return found
