"""What a partitioned queue's calls over every partition report when run_answering asks a
partition once more after a slot move: its first attempt's reply was lost with its node's whole
call (the driver followed one partition's MOVED to a node that did not answer), so that attempt
may have run, and a change asked again answers as if made before ('already', 'active').
Own cluster for the module (~8 s)."""

from __future__ import annotations

import asyncio
import errno
import json
import socket
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from redis.backoff import NoBackoff
from redis.connection import AbstractConnection
from redis.retry import Retry

from scheduler import AsyncPartitionedQueue
from scheduler._spawn_cluster import LocalCluster
from scheduler.cli import common as cli_common
from scheduler.cli import job_cancel
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core import cluster_io
from scheduler.core.connection import connect, connect_async, is_cluster
from scheduler.core.partitions import meta_key
from tests.fixtures.slot_move import SlotMove
from tests.redis_server import RedisProcess, require_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(require_server("a local Redis Cluster"), node_timeout_ms=1000) as cluster:
        yield cluster


def _name(cluster: LocalCluster, prefix: str) -> str:
    """A queue name whose partition record is on node 0."""
    return next(
        f"{prefix}{i}"
        for i in range(200)
        if cluster.primary_for(meta_key(f"{prefix}{i}")).port == cluster.nodes[0].port
    )


class _OnceDown:
    """The first send of a command of the moved partition (its keys' `prefix`) to its new node
    (`port`: the driver following its MOVED) fails as a node that does not answer; the next
    ones go through: a node back by the time the call asks again."""

    def __init__(self, moved: tuple[str, int], scripts_only: bool = False) -> None:
        (self.prefix, self.port), self.failed = moved, 0
        # pause / resume check every partition first with plain commands: the loss is
        # the change's (its script's), the call this module is about
        self.scripts_only = scripts_only

    def fail(self, port: int, cmds: Iterable[Sequence[Any]]) -> None:
        cmds = list(cmds)
        if self.scripts_only and not any(str(c[0]).upper().startswith("EVAL") for c in cmds):
            return
        args = [a.decode() if isinstance(a, bytes) else str(a) for c in cmds for a in c]
        if not self.failed and port == self.port and any(self.prefix in a for a in args):
            self.failed += 1
            raise redis.ConnectionError("injected: the slot's new node not answering")


class _Conn:
    """A node's blocking client whose pipelines call `down` with their commands first."""

    def __init__(self, real: Any, port: int, down: _OnceDown) -> None:
        self.real, self.port, self.down = real, port, down

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def pipeline(self, **kwargs: Any) -> Any:
        pipe = self.real.pipeline(**kwargs)
        execute = pipe.execute

        def checked(**kw: Any) -> Any:
            self.down.fail(self.port, (args for args, _ in pipe.command_stack))
            return execute(**kw)

        pipe.execute = checked
        return pipe


def _inject(monkeypatch: pytest.MonkeyPatch, rc: Any, down: _OnceDown) -> None:
    """`down` before each node's send: the blocking client's pipelines, the asyncio path's
    per-node pipeline (cluster_io)."""
    if isinstance(rc, redis.RedisCluster):
        real = rc.get_redis_connection
        monkeypatch.setattr(
            rc, "get_redis_connection", lambda node: _Conn(real(node), int(node.port), down)
        )
    else:
        node_async = cluster_io._node_async

        async def send(node: Any, items: Any, loads: Any) -> Any:
            down.fail(int(node.port), (cmd for _, _, cmd in items))
            return await node_async(node, items, loads)

        monkeypatch.setattr(cluster_io, "_node_async", send)


def _set_up(cluster: LocalCluster, prefix: str, verb: str) -> str:
    """A 12-partition queue; every partition already `verb`ed (paused / resumed) but node 0's
    other partitions, the ones this call changes (not the first of node 0's, moved by
    _move). Its name."""
    name = _name(cluster, prefix)
    with PartitionedQueue.create(connect(cluster.url), name, partitions=12) as pq:
        port = {p.name: cluster.primary_for(p.keys.prefix).port for p in pq.parts}
        mine = [p for p in pq.parts if port[p.name] == cluster.nodes[0].port]
        first, changed = mine[0], [p.name for p in mine[1:]]
        assert changed, "node 0 holds a single partition"
        for p in pq.parts:
            p.pause()
        for p in pq.parts:  # resume: all but those; pause: those (it paused them before)
            if (verb == "resume") != (p.name in changed):
                p.resume()
        assert first.name not in changed
        return name


