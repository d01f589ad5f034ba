"""Untrusted input: nothing is ever unpickled; a job hash edited to hold a pickle is returned as
text (or parked when it is not even text) and never executed; queue names cannot escape the key
prefix or the hash tag, and every key of a queue maps to one cluster slot."""

from __future__ import annotations

import ast
import json
import os
import pickle
import tempfile
import token
import tokenize
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from scheduler import AsyncQueue, BadArgument, Queue
from scheduler.core.keys import QueueKeys
from tests.conftest import dump_queue
from tests.faults.conftest import Server

PACKAGE = Path(__file__).resolve().parents[2] / "scheduler"
LUA = Path(__file__).resolve().parents[2] / "lua"
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle",
                  "jsonpickle", "joblib"}  # fmt: skip


def test_no_module_of_the_package_can_unpickle_or_eval() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 5
    for path in modules:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[0]}
            else:
                names = set()
            assert not names & UNSAFE_MODULES, f"{path.name} imports {names & UNSAFE_MODULES}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("eval", "exec"), f"{path.name} calls {node.func.id}"
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("unsafe_load", "full_load"), path.name
        with path.open("rb") as f:  # the word as code, not in comments or docstrings
            names = {t.string for t in tokenize.tokenize(f.readline) if t.type == token.NAME}
        assert not names & UNSAFE_MODULES, f"{path.name} uses {names & UNSAFE_MODULES}"
    for script in LUA.rglob("*.lua"):
        text = script.read_text()
        assert "loadstring" not in text and "cmsgpack" not in text, script.name


class Trap:
    """Unpickling this creates a directory: proof that something deserialised it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[[str], None], tuple[str]]:
        return (os.mkdir, (self.marker,))


@pytest.fixture
def marker() -> str:
    return os.path.join(tempfile.mkdtemp(prefix="trap"), "unpickled")


def test_a_text_pickle_in_a_job_hash_is_returned_raw_never_executed(
    q: Queue, client: redis.Redis, marker: str
) -> None:
    jid = q.enqueue("t", {"ok": 1})
    crafted = pickle.dumps(Trap(marker), protocol=0).decode("ascii")
    client.hset(q.keys.job(jid), "payload", crafted)
    (job,) = q.claim("w", limit=1).jobs
    assert job.id == jid and job.payload_json == crafted
    with pytest.raises(json.JSONDecodeError):
        job.payload()
    with pytest.raises(json.JSONDecodeError):
        q.get_job(jid).payload()
    assert not os.path.exists(marker)


def test_a_binary_pickle_in_a_job_hash_is_parked_not_served(
    q: Queue, client: redis.Redis, marker: str
) -> None:
    """Not UTF-8 text: a decoding client could not read the claim reply at all, and every job
    claimed in the same batch would be stuck until its lease lapsed. The claim parks it."""
    bad = q.enqueue("t", {"n": 1})
    good = q.enqueue("t", {"n": 2})
    raw = redis.Redis(connection_pool=redis.ConnectionPool.from_url(_url(client)))
    raw.hset(q.keys.job(bad), "payload", pickle.dumps(Trap(marker), protocol=5))
    batch = q.claim("w", limit=10)
    assert [j.id for j in batch.jobs] == [good]
    assert batch.jobs[0].payload() == {"n": 2}
    fields = raw.hgetall(q.keys.job(bad))
    assert fields[b"state"] == b"dead" and fields[b"dead_reason"].startswith(b"invalid job")
    assert raw.zrange(q.keys.dead, 0, -1) == [bad.encode()]
    assert not os.path.exists(marker)


@pytest.mark.parametrize(
    "text",
    ["\u00e9t\u00e9 \u2603 \U0001f600", "\x00\x7f", "\u07ff\u0800\uffff\U00010000\U0010ffff"],
)
def test_any_utf8_payload_is_served(q: Queue, text: str) -> None:
    jid = q.enqueue("t", {"s": text})
    (job,) = q.claim("w", limit=1).jobs
    assert job.id == jid and job.payload() == {"s": text}


@pytest.mark.parametrize(
    "raw_bytes",
    [b"\xc3(", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\xff",
     b"\xe0\xc3\xa9\xa0\x80", b"\"ok\xf0\x9f\x98\""],
)  # fmt: skip
def test_invalid_utf8_payloads_are_parked(q: Queue, client: redis.Redis, raw_bytes: bytes) -> None:
    with pytest.raises(UnicodeDecodeError):
        raw_bytes.decode("utf-8")
    jid = q.enqueue("t", None)
    raw = redis.Redis(connection_pool=redis.ConnectionPool.from_url(_url(client)))
    raw.hset(q.keys.job(jid), "payload", raw_bytes)
    assert q.claim("w", limit=1).jobs == []
    assert raw.hget(q.keys.job(jid), "state") == b"dead"


def _url(client: redis.Redis) -> str:
    kw = client.connection_pool.connection_kwargs
    if kw.get("path"):
        return f"unix://{kw['path']}"
    return f"redis://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"


UNSAFE_NAMES = ["", "a{b", "a}b", "{a}", "a:b", "a b", "a*", "a?b", "a\nb", "a\x00b", "é",
                "x" * 65, "a/b", "a\\b", "sched:{x}"]  # fmt: skip


@pytest.mark.parametrize("name", UNSAFE_NAMES)
def test_unsafe_queue_names_are_refused_everywhere(client: redis.Redis, name: str) -> None:
    with pytest.raises(BadArgument):
        Queue(client, name)
    with pytest.raises(BadArgument):
        AsyncQueue(client, name)  # type: ignore[arg-type]
    with pytest.raises(BadArgument):
        Queue.from_url("redis://localhost:1/0", name)


@pytest.mark.parametrize("job_id", ["a{b}", "}", "a b", "a*b", "", "x" * 129])
def test_unsafe_job_ids_are_refused_and_change_nothing(
    q: Queue, client: redis.Redis, job_id: str
) -> None:
    q.enqueue("t", None)
    before = dump_queue(client, q)
    with pytest.raises(BadArgument):
        q.enqueue("t", None, job_id=job_id)
    with pytest.raises(BadArgument):
        q.cancel(job_id)
    assert dump_queue(client, q) == before


def test_every_key_of_a_queue_maps_to_one_slot(q: Queue, client: redis.Redis) -> None:
    tag_slot = key_slot(b"{" + q.name.encode() + b"}")
    a = q.enqueue("t", {"a": 1}, key="} {evil} :*")
    q.enqueue("t", None, delay_ms=60_000, job_id="id:with:colons")
    b = q.enqueue("t", None, max_attempts=1)
    batch = q.claim("w{x}", limit=2)
    tokens = {j.id: j.token for j in batch.jobs}
    q.complete(a, tokens[a], {"r": 1})
    q.fail(b, tokens[b], ("E", "m", ""))
    stored = list(client.scan_iter(match=q.keys.pattern()))
    assert len(stored) >= 5
    k = QueueKeys(q.name)
    built = [k.due, k.leased, k.dead, k.wake, k.job("}{"), k.idem("x"), k.stats(1),
             k.schedule("{s}"), k.schedules, k.workers, k.worker("w}{x"), k.test_clock]  # fmt: skip
    for key in stored + built:
        assert key.startswith(k.prefix), key
        assert key_slot(key.encode()) == tag_slot, key


def test_faults_run_on_their_own_servers(start_server: Callable[..., Server]) -> None:
    """The shared server on 6379 is never used: every fixture here is a private process."""
    server = start_server()
    assert server.admin().config_get("port")["port"] == "0"
