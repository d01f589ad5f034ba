"""Rolling deploys: this version beside the release of two sessions ago (285b023), one queue,
as while workers are upgraded one at a time. The older tree is a git worktree whose code runs in
subprocesses (PYTHONPATH=<worktree>), each with its own Lua scripts (a client loads its own).
Checked: jobs either side writes (every enqueue option) are claimed and settled by the other;
both versions' workers on one queue run every job once per attempt, none before its run time
and no key past its concurrency limit; this version's CLI reads and `doctor --fix` leave the
older worker's leases alone. docs/guide/workers.md "Upgrading" names the supported window."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.cli.main import main
from scheduler.core.backoff import Backoff
from tests.conftest import delete_queue
from tests.old_tree import old_worktree
from tests.workers.procs import stop_all, wait_for

ROOT = Path(__file__).resolve().parent.parent
OLD_REV = "285b023"

# A registry both versions import (written into a temp dir): each start and end is logged with
# the server's time, the worker's version and its attempt.
REGISTRY = """
import json, os, time
import redis
from scheduler.worker.registry import Registry

registry = Registry()
_c = redis.Redis.from_url(os.environ["TEST_REDIS_URL"], decode_responses=True)


def mark(ctx, what):
    sec, usec = _c.time()
    entry = {"id": ctx.job_id, "attempt": ctx.attempt, "what": what, "ver": os.environ["VER"],
             "t": int(sec) * 1000 + int(usec) // 1000}
    _c.rpush("rolling:ledger:" + ctx.queue, json.dumps(entry))


@registry.task(name="work")
def work(payload, ctx):
    mark(ctx, "start")
    time.sleep(payload.get("s", 0))
    if payload.get("fail_until", 0) >= ctx.attempt:
        raise RuntimeError("planned")
    mark(ctx, "end")
    return payload.get("i")
"""


@pytest.fixture(scope="module")
def old_tree() -> Iterator[Path]:
    with old_worktree(OLD_REV, "rolling-old-") as where:
        yield where


@pytest.fixture
def reg_dir(tmp_path: Path) -> Path:
    (tmp_path / "rolling_reg.py").write_text(REGISTRY)
    return tmp_path


def run_old(tree: Path, url: str, code: str) -> Any:
    """`code` run by the older tree (its stdout's last line, JSON)."""
    env = dict(os.environ, PYTHONPATH=str(tree), U=url)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def spawn(tree: Path, reg: Path, url: str, queue: str, ver: str, log: Path) -> Any:
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{reg}", TEST_REDIS_URL=url, VER=ver)
    start = "from scheduler.cli.main import main; main()"
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", start, "worker", "rolling_reg:registry", "--url", url,
             "--queue", queue, "--json-logs", "--concurrency", "4"],
            cwd=tree, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
        )  # fmt: skip


def server_ms(client: redis.Redis) -> int:
    sec, usec = client.time()
    return int(sec) * 1000 + int(usec) // 1000


# Every option a producer has, as (name, enqueue keywords); the older Queue takes them all.
OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("plain", {}),
    ("budget", {"max_attempts": 2, "timeout_ms": 5_000}),
    ("ttl", {"result_ttl_ms": 60_000}),
    ("keep", {"keep_payload": True}),
    ("priority", {"priority": 5}),
    ("key", {"concurrency_key": "k1", "concurrency_limit": 1}),
    ("key2", {"concurrency_key": "k1", "concurrency_limit": 1}),
    ("rate", {"rate_limit": (1, 3_600_000), "rate_key": "r1"}),
    ("rate2", {"rate_limit": (1, 3_600_000), "rate_key": "r1"}),
    ("window", {"start_within_ms": 3_600_000, "keep_payload": True}),
    ("late", {"start_within_ms": 1}),
    ("debounced", {"key": "d1", "debounce": True}),
    ("fails", {"max_attempts": 1}),
]

# Claims (and settles: 'fails' fails for good, the others complete) every due job, by rounds.
CLAIMER = """
    import json, os, time
    from scheduler import Queue
    from scheduler.core.connection import connect
    q = Queue(connect(os.environ['U']), os.environ['Q'])
    seen = {}
    for _ in range(4):
        for j in q.claim('w-' + os.environ['VER'], limit=50).jobs:
            seen[j.id] = [j.task, j.payload(), j.max_attempts, j.timeout_ms, j.start_by_ms]
            if j.payload()['name'] == 'fails':
                q.fail(j.id, j.token, ('E', 'planned', ''), retryable=False)
            else:
                q.complete(j.id, j.token, j.payload()['name'])
        time.sleep(0.1)
    print(json.dumps(seen))
"""

