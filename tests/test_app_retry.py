"""Which clients built from a URL re-send a call (core/connection.py plain_retry): redis-py's
from_url gives its connections Retry(NoBackoff(), 0), a plain redis.Redis(...) its default
Retry. The app's queues from a URL get the plain client's (a call after a Redis restart goes
on: tests/test_review_durability_doc.py); `scheduler worker` keeps none (socket_timeout=30 and
its own backoff), and so does the CLI (one-shot, fails fast). Cluster and Sentinel clients keep
their own retry. No call reaches a server unless the test says so."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
import redis
import redis.asyncio as aredis

from scheduler import AsyncQueue, Queue, open_queue, open_queue_async
from scheduler.cli import worker_start
from scheduler.core import connection
from scheduler.worker.registry import Registry
from tests.redis_server import RedisProcess

NOWHERE = "unix:///nonexistent/app-retry.sock"  # never connected to: a connection is only built


def _retries(client: Any) -> int:
    """The re-sends a new connection of `client`'s pool makes after a ConnectionError."""
    conn = client.connection_pool.make_connection()
    assert redis.ConnectionError in conn.retry._supported_errors
    return cast(int, conn.retry.get_retries())


def _plain(one: Any) -> int:
    """What a plain redis.Redis(...) / redis.asyncio.Redis(...) gives: the installed redis-py's."""
    return _retries(one(unix_socket_path="/nonexistent/app-retry.sock"))


def test_the_plain_clients_retry_and_from_url_does_not() -> None:
    """The premise: if redis-py's from_url gave retries, default_retry would be dead code."""
    assert _plain(redis.Redis) > 0 and _plain(aredis.Redis) > 0
    assert _retries(redis.Redis.from_url(NOWHERE)) == 0
    assert _retries(aredis.Redis.from_url(NOWHERE)) == 0


def test_queue_from_url_retries_as_a_plain_client() -> None:
    with Queue.from_url(NOWHERE, "ar") as q:
        assert _retries(q.client) == _plain(redis.Redis) > 0


def test_async_queue_from_url_retries_as_a_plain_client() -> None:
    async def go() -> int:
        aq = AsyncQueue.from_url(NOWHERE, "ar")
        try:
            return _retries(aq.client)
        finally:
            await aq.aclose()

    assert asyncio.run(go()) == _plain(aredis.Redis) > 0


def test_open_queue_from_a_url_retries_as_a_plain_client(module_server: RedisProcess) -> None:
    with open_queue(module_server.url, "ar") as q:
        assert _retries(q.client) == _plain(redis.Redis) > 0

    async def go() -> int:
        aq = await open_queue_async(module_server.url, "ar")
        try:
            return _retries(aq.client)
        finally:
            await aq.aclose()

    assert asyncio.run(go()) == _plain(aredis.Redis) > 0


def test_a_retry_given_as_default_retry_is_used_for_one_server_only() -> None:
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    once = Retry(NoBackoff(), 1)
    assert _retries(connection.connect(NOWHERE, default_retry=once)) == 1
    url = "redis+sentinel://127.0.0.1:1/mymaster"
    kinds = [
        type(
            cast(
                Any, connection.connect(url, default_retry=d).connection_pool.make_connection()
            ).retry
        )
        for d in (once, False)
    ]
    assert kinds[0] is kinds[1]


def test_a_retry_the_caller_gives_is_kept() -> None:
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client = connection.connect(NOWHERE, default_retry=True, retry=Retry(NoBackoff(), 2))
    assert _retries(client) == 2


def test_connect_without_default_retry_does_not_retry() -> None:
    """The CLI's and the fixtures' connect(url): as before, no re-send."""
    assert _retries(connection.connect(NOWHERE)) == 0
    assert _retries(connection.connect_async(NOWHERE)) == 0


def test_the_workers_client_does_not_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    """`scheduler worker` (cli/worker_start.py serve) builds its client without default_retry:
    the client it built, caught at its first call, which then fails (no server reached)."""
    built: list[Any] = []

    def spy(url: str, **kwargs: Any) -> aredis.Redis:
        client = connection.connect_async(url, **kwargs)
        built.append(client)
        return client

    async def first_call(*_args: Any, **_kwargs: Any) -> None:
        raise redis.ConnectionError("stopped here by the test")

    monkeypatch.setattr(worker_start, "connect_async", spy)
    monkeypatch.setattr(worker_start, "check_access_async", first_call)
    settings = cast(Any, type("Settings", (), {"queues": ("ar",)})())
    code = asyncio.run(
        worker_start.serve(NOWHERE, Registry(), settings, None, strict=False, worker_id=None)
    )
    assert code != 0 and len(built) == 1
    (client,) = built
    assert client.connection_pool.connection_kwargs["socket_timeout"] == 30
    assert _retries(client) == 0


def test_a_sentinel_and_an_async_cluster_client_are_as_without_default_retry() -> None:
    """default_retry touches one server's client only (neither connects here)."""
    url = "redis+sentinel://127.0.0.1:1/mymaster"
    with_, without = (connection.connect(url, default_retry=d) for d in (True, False))
    kinds = [type(cast(Any, c.connection_pool.make_connection()).retry) for c in (with_, without)]
    assert kinds[0] is kinds[1] and _retries(with_) == _retries(without)

    async def go() -> tuple[int, int]:
        url = "redis+cluster://127.0.0.1:1/"
        a, b = (connection.connect_async(url, default_retry=d) for d in (True, False))
        return cast(Any, a).retry.get_retries(), cast(Any, b).retry.get_retries()

    given, own = asyncio.run(go())
    assert given == own


def test_the_dashboard_from_a_url_re_sends_once_at_once_after_a_dropped_connection() -> None:
    """A page right after a Redis restart re-sends (not a 503), once and without backoff, and
    not after a timeout: with Redis down a page reads every queue (tests/test_review_session_
    diff8.py: the plain client's 10 re-sends made an overview of 5 queues answer after 43 s)."""
    from scheduler.dashboard import Auth, create_app

    app = create_app(NOWHERE, auth=Auth(), secret="s" * 32)
    conn = cast(Any, app.store.client.connection_pool.make_connection())
    assert conn.retry.get_retries() == 1 and type(conn.retry._backoff).__name__ == "NoBackoff"
    assert redis.ConnectionError in conn.retry._supported_errors
    assert redis.TimeoutError not in conn.retry._supported_errors
    given = redis.Redis(unix_socket_path="/nonexistent/app-retry.sock")
    assert create_app(client=given, auth=Auth(), secret="s" * 32).store.client is given