def _move(cluster: LocalCluster, name: str) -> tuple[str, int]:
    """The first of node 0's partitions moved to another primary behind the clients' backs:
    its keys' prefix, the port of its new node."""
    with PartitionedQueue.open(connect(cluster.url), name) as pq:
        first = next(
            p for p in pq.parts if cluster.primary_for(p.keys.prefix).port == cluster.nodes[0].port
        )
        move = SlotMove(connect(cluster.url), first.keys.prefix)
        move.split()
        move.migrate(batch=100)
        move.finish()
        return first.keys.prefix, int(move.target.port)


@pytest.mark.parametrize(("verb", "changed_word"), [("pause", "paused"), ("resume", "resumed")])
def test_a_change_asked_again_after_its_reply_was_lost_reports_the_change(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, verb: str, changed_word: str
) -> None:
    """Node 0's other partitions took the change in the first attempt (their replies lost
    with the call the moved partition's new node failed); asked again they answer 'already'
    ('active'), and every other partition was so before the call. The call reported
    'already' ('active'): that it changed nothing, although it paused (resumed) them."""
    name = _set_up(cluster, f"ro{verb[0]}", verb)
    pq = PartitionedQueue.open(connect(cluster.url), name)
    pq.run_answering(lambda p: p.ops.counts())  # its slot map read, then stale
    _inject(monkeypatch, pq.client, down := _OnceDown(_move(cluster, name), scripts_only=True))
    try:
        assert getattr(pq, verb)() == changed_word
        assert down.failed == 1  # the first attempt did lose its reply
        state = {p.name: p.counts().paused for p in pq.parts}
        assert all(state.values()) if verb == "pause" else not any(state.values())
    finally:
        pq.close()


@pytest.mark.parametrize(("verb", "changed_word"), [("pause", "paused"), ("resume", "resumed")])
def test_asyncio_a_change_asked_again_after_its_reply_was_lost_reports_the_change(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, verb: str, changed_word: str
) -> None:
    """The same for AsyncPartitionedQueue."""
    name = _set_up(cluster, f"ra{verb[0]}", verb)

    async def run() -> tuple[str, int]:
        aq = await AsyncPartitionedQueue.open(connect_async(cluster.url), name)
        try:
            await aq.run_answering(lambda p: p.ops.counts())  # its slot map read
            down = _OnceDown(_move(cluster, name), scripts_only=True)
            _inject(monkeypatch, aq.client, down)
            return await getattr(aq, verb)(), down.failed
        finally:
            await aq.aclose()

    assert asyncio.run(run()) == (changed_word, 1)


# -- `scheduler jobs cancel <id>...`: a cancel whose node stopped answering, sent or not ---------


class _Socket:
    """The socket under redis-py, as the CLI's client (`rc`) meets it at the next cancel built:
    `lost`: that cancel's reply is read (it ran), then lost as a read timeout; else the
    partition's connections are dropped first, so the cancel connects again. From then on,
    connecting fails as `error` (a refusal, a timeout) until `refusing` is set back."""

    def __init__(self, error: type[OSError], lost: bool) -> None:
        self.error, self.lost = error, lost
        self.armed = self.refusing = False
        self.refused = 0

    def install(self, monkeypatch: pytest.MonkeyPatch, rc: Any) -> None:
        real_op, real_read = job_cancel._cancel_op, AbstractConnection.read_response
        me = self

        def cancel_op(q: Any, ids: Any) -> Any:
            if me.lost:
                me.armed = True
            else:
                me.refusing = True
                node = rc.get_node_from_key(q.keys.prefix) if is_cluster(rc) else None
                (rc.get_redis_connection(node) if node else rc).connection_pool.disconnect()
            return real_op(q, ids)

        def read_response(conn: Any, *args: Any, **kwargs: Any) -> Any:
            reply = real_read(conn, *args, **kwargs)
            if me.armed:
                me.armed, me.refusing = False, True
                raise redis.TimeoutError("Timeout reading from socket")
            return reply

        def refusing(real: Any) -> Any:
            def _connect(conn: Any) -> Any:  # the name redis-py's own connect has
                if me.refusing:
                    me.refused += 1
                    raise me.error(errno.ECONNREFUSED, "Connection refused")
                return real(conn)

            return _connect

        monkeypatch.setattr(job_cancel, "_cancel_op", cancel_op)
        monkeypatch.setattr(AbstractConnection, "read_response", read_response)
        for cls in (redis.connection.Connection, redis.connection.UnixDomainSocketConnection):
            monkeypatch.setattr(cls, "_connect", refusing(cls._connect))


