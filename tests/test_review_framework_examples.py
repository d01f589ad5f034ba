"""Review: how an app developer puts the scheduler into a web app, as examples/ (FastAPI, Django,
Flask), docs/guide/examples.md, docs/guide/manual.md ("Threads, forks and pickling") and the
README's "Using it" / "Examples" show it.

tests/test_examples.py runs each example once, request -> worker -> side effect;
tests/test_review_async_app.py covers AsyncQueue across loops and forks and the examples'
malformed job ids; tests/test_fork_safety.py and test_queue_threads_audit.py the bare Queue.
Here: what a team copying the examples meets in production (a Redis blip during a Django
commit, a Sentinel URL, a burst of status polls, a hostile body, a preforking server, many
request threads, the documented worker command as typed). Every check runs on a private server
(module_server), never the shared one; Django runs in a subprocess (its settings are per
process, and tests/test_examples.py may set them up in this one).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

from scheduler import Queue
from scheduler._spawn import RedisProcess
from scheduler.core.connection import connect
from tests.redis_server import is_cluster_run

pytestmark = pytest.mark.skipif(is_cluster_run(), reason="a private single server")

ROOT = Path(__file__).resolve().parent.parent
UNREACHABLE = "unix:///nonexistent-scheduler-review/redis.sock"  # refused at once, no wait
SENTINEL_URL = "redis+sentinel://127.0.0.1:1/mymaster"  # a client of it connects lazily


@pytest.fixture
def url(module_server: RedisProcess) -> Iterator[str]:
    yield module_server.url


@pytest.fixture
def admin(url: str) -> Iterator[redis.Redis]:
    c = connect(url)
    yield c
    c.close()


@pytest.fixture
def app_env(url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What examples.md asks for: REDIS_URL (app, worker and handlers read it), SCHEDULER_QUEUE."""
    monkeypatch.setenv("REDIS_URL", url)
    monkeypatch.setenv("SCHEDULER_QUEUE", queue_name)


def _until(probe: Callable[[], Any], deadline_s: float = 20.0) -> Any:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if got := probe():
            return got
        time.sleep(0.05)
    raise AssertionError(f"not within {deadline_s} s")


# Django in a subprocess: one scenario, its answers printed as JSON on the last line.
_DJANGO = """
import json, os, sys
os.environ["DJANGO_SETTINGS_MODULE"] = "examples.django_app.settings"
import django
django.setup()
from django.core.management import call_command
from django.test import Client
from examples.django_app.models import Order
call_command("migrate", run_syncdb=True, verbosity=0)
http = Client(raise_request_exception=False)
bodies = json.loads(sys.argv[1])
codes = [http.post("/orders", b, "application/json").status_code for b in bodies]
rows = [[o.pk, o.item, o.job_id] for o in Order.objects.order_by("pk")]
print(json.dumps({"codes": codes, "rows": rows}))
"""


