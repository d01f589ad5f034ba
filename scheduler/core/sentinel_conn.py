"""The master connections of a Sentinel client (core/sentinel.py builds it): redis-py's
SentinelManagedConnection, whose reconnect inside a call asks the sentinels too.

redis-py asks a sentinel for the master's address in the connection's connect(), which the
pool calls as it hands a connection out. A connection dropped during a call (the demoted
master's READONLY, which redis-py turns into ConnectionError("The previous master is now a
slave") and a disconnect; a reset) is reconnected by the call's retry in send_packed_command,
and there redis-py 7.3 and 8.x use the connection's cached host and port: the old master again.
Here that reconnect asks the sentinels first, as connect() does, so the re-sent call goes to the
master they name now.

redis-py gives these connections no retry (Retry(NoBackoff(), 0)), so nothing was re-sent:
unless the caller gives `retry`, a call is re-sent 3 times at most on a ConnectionError, but
not on a refused login or no master known (master_connection_args). Every call the driver
sends may be sent twice (an enqueue is keyed by its id, a settle by its lease token, a claim
replays by its nonce). A timeout is not re-sent: a slow script or WAIT is not run again, and a
hung master is not waited on 4 times over (its socket timeout once, then the caller's own
retry reconnects)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import MasterNotFoundError as AsyncMasterNotFound
from redis.asyncio.sentinel import SentinelManagedConnection as AsyncManaged
from redis.asyncio.sentinel import SentinelManagedSSLConnection as AsyncManagedSSL
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry
from redis.sentinel import (
    MasterNotFoundError,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)

__all__ = ["master_connection_args", "sentinel_lookup_args"]

T = TypeVar("T")

# Re-sent 3 times, after 0.1, 0.2 and 0.4 s.
_BACKOFF = dict(cap=1.0, base=0.05)
_RETRIES = 3
_ERRORS = (RedisConnectionError,)


def _retryable(error: Exception) -> bool:
    # ConnectionErrors raised at once, as without a retry: a refused login (the master's, or
    # every sentinel's: SentinelRefused), which no re-send changes (the CLI's exit 5); no master
    # known, whose lookup already asked every sentinel: the worker's own backoff waits for them.
    return not isinstance(error, AuthenticationError | MasterNotFoundError | AsyncMasterNotFound)


def _and(extra: Callable[[Exception], bool] | None) -> Callable[[Exception], bool]:
    return _retryable if extra is None else lambda e: _retryable(e) and extra(e)


class _MasterRetry(Retry):
    # call_with_retry's is_retryable: redis-py 7.3 has no constructor argument for it.
    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Any,
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        return super().call_with_retry(do, fail, _and(is_retryable), with_failure_count)


class _AsyncMasterRetry(AsyncRetry):
    async def call_with_retry(
        self,
        do: Callable[[], Awaitable[T]],
        fail: Any,
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        return await super().call_with_retry(do, fail, _and(is_retryable), with_failure_count)


class SentinelMasterConnection(SentinelManagedConnection):
    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        # Not connected (dropped in this call): ask the sentinels, as connect() does, but once
        # (the call's retry is the loop); redis-py's own send reconnects to the cached address.
        # is_connected: redis-py 8; 7.3 has only the socket (its own sentinel code reads it).
        pool = self.connection_pool
        if pool.is_master and not getattr(self, "is_connected", self._sock):
            self.connect_to(pool.get_master_address())  # type: ignore[no-untyped-call]
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


class SentinelMasterSSLConnection(SentinelMasterConnection, SentinelManagedSSLConnection):
    pass


class AsyncSentinelMasterConnection(AsyncManaged):
    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        pool = self.connection_pool
        if pool.is_master and not self.is_connected:  # as the blocking twin
            await self.connect_to(await pool.get_master_address())  # type: ignore[no-untyped-call]
        await super().send_packed_command(command, check_health)


class AsyncSentinelMasterSSLConnection(AsyncSentinelMasterConnection, AsyncManagedSSL):
    pass


def master_connection_args(args: dict[str, Any], *, tls: bool, asyncio: bool) -> dict[str, Any]:
    """`args` (the master connections' keyword arguments) with the connection class above (TLS
    or not) and, unless `args` has one, the bounded retry (blocking or asyncio)."""
    if asyncio:
        cls: type = AsyncSentinelMasterSSLConnection if tls else AsyncSentinelMasterConnection
        retry: Any = _AsyncMasterRetry(ExponentialBackoff(**_BACKOFF), _RETRIES, _ERRORS)
    else:
        cls = SentinelMasterSSLConnection if tls else SentinelMasterConnection
        retry = _MasterRetry(ExponentialBackoff(**_BACKOFF), _RETRIES, _ERRORS)
    return {"retry": retry, **args, "connection_class": cls}


def sentinel_lookup_args(args: dict[str, Any], *, asyncio: bool) -> dict[str, Any]:
    """The sentinels' connection arguments with no retry, as redis-py 8 makes them: 7.3 gave
    them its client's default (3 retries, 1 to 10 s apart) for each sentinel of each lookup,
    so an unreachable or refusing sentinel held every new master connection for seconds."""
    return {"retry": (AsyncRetry if asyncio else Retry)(NoBackoff(), 0), **args}