def _cancel(
    monkeypatch: pytest.MonkeyPatch, sock: _Socket, args: list[str], **client_kwargs: Any
) -> dict[str, Any]:
    """`scheduler jobs cancel ... --json` with `sock` under its client (made with
    `client_kwargs` when given, as redis-py's own from_url): its JSON; exit 3 asserted."""
    real_connect = cli_common.connect

    def connected(url: str) -> Any:
        client = (
            redis.Redis.from_url(url, decode_responses=True, **client_kwargs)
            if client_kwargs
            else real_connect(url)
        )
        sock.install(monkeypatch, client)
        return client

    monkeypatch.setattr(job_cancel, "connect", connected)
    try:
        res = CliRunner().invoke(main, ["jobs", "cancel", *args, "--json"])
    finally:
        sock.refusing = False
    assert res.exit_code == 3, res.output
    assert sock.refused > 0, res.output  # it did try to connect
    return dict(json.loads(res.stdout))


def _holders(listed: list[str]) -> list[str]:
    return sorted(s.split("which holds job ")[1].split(",")[0] for s in listed)


def _two_jobs(pq: PartitionedQueue, k: int) -> tuple[str, str]:
    """Jobs a then b, scheduled, in partition k (its scripts loaded: a lost reply is the
    cancel's, not a SCRIPT LOAD's)."""
    keys = [key for key in (f"k{i}" for i in range(300)) if pq.layout.partition_of_key(key) == k]
    a, b = (pq.enqueue("t", None, key=key, delay_ms=3_600_000) for key in keys[:2])
    pq.parts[k].preload()
    return a, b


@pytest.fixture
def one_server(module_server: RedisProcess) -> Iterator[tuple[PartitionedQueue, str, str]]:
    """A 2-partition queue 'rt' on a private server, jobs a, b in partition 0."""
    client = connect(module_server.url)
    client.flushall()
    pq = PartitionedQueue.create(client, "rt", partitions=2)
    yield pq, *_two_jobs(pq, 0)
    pq.close()


ERRORS = pytest.mark.parametrize(
    "error", [ConnectionRefusedError, socket.timeout], ids=["refused", "timeout"]
)


def test_a_cancel_that_could_not_connect_to_its_server_is_not_cancelled(
    one_server: tuple[PartitionedQueue, str, str],
    module_server: RedisProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CLI's client makes one attempt: a cancel that could not connect was never sent:
    'not cancelled', decided from the socket's error under redis-py's (its words are not
    read). Refused only: this server's Unix socket timing out while connecting raises
    redis-py 8's own AttributeError (its error count reads the connection's `port`)."""
    pq, a, b = one_server
    args = [a, b, "-q", "rt", "--url", module_server.url]
    data = _cancel(monkeypatch, _Socket(ConnectionRefusedError, lost=False), args)
    assert "unknown" not in data, data
    assert _holders(data["unreachable"]) == sorted([a, b])
    assert pq.status(a) == pq.status(b) == "scheduled"


def test_a_cancel_sent_before_a_retry_that_could_not_connect_is_unknown(
    one_server: tuple[PartitionedQueue, str, str],
    module_server: RedisProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client that retries (a Retry of its own): the cancel of a ran, its reply was lost (a
    read timeout), redis-py sent it again, and that attempt could not connect. The error
    raised is the last attempt's, 'Error 111 connecting to ...', which read as 'never sent':
    'not cancelled' although a is cancelled. It is unknown (it may have run)."""
    pq, a, b = one_server
    args = [a, b, "-q", "rt", "--url", module_server.url]
    retry = Retry(NoBackoff(), 2)
    data = _cancel(monkeypatch, _Socket(ConnectionRefusedError, lost=True), args, retry=retry)
    assert pq.status(a) == "cancelled"  # it ran
    assert pq.status(b) == "scheduled"  # never sent
    assert _holders(data["unknown"]) == [a], data
    assert _holders(data["unreachable"]) == [b], data