WRITER = """
    import json, os
    from scheduler import Queue
    from scheduler.core.connection import connect
    q = Queue(connect(os.environ['U']), os.environ['Q'])
    ids = {}
    for name, kw in json.loads(os.environ['OPTIONS']):
        if 'rate_limit' in kw:
            kw['rate_limit'] = tuple(kw['rate_limit'])
        ids[name] = q.enqueue('work', {'name': name, 'n': 1}, **kw)
    ids['debounced'] = q.enqueue('work', {'name': 'debounced', 'n': 2}, key='d1', debounce=True)
    ids['child'] = q.enqueue('work', {'name': 'child'}, after=[ids['plain']])
    print(json.dumps(ids))
"""


def _write_new(q: Queue) -> dict[str, str]:
    ids = {name: q.enqueue("work", {"name": name, "n": 1}, **kw) for name, kw in OPTIONS}
    ids["debounced"] = q.enqueue("work", {"name": "debounced", "n": 2}, key="d1", debounce=True)
    ids["child"] = q.enqueue("work", {"name": "child"}, after=[ids["plain"]])
    return ids


def _claim_new(q: Queue) -> dict[str, list[Any]]:
    seen: dict[str, list[Any]] = {}
    for _ in range(4):
        for j in q.claim("w-new", limit=50).jobs:
            seen[j.id] = [j.task, j.payload(), j.max_attempts, j.timeout_ms, j.start_by_ms]
            if j.payload()["name"] == "fails":
                q.fail(j.id, j.token, ("E", "planned", ""), retryable=False)
            else:
                q.complete(j.id, j.token, j.payload()["name"])
        time.sleep(0.1)
    return seen


@pytest.mark.parametrize("writer", ["new", "old"])
def test_jobs_either_version_writes_are_run_by_the_other(
    old_tree: Path, client: redis.Redis, redis_url: str, queue_name: str, writer: str
) -> None:
    q = Queue(client, queue_name)
    os.environ.update(Q=queue_name, OPTIONS=json.dumps(OPTIONS), VER="old")
    try:
        if writer == "new":
            ids = _write_new(q)
            time.sleep(0.01)  # 'late' is past its 1 ms window
            seen = run_old(old_tree, redis_url, CLAIMER)
        else:
            ids = run_old(old_tree, redis_url, WRITER)
            time.sleep(0.01)
            seen = _claim_new(q)
    finally:
        for name in ("Q", "OPTIONS", "VER"):
            os.environ.pop(name, None)
    by_name = {v[1]["name"]: v for v in seen.values()}
    ran = {"plain", "budget", "ttl", "keep", "priority", "key", "rate", "window", "debounced"}
    ran |= {"fails", "child", "key2"}  # the child and key2 once plain and key are done
    assert set(by_name) == ran, by_name
    assert by_name["budget"][2:4] == [2, 5_000]
    assert by_name["debounced"][1]["n"] == 2  # the later call's payload, one job
    assert by_name["window"][4] is not None and by_name["plain"][4] is None
    state = {name: q.status(jid).value for name, jid in ids.items()}
    assert state == {**dict.fromkeys(ran, "done"), "fails": "dead", "late": "dead",
                     "rate2": "held"}  # fmt: skip
    assert q.get_job(ids["late"]).fields.get("dead_reason") == "start deadline passed"
    assert q.get_job(ids["keep"]).payload() == {"name": "keep", "n": 1}
    assert q.get_job(ids["window"]).payload() == {"name": "window", "n": 1}
    assert q.get_job(ids["plain"]).payload_json == ""  # lean once done
    assert 0 < client.pttl(q.keys.job(ids["ttl"])) <= 60_000
    delete_queue(client, q)


