"""The one reader of a connection URL, and what the rest of the package needs to know about a
client: is it a Redis Cluster, which node owns a key, one plain client per primary.

URL forms (every entry point: `Queue.from_url`, `open_queue`, `scheduler worker`, every command):

    redis://host:port/0, rediss://..., unix:///path.sock     one server
    redis+cluster://host:port,host:port/                     a Redis Cluster (any node(s) of it)
    rediss+cluster://...                                     the same over TLS
    redis://host:port/?cluster=1  (also rediss://)           the same, one seed node
    redis+sentinel://host:port,host:port/service_name[/db]   the master that Sentinel names
    rediss+sentinel://...                    the same, TLS to the master (core/sentinel.py)

User and password go in the URL as usual (`redis+cluster://user:pw@h:p,h:p/`). A cluster has
only database 0 and needs TCP: `unix://` with cluster, or `/1`, is refused (BadArgument).
Query options (`?socket_timeout=5`) are the names in core/url_options.py, converted there; any
other name, a bad value, port or database, a TLS file unusable or a key's password missing (also
as connect()'s keywords) is refused (BadArgument) before any connection; `?sentinel_*=` too."""

from __future__ import annotations

import contextlib
import copy
import difflib
import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, parse_qsl, unquote, urlencode, urlsplit

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ClusterError, RedisClusterException, SlotNotCoveredError

from scheduler.core import url_options
from scheduler.core.errors import BadArgument, cluster_refusal
from scheduler.core.safety import REDACTED, is_secret_name, redact
from scheduler.core.sentinel import SentinelSpec, parse_sentinel, sentinel_client
from scheduler.core.url_options import CLUSTER_OPTIONS, FLAG, OPTIONS, Parse, whole
from scheduler.core.url_options import convert as _convert
from scheduler.core.url_options import url_error as _fail

__all__ = ["Target", "connect", "connect_async", "is_cluster", "parse_url", "primaries"]

_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


