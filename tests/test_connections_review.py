"""Connections and cluster I/O, from a review (core/connection.py, core/safety.py,
core/cluster_io.py): each test failed on the code it was written against."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from redis.asyncio.cluster import ClusterNode

from scheduler import AsyncQueue, BadArgument, Queue
from scheduler._spawn import RedisProcess
from scheduler.cli.main import main
from scheduler.core import cluster_io
from scheduler.core.connection import connect, parse_url
from scheduler.core.safety import redact
from scheduler.core.scripts import Batch
from tests.redis_server import require_server

ROOT = Path(__file__).resolve().parents[1]
SCHEDULER = str(Path(sys.executable).parent / "scheduler")


def _worker(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCHEDULER, "worker", "tests.workers.basic:registry", "--url", url],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


# -- credentials -------------------------------------------------------------------------------
def test_an_ssl_password_query_argument_is_redacted() -> None:
    """redis-py passes `ssl_password` (the client key's passphrase) from the URL query to the
    TLS connection; redact() only knows `password=` right after `?`/`&`."""
    assert "topsecret" not in redact("rediss://h:6380/0?ssl_keyfile=/k.pem&ssl_password=topsecret")
    with pytest.raises(BadArgument) as info:
        parse_url("rediss+cluster://h:6380/2?ssl_password=topsecret")
    assert "topsecret" not in str(info.value)
    res = CliRunner().invoke(
        main, ["stats", "--url", "rediss+cluster://h:1/3?ssl_password=topsecret"]
    )
    assert res.exit_code == 2 and "topsecret" not in res.output, res.output


@pytest.mark.parametrize("sep", ["/", "#", "?"])
def test_a_password_holding_a_url_delimiter_is_printed_nowhere(sep: str) -> None:
    """A generated password (base64 has '/') pasted into the URL unencoded: the URL is
    malformed, and every message about it quotes the password (redact() stops at the '/')."""
    pw = f"Zq8{sep}s3cret"
    with pytest.raises(BadArgument) as info:
        parse_url(f"redis+cluster://app:{pw}@127.0.0.1:7000/")
    assert "Zq8" not in str(info.value) and "s3cret" not in str(info.value), str(info.value)
    url = f"redis://app:{pw}@127.0.0.1:1/0"
    res = CliRunner().invoke(main, ["stats", "--url", url])
    assert "Zq8" not in res.output and "s3cret" not in res.output, res.output
    out = _worker(url)
    assert "Zq8" not in out.stdout + out.stderr, out.stderr[-500:]


@pytest.mark.parametrize("space", [" ", "\t"])
def test_a_password_holding_whitespace_is_printed_nowhere(space: str) -> None:
    """urlsplit (and so redis-py) takes a space in a password, but redact() read the URL as
    whitespace-separated words: the worker's 'cannot reach Redis at ...' line, the repr of a
    parsed URL and any message quoting it showed the password whole."""
    pw = f"Zq8{space}s3cret"
    for url in (f"redis://app:{pw}@127.0.0.1:1/0", f"unix://app:{pw}@/tmp/no.sock?db=1"):
        shown = redact(f"cannot reach Redis at {url}: refused") + repr(parse_url(url))
        assert "Zq8" not in shown and "s3cret" not in shown, shown
    # A host is never hidden: it ends at its first '/', before any later '@'.
    text = "redis://h:6379/0 for a b@example.com"
    assert redact(text) == text
    out = _worker(f"redis://app:{pw}@127.0.0.1:1/0")
    assert out.returncode == 3 and "cannot reach Redis at" in out.stderr, out.stderr[-500:]
    assert "Zq8" not in out.stdout + out.stderr, out.stderr[-500:]


# -- malformed URLs: BadArgument at the boundary ----------------------------------------------
BAD_URLS = [
    "redis://127.0.0.1:notaport/0",  # ValueError from urllib
    "redis://127.0.0.1:1/one",  # accepted: redis-py silently uses db 0
    "redis://127.0.0.1:1/0?socket_timeout=soon",  # ValueError from redis-py
    "redis://127.0.0.1:1/0?max_conections=500",  # accepted; TypeError at the first command
    "redis://127.0.0.1:1/0?protocol=9",  # accepted; ConnectionError at the first command
    "redis+cluster://127.0.0.1:1/?max_conections=500",  # sync: 'unreachable'; async: TypeError
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_malformed_url_is_bad_argument_at_from_url(url: str) -> None:
    with pytest.raises(BadArgument):
        Queue.from_url(url, "q")

    async def on_asyncio() -> None:
        with pytest.raises(BadArgument):
            await AsyncQueue.from_url(url, "q").aclose()

    asyncio.run(on_asyncio())


def test_the_cli_refuses_a_malformed_url_as_usage() -> None:
    """stats: a TypeError traceback (exit 1); the worker: redis-py's ValueError in a
    'worker crashed' traceback (exit 1), not the usage error (exit 2) parse_url is there for."""
    res = CliRunner().invoke(main, ["stats", "--url", BAD_URLS[3]])
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    out = _worker(BAD_URLS[0])
    assert out.returncode == 2, out.stderr[-500:]


# -- a query option on a blocking RedisCluster ---------------------------------------------------
def _with(url: str, option: str) -> str:
    return url + ("&" if "?" in url else "?") + option


def test_a_cluster_url_option_is_applied_or_refused_never_dropped(cluster_url: str) -> None:
    """redis-py's RedisCluster keeps only the kwargs it knows (cleanup_kwargs): a typo such as
    `max_conections=500` is accepted (the asyncio worker: TypeError), `health_check_interval`
    (honoured by the asyncio client and one server) silently dropped."""
    try:
        rc: Any = connect(_with(cluster_url, "health_check_interval=7"))
    except BadArgument:
        pass
    else:
        try:
            rc.ping()
            seen = {
                n.name: n.redis_connection.connection_pool.connection_kwargs.get(
                    "health_check_interval"
                )
                for n in rc.get_nodes()
            }
        finally:
            rc.close()
        assert set(seen.values()) == {7}, seen
    with pytest.raises(BadArgument):
        connect(_with(cluster_url, "max_conections=500")).close()


# -- cluster I/O: a lost reply on the asyncio path ---------------------------------------------
@pytest.fixture(scope="module")
def tcp_server() -> Iterator[RedisProcess]:
    with RedisProcess(require_server("a TCP server"), tcp=True) as server:
        yield server


class _OneNode:
    """A cluster of one node (cluster_io routes by get_node_from_key only)."""

    def __init__(self, node: ClusterNode) -> None:
        self.node = node

    async def initialize(self) -> None:
        return None

    def get_node_from_key(self, key: str) -> ClusterNode:
        return self.node


def test_asyncio_a_reply_lost_on_a_node_marks_the_topology_stale(tcp_server: RedisProcess) -> None:
    """redis-py's ClusterNode.execute_pipeline stores a read error as the command's result
    instead of raising, so _batch_async neither raises it nor marks the topology stale (the
    blocking path does both): the next batch goes to the same, possibly dead, primary."""
    node = ClusterNode("127.0.0.1", tcp_server.port, socket_timeout=0.2, decode_responses=True)
    rc = _OneNode(node)
    batch = Batch([], [("PING",), ("BLPOP", "review:none", "2")], ["k", "k"])

    async def run() -> None:
        try:
            await cluster_io._batch_async(rc, batch)
        except Exception:  # raising it is fine too (the blocking path does)
            pass
        finally:
            await node.disconnect()

    try:
        asyncio.run(run())
        assert id(rc) in cluster_io._STALE, "a timed-out read did not mark the topology stale"
    finally:
        cluster_io._STALE.discard(id(rc))
