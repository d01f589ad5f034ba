"""The framework examples in examples/, each against a private real Redis with a real
`scheduler worker` subprocess running the example's tasks module as-is: the request enqueues,
the worker runs the handler, and the handler's side effect shows up in Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from scheduler import Queue

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 30.0


def _worker(module: str, url: str, queue: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, REDIS_URL=url, SCHEDULER_QUEUE=queue)
    cmd = [sys.executable, "-c", "from scheduler.cli.main import main; main()", "worker",
           f"{module}:registry", "--url", url, "--queue", queue,
           "--log-level", "WARNING"]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL)


@pytest.fixture
def worker(redis_url: str, queue_name: str) -> Iterator[Callable[[str], None]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield lambda module: procs.append(_worker(module, redis_url, queue_name))
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            assert p.wait(20) == 0, f"worker exited {p.returncode}"
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise


@pytest.fixture
def app_env(redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("SCHEDULER_QUEUE", queue_name)
    yield


def _until(probe: Callable[[], Any]) -> Any:
    """Poll with a deadline: the worker is another process, there is no event to wait on."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"not within {DEADLINE_S} s")


def test_flask_enqueues_in_a_request_and_the_worker_runs_it(
    app_env: None, worker: Callable[[str], None], client: redis.Redis, queue_name: str
) -> None:
    from examples.flask_app.app import create_app

    app = create_app()
    http = app.test_client()
    assert http.post("/signups", json={"email": "nope"}).status_code == 400
    resp = http.post("/signups", json={"email": "a@example.com"})
    assert resp.status_code == 202
    job_id = resp.get_json()["job_id"]
    assert http.get(f"/jobs/{job_id}").get_json()["state"] == "due"
    assert Queue(client, queue_name).get_job(job_id).max_attempts == 3  # the task's default
    worker("examples.flask_app.tasks")
    key = f"examples:{queue_name}:welcome:a@example.com"
    assert _until(lambda: client.get(key)) == job_id
    shown = _until(lambda: (j := http.get(f"/jobs/{job_id}").get_json())["state"] == "done" and j)
    assert shown["result_json"] == '{"sent_to":"a@example.com"}'
    assert http.get("/jobs/nonexistent").status_code == 404


def test_fastapi_lifespan_queue_async_enqueue_and_job_state(
    app_env: None, worker: Callable[[str], None], client: redis.Redis, queue_name: str
) -> None:
    from fastapi.testclient import TestClient

    from examples.fastapi_app.app import app

    worker("examples.fastapi_app.tasks")
    with TestClient(app) as http:  # runs the lifespan: the AsyncQueue opens and closes
        assert http.post("/images", json={"image": "cat", "width": 0}).status_code == 422
        resp = http.post("/images", json={"image": "cat", "width": 64})
        assert resp.status_code == 202
        job_id = resp.json()["job_id"]
        assert Queue(client, queue_name).get_job(job_id).max_attempts == 3  # the task's default
        key = f"examples:{queue_name}:thumbnail:cat"
        assert _until(lambda: client.get(key)) == job_id
        shown = _until(lambda: (j := http.get(f"/jobs/{job_id}").json())["state"] == "done" and j)
        assert shown["result"] == {"thumbnail": "cat.thumb.png", "width": 64}
        assert http.get("/jobs/nonexistent").status_code == 404


def test_django_enqueues_only_after_the_transaction_commits(
    app_env: None,
    worker: Callable[[str], None],
    client: redis.Redis,
    queue_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EXAMPLE_DB", str(tmp_path / "db.sqlite3"))
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "examples.django_app.settings")
    import django
    from django.conf import settings

    if settings.configured:  # settings are per process: a second run in this process
        pytest.skip("Django already set up in this process")
    django.setup()
    from django.core.management import call_command
    from django.test import Client

    from scheduler import Queue

    call_command("migrate", run_syncdb=True, verbosity=0)
    http = Client(raise_request_exception=False)
    q = Queue(client, queue_name)
    # Rolled back after the row was written: on_commit never fires, nothing is enqueued.
    assert http.post("/orders", {"item": "x", "fail": True}, "application/json").status_code == 500
    assert q.counts().due == 0
    resp = http.post("/orders", {"item": "book"}, "application/json")
    assert resp.status_code == 201
    order_id = resp.json()["order_id"]
    job_id = http.get(f"/orders/{order_id}").json()["job_id"]
    assert job_id and q.status(job_id) == "due"  # enqueued by on_commit, before the response
    assert q.get_job(job_id).max_attempts == 3  # the task's default, by its handle
    worker("examples.django_app.tasks")
    assert _until(lambda: client.get(f"examples:{queue_name}:confirmed:{order_id}")) == job_id
    assert _until(lambda: http.get(f"/orders/{order_id}").json()["state"] == "done")


@pytest.mark.parametrize(("module", "start"), [
    ("examples.flask_app.app", "flask --app examples.flask_app.app run"),
    ("examples.fastapi_app.app", "uvicorn examples.fastapi_app.app:app"),
    ("examples.django_app.manage", "python -m examples.django_app.manage runserver"),
])  # fmt: skip
def test_each_app_docstring_says_how_to_start_and_try_it(module: str, start: str) -> None:
    """docs/guide/examples.md: "Each app module's docstring has the commands to start it and
    curl lines to try" (Django's named runserver only, and no curl line)."""
    import importlib

    doc = importlib.import_module(module).__doc__ or ""
    assert start in doc and "REDIS_URL=" in doc
    assert doc.count("curl ") >= 2  # one that enqueues, one that reads the job back
