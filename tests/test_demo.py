"""`scheduler demo --keep`: the private Redis outlives the demo process, the printed commands
work on it, and the demo's tasks module runs in a plain `scheduler worker` as-is."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from scheduler import Queue

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "from scheduler.cli.main import main; main()"]
TASKS = "scheduler.cli.demo_tasks:registry"


def _until_done(q: Queue, job_id: str, deadline_s: float = 30.0) -> str:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        state = q.status(job_id)
        if state in ("done", "dead"):
            return state
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still {q.status(job_id)} after {deadline_s} s")


def test_demo_keep_leaves_a_running_redis_and_commands_that_work() -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    out = subprocess.run([*CLI, "demo", "--keep"], cwd=ROOT, env=dict(env, COLUMNS="200"),
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    text = out.stdout
    kept = re.search(r"Kept the Redis running: pid (\d+), socket (\S+)", text)
    assert kept, text + out.stderr
    pid, sock = int(kept.group(1)), kept.group(2)
    try:
        assert out.returncode == 0, text + out.stderr
        assert "All five jobs ended as expected" in text
        client = redis.Redis(unix_socket_path=sock, decode_responses=True)
        assert client.ping()  # the demo process has exited; its server has not
        q = Queue(client, "demo")
        counts = q.counts()
        assert (counts.dead, counts.due, counts.leased) == (1, 0, 0)
        url = f"unix://{sock}"
        assert f"URL: {url}" in text and f"Stop it: kill {pid} && rm -rf" in text
        # Each printed command is run as printed, from where the demo ran: `scheduler ...`
        # when it is on PATH, else the venv's (.venv/bin/scheduler after `make demo`).
        commands = [line.strip() for line in text.splitlines() if "--queue demo" in line]

        def printed(name: str) -> str:
            return next(c for c in commands if c.split(" --url")[0].endswith(f"scheduler {name}")
                        or c.split(" --url")[0].endswith(f"scheduler {name} {TASKS}"))  # fmt: skip

        for name in ("stats", "jobs list", "dead list", "workers"):
            line = printed(name)
            run = subprocess.run(shlex.split(line), cwd=ROOT, env=env,
                                 capture_output=True, text=True, timeout=60)  # fmt: skip
            assert run.returncode == 0, (line, run.stdout, run.stderr)
        listed = subprocess.run(shlex.split(printed("dead list")), cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert "demo.charge" in listed.stdout
        # The printed worker command runs the demo's tasks as-is (no REDIS_URL needed).
        worker_line = printed("worker")
        job_id = q.enqueue("demo.greet", {"name": "explorer"})
        worker = subprocess.Popen(shlex.split(worker_line), cwd=ROOT, env=env,
                                  stdin=subprocess.DEVNULL)  # fmt: skip
        try:
            assert _until_done(q, job_id) == "done"
            assert q.get_job(job_id).result_json == '"hello, explorer"'
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(20) == 0
        client.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(os.path.dirname(sock), ignore_errors=True)