@dataclass(frozen=True, repr=False)
class Target:
    """A parsed URL. `url`: a single-server URL (a cluster's first seed node, without the marker),
    `seeds`: a cluster's seed nodes (empty: one server), `options`: the query options, converted."""

    url: str
    seeds: tuple[tuple[str, int], ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    sentinel: SentinelSpec | None = None  # a Sentinel URL's sentinels (`url`: the URL as given)

    @property
    def cluster(self) -> bool:
        return bool(self.seeds)

    @property
    def address(self) -> str:  # what a client is built from: `options` carry query and db
        base = self.url.split("?", 1)[0]
        return base if base.startswith("unix://") else "/".join(base.split("/", 3)[:3])

    def __repr__(self) -> str:  # the URL and options may hold the password
        options = {k: REDACTED if is_secret_name(k) else v for k, v in self.options.items()}
        return f"Target(url={redact(self.url)!r}, seeds={self.seeds!r}, options={options!r})"


def parse_url(url: str) -> Target:
    """Read one URL (module docstring); BadArgument when it cannot name a server, or names an
    option, port or database no client would take."""
    if not isinstance(url, str) or "://" not in url:
        raise BadArgument(f"invalid Redis URL {redact(str(url))}: expected scheme://...")
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()  # REDIS:// too: redis-py itself reads only lower case
    if "sentinel" in scheme:  # also a wrong one (redis+cluster+sentinel): refused there
        return Target(url, (), *parse_sentinel(url))
    plain = _SCHEMES.get(scheme, scheme)
    if plain not in ("redis", "rediss", "unix"):
        raise _fail(url, f"unknown scheme {scheme!r} (redis[s], unix, redis[s]+cluster/sentinel)")
    parts = _split(url, f"{plain}://{rest}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    flag = [_convert(url, "cluster", v, FLAG) for k, v in query if k == "cluster"]
    cluster = scheme in _SCHEMES or any(flag)
    if cluster and plain == "unix":
        raise _fail(url, "a Redis Cluster needs TCP (redis+cluster://host:port,...)")
    pairs = [(k, v) for k, v in query if k != "cluster"]
    options = _options(url, pairs, plain, cluster)
    db = _database(url, plain, parts.path, options.pop("db", None))
    # Target.url by hand: urlunsplit writes unix:/path, which redis-py refuses
    text = urlencode(pairs) if flag else parts.query
    tail = f"?{text}" if text else ""
    if cluster:
        return _cluster_target(url, parts, tail, options, db)
    if plain == "unix" and not parts.path:
        raise _fail(url, "no socket path (unix:///path/to/redis.sock)")
    if plain != "unix":
        _check_port(url, parts)
    if db is not None:
        options["db"] = db
    return Target(f"{plain}://{parts.netloc}{parts.path}{tail}", (), options)


def _split(url: str, text: str) -> SplitResult:
    """urlsplit, refusing a password's unencoded '/', '?' or '#': they cut the URL in it."""
    try:
        parts = urlsplit(text)
    except ValueError:  # urllib's message may quote the host part
        raise _fail(url, "not a URL (scheme://[user:password@]host:port/db)") from None
    # '@' after the host only where a password cut short puts it: a redis:// path, or a query
    # before its first '=' (a query value may hold '@': ?client_name=w@h; a socket path too).
    cut = parts.scheme != "unix" and "@" in parts.path
    if "#" in text or cut or "@" in parts.query.partition("=")[0]:
        why = "'#', or '@' after the host: in a password, percent-encode / ? # @ (%2F %3F %23 %40)"
        raise _fail(url, why)
    return parts


def _options(url: str, query: list[tuple[str, str]], plain: str, cluster: bool) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for name, text in query:
        parse = _option(url, name, plain, cluster)
        if name in options:
            raise _fail(url, f"option {name!r} given twice")
        if text == "":  # ignored, as redis-py does
            continue
        options[name] = _convert(url, name, text, parse)
    url_options.check_key_password(options, url)
    return options


def _option(url: str, name: str, plain: str, cluster: bool) -> Parse:
    parse = OPTIONS.get(name)
    if parse is None:
        near = difflib.get_close_matches(name, OPTIONS, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise _fail(url, f"unknown option {name!r}{hint}")
    if cluster and name not in CLUSTER_OPTIONS:
        raise _fail(url, f"option {name!r} is not supported on a Redis Cluster")
    if name.startswith("ssl_") and plain != "rediss":
        raise _fail(url, f"option {name!r} needs TLS (rediss://)")
    if name == "socket_keepalive" and plain == "unix":
        raise _fail(url, f"option {name!r} needs TCP")
    return parse


def _database(url: str, plain: str, path: str, query_db: int | None) -> int | None:
    """The database: `?db=` over the path's (as redis-py); unix:// has only `?db=`."""
    if plain == "unix":
        return query_db
    text = unquote(path).strip("/")
    db = _convert(url, "database", text, whole(0)) if text else None
    return query_db if query_db is not None else db


def _cluster_target(
    url: str, parts: SplitResult, tail: str, options: dict[str, Any], db: int | None
) -> Target:
    if db not in (None, 0):
        raise _fail(url, "a Redis Cluster has only database 0")
    creds, _, hosts = parts.netloc.rpartition("@")
    seeds = tuple(_host_port(url, h) for h in hosts.split(",") if h.strip())
    if not seeds:
        raise _fail(url, "no host:port given")
    host, port = seeds[0]
    netloc = (creds + "@" if creds else "") + (f"[{host}]" if ":" in host else host) + f":{port}"
    return Target(f"{parts.scheme}://{netloc}/0{tail}", seeds, options)


# Node text is quoted in messages: it follows the URL's last '@' (_split), so holds no password.
def _check_port(url: str, parts: SplitResult) -> None:
    with contextlib.suppress(ValueError):  # urllib's: not a number, out of range (quotes it)
        if parts.port != 0:  # None: redis-py's 6379
            return
    raise _fail(url, f"bad port in {parts.netloc.rpartition('@')[2]!r}: expected host:port")


def _host_port(url: str, text: str) -> tuple[str, int]:
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep or text.endswith("]"):  # no port: host, [IPv6]
        host, port = text, "6379"
    host = host.strip("[]")
    if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise _fail(url, f"bad node {text!r}: expected host:port")
    return host, int(port)


def plain_retry(one: type[redis.Redis] | type[aredis.Redis]) -> Any:
    """A copy of the Retry a plain `one(...)` gives its connections (redis-py's default; from_url:
    none), for the app's queues from a URL. Not `scheduler worker`'s (socket_timeout=30, its own
    backoff: re-sends could hold a call minutes) nor the CLI's (one-shot, fails fast: exit 3)."""
    return copy.deepcopy(inspect.signature(one.__init__).parameters["retry"].default)


def _client(url: str, kw: dict[str, Any], one: Any, cluster: Any, node: Any) -> Any:
    retry = kw.pop("default_retry", False)  # not a parameter: callers pass **dict[str, str]
    target = parse_url(url)
    url_options.check_tls_paths({**kw, **target.options})  # a key's password may be a keyword
    # The URL's options over the caller's (as from_url); bytes not UTF-8 read as `\xff` escapes.
    args = {"decode_responses": True, "encoding_errors": "backslashreplace", **kw}
    args.update(target.options)
    if target.sentinel is not None:  # its own retry (core/sentinel_conn.py)
        return sentinel_client(target.sentinel, args, asyncio=one is aredis.Redis)
    if not target.cluster:
        if retry and args.get("retry") is None:  # True: the plain client's, else the one given
            args["retry"] = plain_retry(one) if retry is True else retry
        return one.from_url(target.address, **args)
    others = [node(h, p) for h, p in target.seeds[1:]]  # RedisCluster: its own retry
    return cluster.from_url(target.address, startup_nodes=others, **args)


def connect(url: str, **kwargs: Any) -> redis.Redis:
    """A client for `url` (one server, a Cluster, a Sentinel's master; decoded replies unless
    `decode_responses=False`; a bad URL: BadArgument). `default_retry`: True, one server's calls
    re-send as a plain redis.Redis's (plain_retry); a Retry, by it (Cluster, Sentinel: theirs)."""
    return _client(url, kwargs, redis.Redis, RedisCluster, ClusterNode)  # type: ignore[no-any-return]


def connect_async(url: str, **kwargs: Any) -> aredis.Redis:
    """The asyncio counterpart of connect()."""
    return _client(url, kwargs, aredis.Redis, AsyncRedisCluster, AsyncClusterNode)  # type: ignore[no-any-return]


# A read's server or cluster node cannot answer (refused, timed out, down, slots remapped): the
# dashboard answers 503, reads the other nodes (redis-py's cluster errors: not ConnectionErrors).
UNREACHABLE: tuple[type[Exception], ...] = (
    redis.ConnectionError, redis.TimeoutError, RedisClusterException, ClusterError
)  # fmt: skip

# redis-py's messages while it cannot (re)build the slot map: nodes down, or mid-failover.
_CLUSTER_REMAPPING = (
    "cannot be connected", "could not agree on a valid", "slots are not covered",
    "has no redis_connection",
)  # fmt: skip


def cluster_unreachable(exc: BaseException) -> bool:
    """redis-py's own cluster errors (raised by the client, not replies) that mean no node
    answered while it re-read the slot map after a dropped connection (every node down a
    moment, a restart), a slot not yet covered, redirections used up. Its other ones (a
    cross-slot call, "Missing key", "Invalid args", no target found) are bugs: the worker does
    not retry them, the CLI does not call them unreachable."""
    if isinstance(exc, ClusterError | SlotNotCoveredError):
        return True
    if not isinstance(exc, RedisClusterException):
        return False
    if isinstance(exc, redis.CrossSlotTransactionError) or cluster_refusal(exc) is not None:
        return False  # a bug; a login or ACL refusal, said as unreachable
    return any(m in str(exc) for m in _CLUSTER_REMAPPING)


# Per client class: the isinstance check costs ~3 us (AsyncRedisCluster's ABC/typing
# instancecheck) and the driver asks it on every call (issue 16: single enqueue).
_CLUSTER_TYPES: dict[type, bool] = {}


def is_cluster(client: Any) -> bool:
    """True for a redis-py RedisCluster (blocking or asyncio)."""
    known = _CLUSTER_TYPES.get(type(client))
    if known is None:
        known = _CLUSTER_TYPES[type(client)] = isinstance(client, (RedisCluster, AsyncRedisCluster))
    return known


def primaries(client: redis.Redis) -> list[redis.Redis]:
    """One plain client per primary of a cluster (for SCAN, INFO, CONFIG: per-node commands),
    or [client] for a single server. The clients belong to the cluster client (not closed)."""
    return [c for _, c in named_primaries(client)]


def key_nodes(client: Any, keys: Iterable[str]) -> list[Any]:
    """The primaries (ClusterNode) holding `keys` on a cluster client, each once, in the keys'
    order; [None] (the one server) for a plain client. An asyncio cluster client must have
    made its first call (its slot map is read then)."""
    if not is_cluster(client):
        return [None]
    nodes: dict[str, Any] = {}
    for node in map(client.get_node_from_key, keys):
        nodes.setdefault(node.name, node)
    return list(nodes.values())


def named_primaries(client: redis.Redis) -> list[tuple[str, redis.Redis]]:
    """primaries(), each with its node's host:port ("" for a single server)."""
    if not isinstance(client, RedisCluster):
        return [("", client)]
    return [(n.name, client.get_redis_connection(n)) for n in client.get_primaries()]


def node_for_key(client: redis.Redis, key: str) -> redis.Redis:
    """The plain client of the primary owning `key`'s slot (the client itself on one server)."""
    if not isinstance(client, RedisCluster):
        return client
    return client.get_redis_connection(client.get_node_from_key(key))
