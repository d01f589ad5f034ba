"""Review of the changes since 645531c (fresh eyes): wait_replicas' re-send and WAIT read
timeout (producing.py, direct_io.py), the rate window after a clock step back (lib/flow.lua
flow_rate_ahead), flagged schedules in `schedules list`, an embedded worker's start while Redis
is away (worker/partitioned_start.py expand_until_read), PartitionedQueue.create's reserved
names. Defects are strict xfails; the rest hold. Private servers only (never the shared one);
a server "away" is one not started yet (its socket absent: a connection refused at once)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from click.testing import CliRunner
from redis.backoff import NoBackoff
from redis.retry import Retry

from scheduler import AsyncQueue, JobContext, NotDurable, Queue, Registry
from scheduler._spawn import RedisProcess
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import connect_async
from scheduler.core.partitions import Layout, PartitionMismatch, meta_key
from scheduler.worker import Worker, WorkerSettings
from tests.redis_server import require_server

T0 = 10_000_000_000  # a server time on the test clock, ms
SEC, MIN, HOUR = 1_000, 60_000, 3_600_000


def _registry() -> Registry:
    registry = Registry()

    @registry.task("t")
    def t(payload: Any, ctx: JobContext) -> None:
        return None

    return registry


@pytest.fixture
def away() -> Iterator[RedisProcess]:
    """A private server not started yet (the test starts it when Redis "comes back")."""
    server = RedisProcess(require_server("a server started late"))
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def srv(module_server: RedisProcess) -> Iterator[redis.Redis]:
    c = module_server.client()
    c.flushall()
    yield c
    c.close()


def _run(q: Queue) -> list[str]:
    """Claim what is due and complete it until a claim says nothing more is due now."""
    ran: list[str] = []
    for _ in range(20):
        batch = q.claim("w", limit=10, lease_ms=30_000)
        for j in batch.jobs:
            q.complete(j.id, j.token)
            ran.append(j.id)
        if len(batch.jobs) < 10 and not (0 <= batch.next_ms <= batch.now_ms):
            break
    return ran


# --- defects ------------------------------------------------------------------------------


def test_a_burst_worker_started_while_redis_is_away_stops_as_failing_claims_do(
    away: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SelfStop._loop_error stops a burst worker whose claims failed for BURST_FAILING_S (exit
    1: "it would never find that queue empty, so never end"). Given names_read=True (the CLI's
    start) the same worker does so; embedded, its start now loops in expand_until_read, whose
    errors are `queues`', not `claim`'s, until a stop nobody sends: a test's or a one-off
    drain's burst worker hangs. Bounds patched short so the test is quick."""
    from scheduler.worker import runtime, self_stop

    monkeypatch.setattr(self_stop, "BURST_FAILING_S", 0.2)
    monkeypatch.setattr(runtime, "_SETTLE_S", 0.2)

    async def go() -> int | str:
        client = connect_async(away.url)
        worker = Worker(client, _registry(), WorkerSettings(queues=("bq",), burst=True, grace_s=0))
        try:
            return await asyncio.wait_for(worker.run(install_signals=False), 3.0)
        except TimeoutError:
            return "still running"
        finally:
            await client.aclose()

    assert asyncio.run(go()) == 1


def test_a_stepped_rate_held_job_behind_a_longer_windows_entry_goes_first_of_its_key(
    srv: redis.Redis,
) -> None:
    """docs/durability.md (Clock steps, Back) and flow-control.md: a job the window set aside
    before the step "gets its slot from now too, and goes before the key's jobs due by the
    clock behind". B (1/s key r) is set aside by a clock 30 min ahead; an hourly key's L2 is
    set aside at the same time with a slot the hour allows (its start was earlier). After the
    step back the first entry past now is L2, not stepped, so flow_rate_ahead answers nil and B
    is never looked at: C, enqueued after the step, runs at once and B waits the 30 min."""
    q = Queue(srv, "fstep", _clock="test")
    clock = q.keys.test_clock
    step = 30 * MIN
    hourly: dict[str, Any] = {"rate_limit": (1, HOUR), "rate_key": "L"}
    per_s: dict[str, Any] = {"rate_limit": (1, SEC), "rate_key": "r"}
    srv.set(clock, T0 + step - HOUR + 500)
    q.enqueue("t", 0, job_id="l1", **hourly)
    assert _run(q) == ["l1"]
    srv.set(clock, T0 + step)  # the clock ahead
    q.enqueue("t", 0, job_id="l2", **hourly)
    q.enqueue("t", 1, job_id="a", **per_s)
    q.enqueue("t", 2, job_id="b", **per_s)
    assert _run(q) == ["a"]  # l2 and b set aside
    srv.set(clock, T0)  # back
    q.enqueue("t", 3, job_id="c", **per_s)
    ran: list[str] = []
    for k in range(1, 4):
        srv.set(clock, T0 + k * (SEC + 1))
        ran += _run(q)
    assert ran[:1] == ["b"] and sorted(ran) == ["b", "c"], ran


