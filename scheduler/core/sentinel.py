"""Redis Sentinel URLs (core/connection.py hands them here) and their clients:

    redis+sentinel://[user:pw@]host[:port],host[:port]/service_name[/db][?options]
    rediss+sentinel://...            the same, TLS to the master (the sentinels: plain TCP)
    rediss+sentinel://...?sentinel_ssl=1   TLS to the master and to the sentinels

The hosts are sentinels (port 26379 when none is given), `service_name` the name they monitor
the master under (`sentinel monitor <name> ...`). The user and password are the master's, as in
a redis:// URL; the sentinels' own are options: `sentinel_username`, `sentinel_password`. Every
other query option is core/url_options.py's and applies to the master's connections;
socket_timeout, socket_connect_timeout and socket_keepalive to the sentinels' too, and with
`sentinel_ssl=1` every ssl_* option (the same CA, client certificate and checks). TLS to the
sentinels only (`redis+sentinel://...?sentinel_ssl=1`) is refused: redis-py takes one set of
ssl_* options for both. `?db=` overrides the path's database. A bad form (no service name, no
host, a bad port, an unknown option, Sentinel with Cluster) is refused (BadArgument) with the
password redacted.

The client is redis-py's `Sentinel(...).master_for(service, redis_class=redis.Redis)` (or the
asyncio twin): each new connection asks a sentinel for the master's address; after a failover
a READONLY reply or a dropped connection becomes a ConnectionError ("The previous master is now
a slave"), MasterNotFoundError (also a ConnectionError) while no master is known. The master
connections are core/sentinel_conn.py's: a call whose connection dropped is re-sent (3 times at
most) on a connection to the master the sentinels name now; MasterNotFoundError is raised at
once. The worker retries both as transient.

Every sentinel refusing the sentinel credentials (a wrong or missing `sentinel_password`, an
unknown `sentinel_username`, a sentinel user whose ACL lacks SENTINEL) is no outage: retrying
cannot help. That lookup raises SentinelRefused, an AuthenticationError naming the sentinels
(the CLI and `scheduler worker` exit 5, a running worker stops), not redis-py's "no master
found" (exit 3, retried forever). While one sentinel cannot be reached or knows no master, the
lookup stays a MasterNotFoundError: that one may answer later."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

import redis
import redis.asyncio as aredis
from redis.asyncio.sentinel import MasterNotFoundError as AsyncMasterNotFoundError
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError
from redis.sentinel import MasterNotFoundError, Sentinel

from scheduler.core.safety import REDACTED, is_secret_name, safe
from scheduler.core.sentinel_conn import master_connection_args, sentinel_lookup_args
from scheduler.core.url_options import FLAG, OPTIONS, Parse, whole
from scheduler.core.url_options import convert as _convert
from scheduler.core.url_options import url_error as _fail

__all__ = ["SCHEMES", "SentinelRefused", "SentinelSpec", "parse_sentinel", "sentinel_client"]

SCHEMES = {"redis+sentinel": "redis", "rediss+sentinel": "rediss"}
DEFAULT_PORT = 26379
# Options for the sentinel connections only (names as redis-py's, with the prefix).
SENTINEL_OPTIONS: dict[str, Parse] = {
    "sentinel_username": str,
    "sentinel_password": str,
    "sentinel_ssl": FLAG,  # TLS to the sentinels too, with the master's ssl_* options
}
# Options of the master's connections that the sentinels' take too.
_SHARED = ("socket_timeout", "socket_connect_timeout", "socket_keepalive")
_FORM = "redis+sentinel://host:port,host:port/service_name[/db]"


@dataclass(frozen=True, repr=False)
class SentinelSpec:
    """What a Sentinel URL adds to connection.Target (whose `options` are then the master's
    connections', with db, username and password): the `sentinels` (host, port), the monitored
    `service` name, `tls` to the master, `sentinel_options` for the sentinels' connections."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    tls: bool = False
    sentinel_options: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __repr__(self) -> str:  # the options may hold a password
        shown = {k: REDACTED if is_secret_name(k) else v for k, v in self.sentinel_options.items()}
        return (
            f"SentinelSpec(sentinels={self.sentinels!r}, service={self.service!r}, "
            f"tls={self.tls!r}, sentinel_options={shown!r})"
        )


def parse_sentinel(url: str) -> tuple[dict[str, Any], SentinelSpec]:
    """Read a redis+sentinel:// or rediss+sentinel:// URL (module docstring): the master's
    connection options, and the rest; BadArgument for a bad form."""
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if "cluster" in scheme:
        raise _fail(url, "Sentinel and Redis Cluster cannot be combined (a cluster fails over "
                    "by itself: redis+cluster://)")  # fmt: skip
    plain = SCHEMES.get(scheme)
    if plain is None:
        raise _fail(url, f"unknown scheme {scheme!r} (redis+sentinel, rediss+sentinel)")
    netloc, _, tail = rest.partition("/")
    if "?" in netloc:  # no path at all: redis+sentinel://h:p?x=1 (its query kept)
        netloc, query_text = netloc.split("?", 1)
        tail = "?" + query_text
    path, _, query = tail.partition("?")
    # As connection._split: a password's unencoded '/', '?', '#' or '@' cuts the URL in it.
    if "#" in rest or "@" in path or "@" in query.partition("=")[0]:
        why = "'#', or '@' after the host: in a password, percent-encode / ? # @ (%2F %3F %23 %40)"
        raise _fail(url, why)
    creds, _, hosts = netloc.rpartition("@")
    entries = hosts.split(",")
    if not hosts.strip() or any(not h.strip() for h in entries):
        raise _fail(url, f"no sentinel host:port given, or an empty one ({_FORM})")
    sentinels = tuple(_host_port(url, h) for h in entries)
    service, _, db_text = (unquote(p) for p in path.partition("/"))
    if db_text.endswith("/"):
        raise _fail(url, f"a trailing '/' after the database: {_FORM}")
    if not service:
        raise _fail(url, f"no service name (the name the sentinels monitor): {_FORM}")
    options, sentinel_options = _options(url, query, plain)
    db = _convert(url, "database", db_text, whole(0)) if db_text else None
    db = options.pop("db", db)
    if db is not None:
        options["db"] = db
    user, sep, password = creds.partition(":")
    if user:
        options["username"] = unquote(user)
    if sep:  # redis://user:pw@ and redis://:pw@ as redis-py reads them: the URL's win
        options["password"] = unquote(password)
    return options, SentinelSpec(sentinels, service, plain == "rediss", sentinel_options)


def _options(url: str, query: str, plain: str) -> tuple[dict[str, Any], dict[str, Any]]:
    options: dict[str, Any] = {}
    sentinel_options: dict[str, Any] = {}
    seen: set[str] = set()
    known = {**OPTIONS, **SENTINEL_OPTIONS}
    for name, text in parse_qsl(query, keep_blank_values=True):
        if name == "cluster":
            raise _fail(url, "Sentinel and Redis Cluster cannot be combined (?cluster=)")
        parse = known.get(name)
        if parse is None:
            near = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise _fail(url, f"unknown option {name!r}{hint}")
        if name.startswith("ssl_") and plain != "rediss":
            raise _fail(url, f"option {name!r} needs TLS (rediss+sentinel://)")
        if name in seen:
            raise _fail(url, f"option {name!r} given twice")
        seen.add(name)
        if text == "":  # ignored, as redis-py does
            continue
        into = sentinel_options if name in SENTINEL_OPTIONS else options
        into[name] = _convert(url, name, text, parse)
    if sentinel_options.get("sentinel_ssl") and plain != "rediss":
        why = ("sentinel_ssl=1 needs rediss+sentinel://: TLS to the sentinels but not to the "
               "master is not supported (both take the URL's ssl_* options)")  # fmt: skip
        raise _fail(url, why)
    return options, sentinel_options


# Host text is quoted in messages: it follows the URL's last '@' (refused after the host).
def _host_port(url: str, text: str) -> tuple[str, int]:
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep or text.endswith("]"):  # no port: host, [IPv6]
        host, port = text, str(DEFAULT_PORT)
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    # An IPv6 address needs its brackets ([::1]:26379); '[' or ']' elsewhere is no host.
    odd = (":" in host and not bracketed) or "[" in host or "]" in host
    if not host or odd or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise _fail(url, f"bad sentinel {text!r}: expected host:port ([::1]:port for IPv6)")
    return host, int(port)


class SentinelRefused(MasterNotFoundError, AsyncMasterNotFoundError, AuthenticationError):
    """Every sentinel refused the URL's sentinel credentials (`sentinel_username`,
    `sentinel_password`) or its user's permissions, so no master could be asked for: retrying
    cannot help. An AuthenticationError, as a master's refused password (the CLI and `scheduler
    worker` exit 5, a running worker stops), and a MasterNotFoundError (blocking and asyncio), as
    this lookup raised before. `hint` says what to check; the message names each sentinel."""

    hint = (
        "check the URL's sentinel_password and sentinel_username options (the sentinels' own; "
        "user:password@ is the master's)"
    )


def _refusal(exc: BaseException) -> bool:
    """A sentinel's answer that no retry changes: its password or user refused, or SENTINEL
    not allowed to that user."""
    return isinstance(exc, AuthenticationError | NoPermissionError)


def _refused_by(sentinel: Any, exc: BaseException) -> str:
    """host:port of the sentinel and its refusal (said plainly when no password was sent)."""
    kw = sentinel.connection_pool.connection_kwargs
    host = str(kw.get("host", "?"))
    where = f"{'[' + host + ']' if ':' in host else host}:{kw.get('port', '?')}"
    if isinstance(exc, AuthenticationError) and not kw.get("password"):
        return f"{where}: it requires a password, and the URL gives no sentinel_password"
    return f"{where}: {type(exc).__name__}: {exc}"


def _no_master(service: str, errors: list[tuple[Any, BaseException]], asked: int) -> Exception:
    """The lookup's failure: SentinelRefused when every sentinel asked refused the credentials
    (or SENTINEL), else redis-py's MasterNotFoundError, worded as redis-py words it."""
    if errors and len(errors) == asked and all(_refusal(e) for _, e in errors):
        each = "; ".join(_refused_by(s, e) for s, e in errors)
        noun = "the sentinel" if asked == 1 else f"all {asked} sentinels"
        logins = all(isinstance(e, AuthenticationError) for _, e in errors)
        what = "credentials" if logins else "user (its credentials or its SENTINEL permission)"
        why = f"{noun} refused the sentinel {what}, so no master of {service!r} was found"
        return SentinelRefused(safe(f"{why} ({each})"))
    info = ", ".join(f"{s} - {e!r}" + (f": {e}" if str(e) else "") for s, e in errors)
    return MasterNotFoundError(f"No master found for {service!r}" + (f" : {info}" if info else ""))


class SyncSentinelManager(Sentinel):
    """redis-py's Sentinel, closing its idle sentinel connections after each master lookup (one
    per new master connection): closing the master client leaves no socket open. The lookup is
    redis-py's discover_master, but it keeps each sentinel's error: SentinelRefused when every
    one refused the credentials (module docstring)."""

    def discover_master(self, service_name: str) -> Any:
        try:
            errors: list[tuple[Any, BaseException]] = []
            for i, sentinel in enumerate(self.sentinels):
                try:
                    masters = sentinel.sentinel_masters()
                except (redis.ConnectionError, ResponseError, redis.TimeoutError) as exc:
                    errors.append((sentinel, exc))
                    continue
                found = _master_in(self, masters, service_name, i)
                if found is not None:
                    return found
            raise _no_master(service_name, errors, len(self.sentinels))
        finally:
            for s in self.sentinels:
                s.connection_pool.disconnect(inuse_connections=False)


class AsyncSentinelManager(AsyncSentinel):
    """The asyncio twin of SyncSentinelManager (an unclosed asyncio transport warns at GC)."""

    async def discover_master(self, service_name: str) -> Any:
        try:
            errors: list[tuple[Any, BaseException]] = []
            for i, sentinel in enumerate(self.sentinels):
                try:
                    masters = await sentinel.sentinel_masters()
                except (redis.ConnectionError, ResponseError, redis.TimeoutError) as exc:
                    errors.append((sentinel, exc))
                    continue
                found = _master_in(self, masters, service_name, i)
                if found is not None:
                    return found
            error = _no_master(service_name, errors, len(self.sentinels))
            if type(error) is MasterNotFoundError:  # the asyncio client's own class
                error = AsyncMasterNotFoundError(*error.args)
            raise error
        finally:
            for s in self.sentinels:
                await s.connection_pool.disconnect(inuse_connections=False)


def _master_in(manager: Any, masters: Any, service_name: str, i: int) -> tuple[str, int] | None:
    """As redis-py's discover_master: the master's address when sentinel `i`'s SENTINEL MASTERS
    names it in a good state (that sentinel is asked first next time), else None."""
    state = masters.get(service_name)
    if not state or not manager.check_master_state(state, service_name):
        return None
    sentinels = manager.sentinels
    sentinels[0], sentinels[i] = sentinels[i], sentinels[0]
    forced = getattr(manager, "_force_master_ip", None)
    return (forced if forced is not None else state["ip"]), state["port"]


def sentinel_client(target: SentinelSpec, args: dict[str, Any], *, asyncio: bool) -> Any:
    """A client of the master `target` names: redis.Redis (asyncio: redis.asyncio.Redis) on a
    SentinelConnectionPool. `args`: the master connections' keyword arguments."""
    extra = {k.removeprefix("sentinel_"): v for k, v in target.sentinel_options.items()}
    tls = extra.pop("ssl", False)  # the sentinels: the master's ssl_* options (parse_sentinel)
    shared = {k: v for k, v in args.items() if k in _SHARED or (tls and k.startswith("ssl_"))}
    sentinel_kwargs = {**shared, **({"ssl": True} if tls else {}), **extra}
    sentinel_kwargs = sentinel_lookup_args(sentinel_kwargs, asyncio=asyncio)
    master_args = master_connection_args(args, tls=target.tls, asyncio=asyncio)
    if asyncio:
        manager: Any = AsyncSentinelManager(
            target.sentinels, sentinel_kwargs=sentinel_kwargs, **master_args
        )
        return manager.master_for(target.service, redis_class=aredis.Redis)
    manager = SyncSentinelManager(target.sentinels, sentinel_kwargs=sentinel_kwargs, **master_args)
    return manager.master_for(target.service, redis_class=redis.Redis)
