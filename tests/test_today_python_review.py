"""Regressions of this session's fixes (review of 6060d09..HEAD, Python side): each test
failed on the code it was written against."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aredis
from redis.exceptions import ConnectionError as RedisConnectionError

from scheduler import Queue
from scheduler.core.connection import connect, parse_url
from scheduler.core.safety import redact
from scheduler.core.scripts import Scripts
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.registry import JobContext, Registry
from tests.redis_server import RedisProcess


# -- connection.py: a query value holding '@' ------------------------------------------------
def test_a_query_value_with_an_at_sign_still_connects(redis_url: str) -> None:
    """'@' is valid in a query (RFC 3986 pchar) and redis-py reads it as given: an ACL user
    named like an email (`?username=ops@corp`), a `?password=` holding '@' (docs/security.md
    names the password= query argument), a client name. Yesterday these connected; today
    _split refuses any '@' after the host (meant for a password cut by an unencoded '/')."""
    sep = "&" if "?" in redis_url else "?"
    client = connect(f"{redis_url}{sep}client_name=worker@host-1")
    try:
        assert client.client_getname() == "worker@host-1"
    finally:
        client.close()


def test_redis_py_ssl_min_version_form_is_still_accepted() -> None:
    """redis-py reads `ssl_min_version` from a URL with int() (771 = TLS 1.2): the only form
    that worked yesterday is refused today; only the enum names are taken."""
    target = parse_url("rediss://cache.internal:6380/0?ssl_min_version=771")
    assert int(target.options["ssl_min_version"]) == 771


# -- safety.py redact: a query password with '@' ---------------------------------------------
def test_redact_hides_all_of_a_query_password_that_holds_an_at_sign() -> None:
    """_hide_password treats 'host:port/db?password=hun' as user:password and keeps what
    follows the last '@': the password's tail is printed (the old pattern hid it whole). The
    CLI prints exactly this for such a --url (`error: invalid --url redis://h:***@2024...`)."""
    for url, secret in (
        ("redis://cache.internal:6379/0?password=hunter@2024", "2024"),
        ("redis://app:pw@cache.internal:6379/0?password=x@tail-secret", "tail-secret"),
    ):
        shown = redact(url)
        assert secret not in shown, f"redact({url!r}) = {shown!r} prints the password's tail"


# -- worker shutdown: a backlog job is started while a lost claim is re-sent -----------------
registry = Registry()
STARTED: list[str] = []
GATE: dict[str, asyncio.Event] = {}


@registry.task(name="rt-quick")
async def quick(payload: Any, ctx: JobContext) -> None:
    return None


@registry.task(name="rt-gate")
async def gated(payload: Any, ctx: JobContext) -> None:
    STARTED.append(ctx.job_id)
    await GATE["gate"].wait()


@registry.task(name="rt-mark")
async def mark(payload: Any, ctx: JobContext) -> None:
    STARTED.append(ctx.job_id)


class LoseClaimsThenSlowReplay(aredis.Redis):
    """While `lose`: a claim runs on the server, then its answer is lost (the nonce stays
    pending). Once the worker stops, a claim (shutdown's re-send) takes 0.5 s to answer."""

    claim_sha = Scripts().sha["claim"]
    worker: Worker | None = None
    lose = False
    lost = 0

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        is_claim = args[:2] == ("EVALSHA", self.claim_sha)
        stopping = self.worker is not None and self.worker._stop_claiming.is_set()
        if is_claim and stopping:
            await asyncio.sleep(0.5)
        reply = await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        if is_claim and self.lose and not stopping:
            self.lost += 1
            raise RedisConnectionError("reply lost")
        return reply


async def _poll(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def test_no_backlog_job_starts_while_shutdown_resends_a_lost_claim(
    module_server: RedisProcess,
) -> None:
    """Shutdown gives back the jobs never started "at once" (worker/__init__.py). Today's
    _shutdown first awaits _replay_claims (up to _SETTLE_S) and only then takes the backlog,
    with _shutting_down still False: a running job that ends meanwhile _pump()s the next
    backlog job into a handler after the stop."""
    q = Queue(module_server.client(), "rt-" + uuid.uuid4().hex[:10])
    tag = uuid.uuid4().hex[:8]
    STARTED.clear()

    async def main() -> tuple[int, bool]:
        client = LoseClaimsThenSlowReplay(
            unix_socket_path=module_server.socket, decode_responses=True
        )
        settings = WorkerSettings(
            queues=(q.name,), concurrency=1, grace_s=5, lease_ms=30_000, heartbeat_ms=1_000
        )
        w = Worker(client, registry, settings)
        client.worker = w
        GATE["gate"] = asyncio.Event()
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            for _ in range(3):  # short jobs: the worker then claims ahead (prefetch)
                q.enqueue("rt-quick")
            await _poll(lambda: w._mean_run_s is not None, 5, "short jobs to run")
            q.enqueue("rt-gate", job_id=f"a-{tag}")
            b = q.enqueue("rt-mark", job_id=f"b-{tag}")
            await _poll(lambda: any(r.job.id == b for r in w._backlog), 5, "B in the backlog")
            client.lose = True
            q.enqueue("rt-mark", job_id=f"c-{tag}")  # its claim's answer is lost
            await _poll(lambda: client.lost >= 1, 5, "a lost claim answer")
            was_backlog = any(r.job.id == b for r in w._backlog)
            asyncio.get_running_loop().call_later(0.2, GATE["gate"].set)  # A ends in the replay
        finally:
            w.request_stop()
            code = await asyncio.wait_for(task, 20)
            await client.aclose()
        return code, was_backlog

    try:
        code, was_backlog = asyncio.run(main())
        assert code == 0 and was_backlog
        assert f"b-{tag}" not in STARTED, (
            f"job b-{tag} was in the backlog when the worker was stopped, yet it was started "
            f"during shutdown (handlers started: {STARTED}); its status is now "
            f"{q.status(f'b-{tag}')}"
        )
    finally:
        for key in q.client.scan_iter(match=q.keys.pattern()):
            q.client.delete(key)


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        (
            "Redis Cluster cannot be connected. Please provide at least one reachable node",
            "transient",
        ),
        ("All slots are not covered after query all startup_nodes.", "transient"),
        ("Invalid args in command: ('GET',)", "fatal"),
        ("No targets were found to execute ('X',) command on", "fatal"),
    ],
)
def test_only_a_cluster_remapping_is_retried(message: str, kind: str) -> None:
    """redis-py's client-side cluster errors: while no node answers or the slot map is rebuilt,
    retried; its other ones (a bug in the call) stop the loop, not a retry for good."""
    from redis.exceptions import RedisClusterException

    from scheduler.worker.execution import classify

    assert classify(RedisClusterException(message)) == kind