@ERRORS
def test_a_cancel_that_could_not_connect_to_a_cluster_node_is_not_cancelled(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, error: type[OSError]
) -> None:
    """The same on a cluster (TCP), refused or timing out while connecting: the node clients
    the driver sends on make one attempt."""
    name = _name(cluster, f"rc{error.__name__[:3]}")
    pq = PartitionedQueue.create(connect(cluster.url), name, partitions=3)
    a, b = _two_jobs(pq, 1)
    data = _cancel(
        monkeypatch, _Socket(error, lost=False), [a, b, "-q", name, "--url", cluster.url]
    )
    assert "unknown" not in data, data
    assert _holders(data["unreachable"]) == sorted([a, b])
    assert pq.status(a) == pq.status(b) == "scheduled"
    pq.close()


# -- an ASK during a slot migration, its target node down ----------------------------------


@pytest.fixture(scope="module")
def cluster_to_kill() -> Iterator[LocalCluster]:
    """Its own: a node is killed (its replica too: no failover), the others' slots served."""
    with LocalCluster(require_server("a local Redis Cluster"), node_timeout_ms=1000) as cluster:
        for node in cluster.nodes:
            with cluster.node_client(node) as c:
                c.config_set("cluster-require-full-coverage", "no")
        yield cluster


def test_an_ask_to_a_node_down_leaves_out_the_migrating_partition_only(
    cluster_to_kill: LocalCluster,
) -> None:
    """A partition's slot is being migrated from node 0 (every key moved, the move not ended:
    node 0 answers ASK) to a node that is then killed. Node 0's call raised whole when the
    driver followed the ASK, and the slot map did not change, so node 0's other partitions
    were reported unread as well, though node 0 answers them. Only the migrating partition
    and the killed node's own are left out now, in either client."""
    cluster = cluster_to_kill
    name = _name(cluster, "ask")
    pq = PartitionedQueue.create(connect(cluster.url), name, partitions=12)
    for p in pq.parts:
        p.enqueue("t", None)
    port = {p.name: cluster.primary_for(p.keys.prefix).port for p in pq.parts}
    first = next(p for p in pq.parts if port[p.name] == cluster.nodes[0].port)
    loop = asyncio.new_event_loop()
    try:
        aq = loop.run_until_complete(AsyncPartitionedQueue.open(connect_async(cluster.url), name))
        loop.run_until_complete(aq.run_answering(lambda p: p.ops.counts()))  # its slot map
        move = SlotMove(connect(cluster.url), first.keys.prefix)
        move.split()
        move.migrate(batch=100)  # not finished: node 0 still holds the slot, answering ASK
        target = next(n for n in cluster.nodes if n.port == int(move.target.port))
        cluster.nodes[cluster.nodes.index(target) + cluster.primaries].kill()
        target.kill()
        lost = {p.name for p in pq.parts if port[p.name] == target.port} | {first.name}
        for each in (
            pq.run_answering(lambda p: p.ops.counts()),
            loop.run_until_complete(aq.run_answering(lambda p: p.ops.counts())),
        ):
            got = dict(zip((p.name for p in pq.parts), each, strict=True))
            failed = {n for n, r in got.items() if isinstance(r, BaseException)}
            assert failed == lost, (sorted(failed), sorted(lost))
            assert all(got[n].due == 1 for n in got if n not in lost)
        loop.run_until_complete(aq.aclose())
    finally:
        loop.close()
        pq.close()