def _django(tmp_path: Path, redis_url: str, queue: str, bodies: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = _run_django(tmp_path, redis_url, queue, _DJANGO, json.dumps(bodies))
    return out


def _run_django(tmp_path: Path, redis_url: str, queue: str, script: str, *args: str) -> Any:
    env = dict(
        os.environ,
        REDIS_URL=redis_url,
        SCHEDULER_QUEUE=queue,
        EXAMPLE_DB=str(tmp_path / "db.sqlite3"),
        PYTHONWARNINGS="ignore",
    )
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- defects ------------------------------------------------------------------------------------


def test_django_a_failed_enqueue_after_commit_leaves_no_order_without_its_job(
    tmp_path: Path, queue_name: str
) -> None:
    """examples.md: "enqueue in a view only after the transaction commits". The other half of
    that pattern: Redis down (a failover, a restart) when on_commit runs. Django re-raises the
    callback's error after COMMIT, so the client sees 500 (and retries: a second order) while
    the first order is committed with no job: its confirmation is never sent, and nothing in
    the scheduler (no job, no dead letter) shows it. Either the error answer means nothing was
    created, or the committed order is answered as accepted and still gets its job."""
    got = _django(tmp_path, UNREACHABLE, queue_name, ['{"item": "book"}'])
    (code,) = got["codes"]
    orphans = [row for row in got["rows"] if not row[2]]
    assert not (code >= 500 and got["rows"]), got  # an error answer, yet the order is there
    assert orphans == [], got  # ... and a committed order with no job, for good
    assert code == 201, got  # fixed: on_commit(robust=True), the order names its job's id; the
    # sweep enqueues it (test_django_the_sweep_enqueues_each_missed_order_once)


# The fix's other half: the order posted while Redis is unreachable, then the sweep task (as its
# recurring schedule runs it, through the registry's middleware) once Redis answers.
_DJANGO_SWEEP = """
import json, os, sys
os.environ["DJANGO_SETTINGS_MODULE"] = "examples.django_app.settings"
import django
django.setup()
from django.core.management import call_command
from django.test import Client
from examples.django_app.models import Order
from examples.django_app.tasks import registry
from scheduler import JobContext
call_command("migrate", run_syncdb=True, verbosity=0)
code = Client().post("/orders", '{"item": "book"}', "application/json").status_code
os.environ["REDIS_URL"] = sys.argv[1]  # Redis back: the handlers' client reads it at first use
name = "django_app.enqueue_missed_confirmations"
sweep, ctx = registry.get(name).fn, JobContext.for_test(name, queue=sys.argv[2])
sweeps = [sweep(None, ctx), sweep(None, ctx)]
Order.objects.update(enqueued=False)  # as if a sweep died between its enqueue and its update
sweeps.append(sweep(None, ctx))
rows = [[o.pk, o.job_id, o.enqueued] for o in Order.objects.all()]
print(json.dumps({"code": code, "sweeps": sweeps, "rows": rows}))
"""


def test_django_the_sweep_enqueues_each_missed_order_once(
    tmp_path: Path, url: str, queue_name: str, admin: redis.Redis
) -> None:
    """examples.md: the order whose on_commit enqueue failed is answered 201 and enqueued by the
    next run of the sweep, with the id its row holds; a later sweep sends nothing more, and one
    that enqueues it again (its mark lost) writes no second job: the id and key are the same."""
    got = _run_django(tmp_path, UNREACHABLE, queue_name, _DJANGO_SWEEP, url, queue_name)
    assert got["code"] == 201, got
    ((order_id, job_id, enqueued),) = got["rows"]
    assert enqueued and got["sweeps"] == [{"enqueued": 1}, {"enqueued": 0}, {"enqueued": 1}], got
    q = Queue(admin, queue_name)
    assert q.counts().due == 1
    assert q.get_job(job_id).payload() == {"order_id": order_id}
    assert q.get_job(job_id).max_attempts == 3  # the task's default, by its handle


def test_the_examples_accept_every_redis_url_the_worker_accepts(
    queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples.md: "Run ... with REDIS_URL set (the app, the worker and the handlers all read
    it)". `scheduler worker` (and Queue.from_url) read a Sentinel or Cluster URL
    (docs/cluster.md); the apps and the handlers pass it to redis-py's own `from_url`, which
    raises ValueError at start-up (app) or at every job (handler: retried, then dead)."""
    from examples.flask_app import tasks
    from examples.flask_app.app import create_app

    Queue(connect(SENTINEL_URL), queue_name)  # the scheduler's own reader takes it (lazily)
    create_app(SENTINEL_URL, queue_name)  # the app
    monkeypatch.setenv("REDIS_URL", SENTINEL_URL)
    monkeypatch.setattr(tasks, "_client", None)
    tasks._redis()  # the handler's client


def test_fastapi_status_polls_beyond_the_pool_are_answered(app_env: None, queue_name: str) -> None:
    """The example's GET /jobs/{id} is the endpoint clients poll. Its get_job is not batched
    (only enqueue is: manual.md), so each poll holds a connection: 150 polls at once in one
    uvicorn worker (a page of 150 jobs' spinners) had 50 answered 500 with a traceback each,
    while the README's own advice (a BlockingConnectionPool, or max_connections=) would wait."""
    httpx = pytest.importorskip("httpx2")
    from examples.fastapi_app.app import app, lifespan

    async def main() -> collections.Counter[int]:
        async with lifespan(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
                job_id = (await http.post("/images", json={"image": "a", "width": 8})).json()
                polls = [http.get(f"/jobs/{job_id['job_id']}") for _ in range(150)]
                return collections.Counter(r.status_code for r in await asyncio.gather(*polls))

    assert asyncio.run(main()) == {200: 150}


def test_flask_a_json_body_that_is_not_an_object_is_a_client_error(
    url: str, queue_name: str
) -> None:
    """The example answers a bad e-mail with 400 (abort), as an app should any bad input; a
    body of `["a@b.c"]` or `"a@b.c"` reaches `body.get` on a list / str: a logged traceback
    and 500 for any client's request (the FastAPI example's pydantic model answers 422)."""
    from examples.flask_app.app import create_app

    app = create_app(url, queue_name)
    http = app.test_client()
    codes = [http.post("/signups", json=body).status_code for body in (["a@b.c"], "a@b.c", 7)]
    assert codes == [400, 400, 400]


def test_django_a_body_that_is_not_a_json_object_is_a_client_error(
    tmp_path: Path, url: str, queue_name: str
) -> None:
    """The same for the Django view: `json.loads(request.body)` raises on a form post or a
    truncated body, `body.get` on a list; each is a 500 with a traceback, for nothing the
    server did wrong (no order is written, at least)."""
    got = _django(tmp_path, url, queue_name, ["item=book", '["book"]'])
    assert got["codes"] == [400, 400] and got["rows"] == [], got


# --- checked and found correct ------------------------------------------------------------------


def test_flask_one_queue_shared_by_many_request_threads(
    url: str, queue_name: str, admin: redis.Redis
) -> None:
    """manual.md "Threads": one Queue per app, shared by every request thread (examples.md
    "one Queue per app"). 50 threads x 40 signups through the app and the task handle: every
    answer is a distinct id whose job holds that request's e-mail and the task's defaults."""
    from examples.flask_app.app import create_app

    app = create_app(url, queue_name)

    def signups(t: int) -> list[tuple[str, str]]:
        http = app.test_client()
        out = []
        for i in range(40):
            email = f"u{t}-{i}@example.com"
            resp = http.post("/signups", json={"email": email})
            assert resp.status_code == 202
            out.append((email, resp.get_json()["job_id"]))
        return out

    with ThreadPoolExecutor(50) as pool:
        answers = [pair for part in pool.map(signups, range(50)) for pair in part]
    assert len({job_id for _, job_id in answers}) == len(answers) == 2000
    q = Queue(admin, queue_name)
    jobs = {job_id: q.get_job(job_id) for _, job_id in answers[::37]}
    for email, job_id in answers[::37]:
        assert jobs[job_id].payload() == {"email": email}
        assert jobs[job_id].max_attempts == 3
    assert q.counts().due == 2000


def test_flask_app_made_and_used_before_a_fork_serves_each_process_its_own_replies(
    url: str, queue_name: str, admin: redis.Redis
) -> None:
    """gunicorn --preload: create_app() (its client and Queue) runs in the master, here used
    once too, then workers fork. Children and the parent post at once: each answer's job holds
    that process's own request, and every job is written once."""
    from examples.flask_app.app import create_app

    app = create_app(url, queue_name)
    warm = app.test_client().post("/signups", json={"email": "master@example.com"})
    assert warm.status_code == 202

    def serve(tag: str) -> bool:
        http, q = app.test_client(), Queue(connect(url), queue_name)
        for i in range(60):
            email = f"{tag}-{i}@example.com"
            job_id = http.post("/signups", json={"email": email}).get_json()["job_id"]
            if q.get_job(job_id).payload() != {"email": email}:
                return False
            if http.get(f"/jobs/{job_id}").get_json()["id"] != job_id:
                return False
        q.close()
        return True

    pids = []
    for k in range(3):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 3
            try:
                code = 0 if serve(f"c{k}") else 2
            finally:
                os._exit(code)
        pids.append(pid)
    assert serve("parent")
    assert [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids] == [0, 0, 0]
    assert Queue(admin, queue_name).counts().due == 1 + 4 * 60


def test_fastapi_app_imported_before_a_fork_runs_its_lifespan_in_each_worker(
    app_env: None, queue_name: str, admin: redis.Redis
) -> None:
    """uvicorn --workers / gunicorn -k uvicorn --preload: the module (and its FastAPI app) is
    imported in the master, the lifespan runs in each worker, as examples.md says. Two forked
    workers and the parent, each its own lifespan: 300 concurrent posts each, all answered
    202 on the default pool (enqueues share script calls), each id distinct."""
    httpx = pytest.importorskip("httpx2")
    from examples.fastapi_app.app import app, lifespan

    async def serve(tag: str) -> list[str]:
        async with lifespan(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
                posts = [
                    http.post("/images", json={"image": f"{tag}-{i}", "width": 8})
                    for i in range(300)
                ]
                answers = await asyncio.gather(*posts)
        assert [r.status_code for r in answers] == [202] * 300
        return [r.json()["job_id"] for r in answers]

    pids = []
    for k in range(2):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 3
            try:
                ids = asyncio.run(serve(f"c{k}"))
                code = 0 if len(set(ids)) == 300 else 2
            finally:
                os._exit(code)
        pids.append(pid)
    mine = asyncio.run(serve("parent"))
    assert [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids] == [0, 0]
    q = Queue(admin, queue_name)
    assert len(set(mine)) == 300 and q.counts().due == 900
    assert q.get_job(mine[123]).payload() == {"image": "parent-123", "width": 8}


def test_the_documented_worker_command_runs_what_the_flask_app_enqueued(
    app_env: None, url: str, queue_name: str, admin: redis.Redis
) -> None:
    """README "Examples": `REDIS_URL=... scheduler worker examples.flask_app.tasks:registry`
    (from the repository root), typed as written: the installed console script, whose
    sys.path does not hold the current directory (tests/test_examples.py runs `python -c`,
    which does), with the queue from SCHEDULER_QUEUE and no --url. --burst to end it."""
    script = Path(sys.executable).with_name("scheduler")
    if not script.exists():
        pytest.skip("no installed `scheduler` script beside this python")
    from examples.flask_app.app import create_app

    http = create_app().test_client()
    job_id = http.post("/signups", json={"email": "doc@example.com"}).get_json()["job_id"]
    done = subprocess.run(
        [str(script), "worker", "examples.flask_app.tasks:registry", "--burst"],
        cwd=ROOT,
        env=dict(os.environ, REDIS_URL=url, SCHEDULER_QUEUE=queue_name),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert admin.get(f"examples:{queue_name}:welcome:doc@example.com") == job_id
    assert http.get(f"/jobs/{job_id}").get_json()["result_json"] == '{"sent_to":"doc@example.com"}'


def test_django_a_rolled_back_order_enqueues_nothing_beside_a_committed_one(
    tmp_path: Path, url: str, queue_name: str, admin: redis.Redis
) -> None:
    """views.py: on_commit runs the enqueue once the row is committed; a rolled-back request
    (here between two good ones) registers a callback that never runs: exactly one job per
    committed order, each order's job naming it."""
    got = _django(
        tmp_path, url, queue_name, ['{"item": "a"}', '{"item": "b", "fail": true}', '{"item": "c"}']
    )
    assert got["codes"] == [201, 500, 201]
    rows = got["rows"]
    assert [r[1] for r in rows] == ["a", "c"] and all(r[2] for r in rows)
    q = Queue(admin, queue_name)
    assert q.counts().due == 2
    assert [q.get_job(r[2]).payload() for r in rows] == [{"order_id": r[0]} for r in rows]