@pytest.mark.parametrize("which", ["a partition's record", "the parent's record"])
def test_create_refuses_a_reserved_name_whose_record_is_of_another_type(
    srv: redis.Redis, which: str
) -> None:
    """check_reserved maps a parent record it cannot parse to PartitionMismatch ("may be a
    partition of ..."); one of another type (a hand edit, as the dashboard's stored_layout and
    inspection.stored_layout read as UnreadableRecord) escapes as redis-py's
    'Command # 1 (GET ...) of pipeline caused error: WRONGTYPE', nothing typed."""
    if which == "a partition's record":
        name = "em"
        srv.hset(meta_key(Layout.create(name, 2).names[0]), "x", "1")
    else:
        name = "par.p1"
        srv.hset(meta_key("par"), "x", "1")
    with pytest.raises(PartitionMismatch):
        PartitionedQueue.create(srv, name, partitions=2)
    assert srv.exists(meta_key(name)) == 0


def test_schedules_list_prints_no_rule_for_a_schedule_whose_definition_is_gone(
    module_server: RedisProcess, srv: redis.Redis
) -> None:
    """docs/guide/schedules.md: listed as `NAME ... UNREADABLE (no hash)`. cli/schedules.py
    _line formats the placeholder Schedule (_flagged: every_ms 0, kind '') as an interval
    schedule of 0 ms, a rule no schedule can have, beside the flag."""
    q = Queue(srv, "sl")
    q.schedule("gone", "t", every_ms=60_000)
    srv.delete(q.keys.schedule("gone"))
    res = CliRunner().invoke(main, ["schedules", "list", "-q", "sl", "--url", module_server.url])
    assert res.exit_code == 0, res.output
    assert "UNREADABLE (no hash)" in res.output
    assert "every 0 ms" not in res.output, res.output


def test_an_empty_enqueue_many_under_wait_replicas_is_no_timeout_error(
    module_server: RedisProcess, srv: redis.Redis
) -> None:
    """docs/durability.md: on the package's own client path a socket_timeout shorter than the
    wait "still answers NotDurable with the ids, not redis-py's TimeoutError". An empty call
    (a filtered list that came out empty) sends ScriptPipeline([], wait): one command, so
    run_sync's single-call branch sends the WAIT through execute_command (direct_io only
    serves EVALSHA there), read under socket_timeout: TimeoutError (after redis-py's retries,
    each a WAIT again: 4.9 s by default; none here). With a replica it costs a WAIT and a
    durable_mark write for no job."""
    client = redis.Redis(
        unix_socket_path=module_server.socket, socket_timeout=0.05, retry=Retry(NoBackoff(), 0)
    )
    try:
        q = Queue(client, "we", wait_replicas=1, wait_timeout_ms=200)
        try:
            got = q.enqueue_many([])
        except NotDurable as exc:
            got = exc.job_ids
        assert got == []
    finally:
        client.close()


# --- holds --------------------------------------------------------------------------------