def test_old_and_new_workers_share_one_queue(
    old_tree: Path, client: redis.Redis, redis_url: str, queue_name: str, reg_dir: Path
) -> None:
    q = Queue(client, queue_name)
    logs = [reg_dir / "old.log", reg_dir / "new.log"]
    workers = [
        spawn(old_tree, reg_dir, redis_url, queue_name, "old", logs[0]),
        spawn(ROOT, reg_dir, redis_url, queue_name, "new", logs[1]),
    ]
    try:
        wait_for(lambda: client.zcard(q.keys.workers) == 2, 60, "both workers up")
        not_before: dict[str, int] = {}
        ids: list[str] = []
        for i in range(64):
            kind, delay = i % 6, (0, 150, 600)[i % 3]
            kw: dict[str, Any] = {}
            payload: dict[str, Any] = {"i": i, "s": 0.02}
            if kind == 1:
                kw = {"concurrency_key": "ck", "concurrency_limit": 2}
                payload["s"] = 0.06
            elif kind == 2:
                kw = {"priority": 3}
            elif kind == 3 and ids:
                kw = {"after": [ids[-1]]}
            elif kind == 4:
                payload["fail_until"] = 1
                kw = {"backoff": Backoff(50, 2.0, 200, 0.0), "max_attempts": 3}
            elif kind == 5:
                kw = {"start_within_ms": 600_000, "keep_payload": True}
            t0 = server_ms(client)
            jid = q.enqueue("work", payload, delay_ms=delay, **kw)
            not_before[jid] = t0 + delay
            ids.append(jid)
        wait_for(lambda: {q.status(j).value for j in ids} == {"done"}, 90, "every job done")
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                stop_all([w])
    ledger = [json.loads(e) for e in client.lrange(f"rolling:ledger:{queue_name}", 0, -1)]
    starts = [e for e in ledger if e["what"] == "start"]
    keyed = {j for j in ids if q.get_job(j).fields.get("ckey") == "ck"}
    assert {e["ver"] for e in starts} == {"old", "new"}
    attempts = [(e["id"], e["attempt"]) for e in starts]
    assert len(attempts) == len(set(attempts))  # no attempt run twice
    assert {e["id"] for e in starts} == set(ids)
    assert [e for e in starts if e["t"] < not_before[e["id"]]] == []  # none ran early
    running, most = 0, 0  # the key's jobs running at once, by the marks' server times
    for e in sorted((e for e in ledger if e["id"] in keyed), key=lambda e: (e["t"], e["what"])):
        running += 1 if e["what"] == "start" else -1
        most = max(most, running)
    assert most <= 2
    for log in logs:
        text = log.read_text()
        assert "Traceback" not in text and '"level": "error"' not in text, text[-3000:]
    delete_queue(client, q)


def test_this_versions_cli_reads_an_old_workers_leases_and_leaves_them(
    old_tree: Path, client: redis.Redis, redis_url: str, queue_name: str, reg_dir: Path
) -> None:
    q = Queue(client, queue_name)
    ids = [q.enqueue("work", {"i": i, "s": 60}) for i in range(3)]
    ids.append(q.enqueue("work", {"i": 3, "s": 60}, concurrency_key="c", concurrency_limit=1))
    waiting = q.enqueue("work", {"i": 4}, concurrency_key="c", concurrency_limit=1)
    w = spawn(old_tree, reg_dir, redis_url, queue_name, "old", reg_dir / "old.log")
    try:
        wait_for(lambda: client.zcard(q.keys.leased) == 4, 60, "the old worker's leases")
        run = CliRunner().invoke
        url = ["--url", redis_url, "-q", queue_name]
        for args in (["doctor", "--json"], ["doctor", "--fix", "--json"]):
            got = run(main, [*args, *url])
            found = [i for i in json.loads(got.output)["findings"] if i["queue"] == queue_name]
            assert found == [], got.output
        got = run(main, ["jobs", "list", "--state", "leased", "--json", *url])
        assert got.exit_code == 0, got.output
        assert sorted(j["id"] for j in json.loads(got.output)["jobs"]) == sorted(ids)
        assert q.status(waiting).value in ("due", "held")  # its key full: held once claim sees it
        assert q.counts().leased == 4
        got = run(main, ["workers", "--json", "--url", redis_url])
        assert queue_name in got.output, got.output
        assert client.zcard(q.keys.leased) == 4  # nothing taken from the old worker
        assert {q.status(j).value for j in ids} == {"leased"}
    finally:
        w.terminate()
        try:
            w.wait(30)
        except subprocess.TimeoutExpired:
            stop_all([w])
    delete_queue(client, q)
