"""Rolling deploys, more: a stopping worker whose outcomes a newer version refuses, the
storage-generation guard's exempt scripts, and `scheduler workers` naming a worker that cannot
hear a stop (docs/guide/workers.md, "The supported mixed-version window")."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import redis
from click.testing import CliRunner
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler.cli.main import main
from scheduler.core.keys import STORAGE_GENERATION
from scheduler.core.scripts import lua_dir
from scheduler.dashboard import Auth, create_app
from tests.test_rolling_deploy_stop import _old_beat
from tests.test_storage_generation import UNGUARDED
from tests.workers.procs import spawn_worker, stop_all, wait_for

NEWER = str(STORAGE_GENERATION + 1)


def test_outcomes_a_newer_version_refuses_are_given_up_at_stop(
    client: redis.Redis, redis_url: str, q: Queue, tmp_path: Path
) -> None:
    # Before: a complete refused with NewerStorage (the queue taken over by a newer version
    # while the job ran) was sent again until the settle bound, then 'could not be reported'.
    log = tmp_path / "worker.log"
    w = spawn_worker(redis_url, q.name, log=str(log))
    try:
        gate = tmp_path / "gate"
        job = q.enqueue("sync_sleep", {"s": 60, "until": str(gate)})
        wait_for(lambda: client.zscore(q.keys.leased, job) is not None, what="the job leased")
        client.hset(q.keys.config, "generation", NEWER)
        began = time.monotonic()
        w.send_signal(signal.SIGTERM)
        wait_for(lambda: "signal 15" in log.read_text(), what="the stop begun")
        gate.touch()  # the job ends in the grace: its complete is refused
        assert w.wait(timeout=60) == 0
        print(f"stop took {time.monotonic() - began:.2f} s")  # a figure, not asserted
    finally:
        stop_all([w])
    lines = [json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith("{")]
    msgs = [m["msg"] for m in lines]
    given = [m for m in msgs if "newer version" in m and "given up" in m]
    assert len(given) == 1, msgs
    assert "1 outcome" in given[0] and "again (at-least-once)" in given[0], given
    assert not [m for m in msgs if "could not be reported before exit" in m], msgs
    assert client.zscore(q.keys.leased, job) is not None  # its lease lapses; nothing written


def test_every_exempt_script_is_really_unguarded() -> None:
    # The exempt list named `counts` after 912ccd9 guarded it: a guard removed from it again
    # would have passed unseen.
    for name in sorted(UNGUARDED):
        text = (lua_dir() / f"{name}.lua").read_text()
        assert "newer_storage_err" not in text, f"{name}.lua is guarded: drop it from UNGUARDED"


def _plain(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_workers_listing_marks_a_worker_that_cannot_hear_a_stop(
    client: redis.Redis, redis_url: str, q: Queue
) -> None:
    _old_beat(client, q, "old-1")
    client.hset(q.keys.worker("new-1"), mapping={"host": "h", "pid": "1", "stopping": ""})
    client.zadd(q.keys.workers, {"new-1": int(client.time()[0]) * 1000})
    got = CliRunner().invoke(main, ["workers", "--json", "--url", redis_url, "-q", q.name])
    assert got.exit_code == 0, got.output
    hears = {w["id"]: w["hears_stop"] for w in json.loads(got.output)["workers"]}
    assert hears == {"old-1": False, "new-1": True}
    for width in ("200", "80"):
        got = CliRunner().invoke(
            main, ["workers", "--url", redis_url, "-q", q.name], env={"COLUMNS": width}
        )
        assert got.exit_code == 0, got.output
        text = _plain(got.output)
        assert "older version" in text and "SIGTERM" in text, text
        assert text.count("older version") == 1, text
    app = create_app(client=client, queues=[q.name], read_only=False, auth=Auth())
    page = TestClient(app).get("/workers")
    assert page.status_code == 200, page.text
    rows = {m.group(1): m.group(2) for m in re.finditer(
        r'<tr data-worker="([^"]+)">(.*?)</tr>', page.text, re.DOTALL)}  # fmt: skip
    assert "older version" in rows["old-1"] and "SIGTERM" in rows["old-1"], rows["old-1"]
    assert 'class="danger stop"' not in rows["old-1"]
    assert "older version" not in rows["new-1"] and 'class="danger stop"' in rows["new-1"]