def test_a_flagged_schedule_is_listed_in_json_and_removed_then_gone(
    module_server: RedisProcess, srv: redis.Redis
) -> None:
    import json

    q = Queue(srv, "sj")
    q.schedule("gone", "t", every_ms=60_000)
    q.schedule("other", "t", every_ms=60_000)
    srv.delete(q.keys.schedule("gone"))
    srv.delete(q.keys.schedule("other"))
    srv.set(q.keys.schedule("other"), "x")
    url = ["-q", "sj", "--url", module_server.url]
    res = CliRunner().invoke(main, ["schedules", "list", *url, "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r["unreadable"] for r in json.loads(res.output)["schedules"]}
    assert rows == {"gone": "(no hash)", "other": "(not a hash)"}
    for name in ("gone", "other"):
        res = CliRunner().invoke(main, ["schedules", "remove", name, *url, "--json"])
        assert (res.exit_code, json.loads(res.output)["status"]) == (0, "removed")
    res = CliRunner().invoke(main, ["schedules", "remove", "gone", *url])
    assert (res.exit_code, res.output) == (1, "gone: missing\n")
    assert q.list_schedules() == [] and srv.scard(q.keys.schedules) == 0


def test_a_worker_of_plain_names_started_while_redis_is_away_claims_once_it_is_back(
    away: RedisProcess,
) -> None:
    async def go() -> tuple[str, int]:
        client = connect_async(away.url)
        worker = Worker(client, _registry(), WorkerSettings(queues=("pq",), grace_s=0))
        task = asyncio.ensure_future(worker.run(install_signals=False))
        try:
            await asyncio.sleep(0.3)  # a few `queues` retries
            away.start()
            q = Queue(away.client(), "pq")
            jid = q.enqueue("t", None)
            deadline = time.monotonic() + 10  # a liveness bound
            while str(q.status(jid)) != "done" and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            state = str(q.status(jid))
            worker.request_stop()
            return state, await asyncio.wait_for(task, 10)
        finally:
            task.cancel()
            await client.aclose()

    assert asyncio.run(go()) == ("done", 0)


def test_a_stop_asked_while_redis_is_away_at_start_returns_at_once(away: RedisProcess) -> None:
    async def go() -> tuple[int, float]:
        client = connect_async(away.url)
        worker = Worker(client, _registry(), WorkerSettings(queues=("pq",), grace_s=0))
        task = asyncio.ensure_future(worker.run(install_signals=False))
        try:
            await asyncio.sleep(0.2)
            t0 = time.monotonic()
            worker.request_stop()
            code = await asyncio.wait_for(task, 10)
            return code, time.monotonic() - t0
        finally:
            await client.aclose()

    code, took = asyncio.run(go())
    assert code == 0 and took < 2.0, took


def test_a_wait_longer_than_the_socket_timeout_answers_not_durable_and_restores_it(
    module_server: RedisProcess, srv: redis.Redis
) -> None:
    """No replica: WAIT 1 answers 0 after wait_timeout_ms, longer than socket_timeout. The
    enqueue and a re-send (found: no batch wrote, so no durable_mark either) raise NotDurable
    with the id, and the pooled connection keeps its own timeout afterwards."""
    client = redis.Redis(unix_socket_path=module_server.socket, socket_timeout=0.1)
    try:
        q = Queue(client, "wt", wait_replicas=1, wait_timeout_ms=300)
        for _ in range(2):
            with pytest.raises(NotDurable) as caught:
                q.enqueue("t", None, job_id="w1")
            assert (caught.value.job_ids, caught.value.acked) == (["w1"], 0)
        conns = client.connection_pool._available_connections
        assert conns and all(c._sock.gettimeout() == 0.1 for c in conns if c._sock)
    finally:
        client.close()


def test_the_async_wait_read_timeout_is_put_back_after_not_durable(
    module_server: RedisProcess, srv: redis.Redis
) -> None:
    async def go() -> list[float | None]:
        client = aredis.Redis(unix_socket_path=module_server.socket, socket_timeout=0.1)
        try:
            aq = AsyncQueue(client, "wta", wait_replicas=1, wait_timeout_ms=300)
            for _ in range(2):  # written, then found (a re-send)
                with pytest.raises(NotDurable) as caught:
                    await aq.enqueue("t", None, job_id="a1")
                assert (caught.value.job_ids, caught.value.acked) == (["a1"], 0)
            return [c.socket_timeout for c in client.connection_pool._available_connections]
        finally:
            await client.aclose()

    timeouts = asyncio.run(go())
    assert timeouts and set(timeouts) == {0.1}


def test_a_rate_key_lets_no_job_run_before_its_window_without_a_step(srv: redis.Redis) -> None:
    """The normal case of flow_rate_due with flow_rate_ahead: 1 per second, a backlog of 3 of
    one key and a higher-priority one of another key set aside: each runs at its window only,
    the key's jobs in priority order."""
    q = Queue(srv, "fnorm", _clock="test")
    clock = q.keys.test_clock
    srv.set(clock, T0)
    r: dict[str, Any] = {"rate_limit": (1, SEC), "rate_key": "r"}
    for i, p in enumerate((0, 0, 5, 0)):
        q.enqueue("t", i, job_id=f"j{i}", priority=p, **r)
    ran: list[tuple[int, list[str]]] = []
    for at in (0, SEC - 1, SEC, 2 * SEC - 1, 2 * SEC, 3 * SEC, 3 * SEC + 1):
        srv.set(clock, T0 + at)
        got = _run(q)
        if got:
            ran.append((at, got))
    assert ran == [(0, ["j2"]), (SEC, ["j0"]), (2 * SEC, ["j1"]), (3 * SEC, ["j3"])]
