"""The web dashboard over HTTP (Starlette's TestClient, a real private Redis): hostile text is
rendered inert, GET changes nothing, every POST needs the session's CSRF token, read-only and
auth hold, the bind rule refuses an open address without auth."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler.cli.main import main
from scheduler.core.errors import BadArgument
from scheduler.dashboard import Auth, check_bind, create_app
from scheduler.dashboard.security import CSP, ENV_AUTH, ENV_TOKEN
from tests.conftest import dump_queue

HOSTILE_TASK = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
HOSTILE = '<script>alert(3)</script>"><img src=x onerror=alert(4)>'
RAW_MARKERS = ("<script>alert(", '"><img src=x onerror')


def make_client(c: redis.Redis, q: Queue, **kwargs: object) -> TestClient:
    kwargs.setdefault("auth", Auth())
    app = create_app(client=c, queues=[q.name], **kwargs)  # type: ignore[arg-type]
    return TestClient(app)


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert m, "no CSRF field on the page"
    return m.group(1)


def dead_job(q: Queue, payload: object = None, error: str = "Boom") -> str:
    """Enqueue, claim and fail one job non-retryably: a dead letter with a real traceback."""
    job_id = q.enqueue("mail.send", payload)
    batch = q.claim("w-test", limit=1)
    (job,) = [j for j in batch.jobs if j.id == job_id]
    q.fail(job.id, job.token, (error, HOSTILE, f"Traceback: {HOSTILE}"), retryable=False)
    return job_id


@pytest.fixture
def web(client: redis.Redis, q: Queue) -> Iterator[TestClient]:
    with make_client(client, q) as t:
        yield t


def test_hostile_payload_task_and_error_render_as_text(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    job_id = dead_job(q, {"note": HOSTILE}, error="Err<script>alert(5)</script>")
    # Enqueue refuses such a task name, so a hostile one is written by hand (as a hostile
    # producer with write access could).
    client.hset(q.keys.job(job_id), "task", HOSTILE_TASK)
    pages = [
        f"/queues/{q.name}?state=dead",
        f"/queues/{q.name}/jobs/{job_id}",
        f"/queues/{q.name}/dead",
    ]
    for path in pages:
        r = web.get(path)
        assert r.status_code == 200, path
        for marker in RAW_MARKERS:
            assert marker not in r.text, (path, marker)
        assert "&lt;script&gt;alert(" in r.text, path
        assert r.headers["content-security-policy"] == CSP
    job_page = web.get(f"/queues/{q.name}/jobs/{job_id}").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&#34;&gt;&lt;img" in job_page  # the task
    assert "Traceback: &lt;script&gt;alert(3)" in job_page  # the error history's traceback


def test_get_never_changes_state(client: redis.Redis, q: Queue, web: TestClient) -> None:
    dead_id = dead_job(q)
    q.enqueue("mail.send", {"n": 1})
    q.schedule("nightly", "mail.send", every_ms=60_000)
    before = dump_queue(client, q)
    pages = [
        "/", "/api/overview", f"/queues/{q.name}", f"/queues/{q.name}?state=leased",
        f"/queues/{q.name}?task=mail.send", f"/queues/{q.name}/jobs/{dead_id}",
        f"/queues/{q.name}/dead", f"/queues/{q.name}/dead?task=mail.send&older_than=1s",
        "/schedules", "/workers", "/health", f"/queues/{q.name}/api",
    ]  # fmt: skip
    actions = [  # they answer GET with 405 and do nothing
        f"/queues/{q.name}/jobs/{dead_id}/requeue", f"/queues/{q.name}/jobs/{dead_id}/cancel",
        f"/queues/{q.name}/dead/apply?do=purge:matching",
        f"/queues/{q.name}/schedules/nightly/pause",
    ]  # fmt: skip
    codes = {p: web.get(p).status_code for p in pages + actions}
    expected = {**dict.fromkeys(pages, 200), **dict.fromkeys(actions, 405)}
    assert codes == expected
    assert dump_queue(client, q) == before


def test_post_without_a_valid_csrf_token_is_refused_and_changes_nothing(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    dead_id = dead_job(q)
    page = web.get(f"/queues/{q.name}/jobs/{dead_id}")
    token = csrf_of(page.text)
    before = dump_queue(client, q)
    url = f"/queues/{q.name}/jobs/{dead_id}/requeue"
    assert web.post(url, data={}).status_code == 403
    assert web.post(url, data={"csrf": "0" * 64}).status_code == 403
    # A valid token of another session (another browser) is refused too.
    with make_client(client, q) as other:
        other_token = csrf_of(other.get(f"/queues/{q.name}/jobs/{dead_id}").text)
    assert web.post(url, data={"csrf": other_token}).status_code == 403
    # The right token from another site (Origin) is refused.
    r = web.post(url, data={"csrf": token}, headers={"origin": "https://evil.example"})
    assert r.status_code == 403
    bulk = {"csrf": "bad", "do": "purge:matching"}
    assert web.post(f"/queues/{q.name}/dead/apply", data=bulk).status_code == 403
    assert dump_queue(client, q) == before
    # With the session's own token, the same request works.
    r = web.post(url, data={"csrf": token}, follow_redirects=False)
    assert r.status_code == 303
    assert q.get_job(dead_id).state in ("due", "scheduled")


def test_read_only_refuses_every_action_and_shows_no_button(client: redis.Redis, q: Queue) -> None:
    dead_id = dead_job(q)
    with make_client(client, q, read_only=True) as web:
        page = web.get(f"/queues/{q.name}/jobs/{dead_id}")
        assert "requeue-job" not in page.text and "read-only" in page.text
        token = csrf_of(web.get(f"/queues/{q.name}/dead").text)  # the form is there
        before = dump_queue(client, q)
        r = web.post(f"/queues/{q.name}/jobs/{dead_id}/requeue", data={"csrf": token})
        assert r.status_code == 403 and "read-only" in r.text
        assert dump_queue(client, q) == before


def test_auth_basic_and_token(client: redis.Redis, q: Queue) -> None:
    auth = Auth.from_env({ENV_AUTH: "ops:s3cret-pass", ENV_TOKEN: "t" * 20})
    with make_client(client, q, auth=auth) as web:
        assert web.get("/").status_code == 401
        assert web.get("/").headers["www-authenticate"].startswith("Basic")
        bad = base64.b64encode(b"ops:wrong").decode()
        assert web.get("/", headers={"authorization": f"Basic {bad}"}).status_code == 401
        good = base64.b64encode(b"ops:s3cret-pass").decode()
        assert web.get("/", headers={"authorization": f"Basic {good}"}).status_code == 200
        assert web.get("/", headers={"authorization": "Bearer " + "t" * 20}).status_code == 200
        assert web.get("/", headers={"authorization": "Bearer " + "x" * 20}).status_code == 401
        assert web.get("/static/dash.js").status_code == 401
    with pytest.raises(BadArgument):
        Auth.from_env({ENV_AUTH: "no-colon"})
    with pytest.raises(BadArgument):
        Auth.from_env({ENV_TOKEN: "short"})


def test_an_open_address_without_auth_is_refused() -> None:
    with pytest.raises(BadArgument, match=r"refusing to listen on '0\.0\.0\.0' without auth"):
        check_bind("0.0.0.0", Auth())
    check_bind("127.0.0.1", Auth())
    check_bind("0.0.0.0", Auth(token="t" * 20))
    result = CliRunner().invoke(
        main,
        ["dashboard", "--url", "redis://127.0.0.1:1/0", "--host", "0.0.0.0"],
        env={ENV_AUTH: None, ENV_TOKEN: None},  # unset, whatever the shell has
    )
    assert result.exit_code == 2
    assert "without authentication" in result.output


def test_a_mounted_app_without_credentials_is_refused_unless_said_so(
    client: redis.Redis, q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A production mount that relies on SCHEDULER_DASHBOARD_AUTH from the environment and
    # lost it (a deploy without the secret) must not serve requeue / purge to anyone.
    monkeypatch.delenv(ENV_AUTH, raising=False)
    monkeypatch.delenv(ENV_TOKEN, raising=False)
    for read_only in (False, True):  # payloads are readable too
        with pytest.raises(BadArgument, match=r"auth=Auth\(\)"):
            create_app(client=client, queues=[q.name], read_only=read_only)
    assert q.counts().dead == 0  # nothing was read or written for it
    # Said so: the mount is guarded by the app's own authentication.
    with TestClient(create_app(client=client, queues=[q.name], auth=Auth())) as web:
        assert web.get("/").status_code == 200
    # From the environment, as before.
    monkeypatch.setenv(ENV_TOKEN, "t" * 20)
    with TestClient(create_app(client=client, queues=[q.name])) as web:
        assert web.get("/").status_code == 401
        assert web.get("/", headers={"authorization": "Bearer " + "t" * 20}).status_code == 200


def test_dead_bulk_confirmation_states_the_count_and_acts_on_the_match(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    timeouts = [dead_job(q, {"i": i}, error="Timeout") for i in range(3)]
    others = [dead_job(q, {"i": i}, error="KeyError") for i in range(2)]
    token = csrf_of(web.get(f"/queues/{q.name}/dead").text)
    form = {"csrf": token, "do": "requeue:matching", "error_type": "Timeout"}
    confirm = web.post(f"/queues/{q.name}/dead/confirm", data=form)
    assert confirm.status_code == 200
    assert re.search(r'id="confirm-count">3<', confirm.text)
    assert q.counts().dead == 5  # the confirmation changed nothing
    apply = {"csrf": token, "action": "requeue", "scope": "matching", "error_type": "Timeout"}
    r = web.post(f"/queues/{q.name}/dead/apply", data=apply, follow_redirects=True)
    assert "Requeued 3 dead job(s)." in r.text
    assert sorted(q.dead_ids()) == sorted(others)
    assert all(q.get_job(i).state == "due" for i in timeouts)
    purge = {"csrf": token, "action": "purge", "scope": "selected", "ids": [others[0]]}
    r = web.post(f"/queues/{q.name}/dead/apply", data=purge, follow_redirects=True)
    assert "Purged 1 dead job(s)." in r.text
    assert q.dead_ids() == [others[1]]
    bad = {"csrf": token, "do": "requeue:matching", "older_than": "soon"}
    assert web.post(f"/queues/{q.name}/dead/confirm", data=bad).status_code == 400


def test_schedule_pause_resume_and_job_cancel(q: Queue, web: TestClient) -> None:
    q.schedule("hourly", "mail.send", every_ms=3_600_000)
    page = web.get("/schedules")
    assert "hourly" in page.text
    token = csrf_of(page.text)
    url = f"/queues/{q.name}/schedules/hourly"
    assert web.post(url + "/pause", data={"csrf": token}).status_code == 200
    assert q.get_schedule("hourly").paused
    web.post(url + "/resume", data={"csrf": token})
    assert not q.get_schedule("hourly").paused
    job_id = q.enqueue("mail.send", {"x": 1})
    r = web.post(f"/queues/{q.name}/jobs/{job_id}/cancel", data={"csrf": token})
    assert "Cancelled the job (it was due)." in r.text
    assert q.get_job(job_id).state == "cancelled"


def test_job_page_shows_the_lease_and_why_a_job_waits(q: Queue, web: TestClient) -> None:
    job_id = q.enqueue("mail.send", {"x": 1})
    r = web.get(f"/queues/{q.name}/jobs/{job_id}")
    assert 'data-reason="no-live-worker"' in r.text
    (job,) = q.claim("w-lease", limit=1, lease_ms=60_000).jobs
    r = web.get(f"/queues/{q.name}/jobs/{job_id}")
    assert job.token in r.text and "w-lease" in r.text
    assert f'<td class="mono">{job.fence}</td>' in r.text
    assert "Running now" in r.text
    later = q.enqueue("mail.send", {}, delay_ms=600_000)
    r = web.get(f"/queues/{q.name}/jobs/{later}")
    assert 'data-reason="scheduled"' in r.text


def test_mounted_under_a_prefix_links_stay_inside_it(client: redis.Redis, q: Queue) -> None:
    dead_id = dead_job(q)
    dash = create_app(client=client, queues=[q.name], auth=Auth())
    outer = Starlette(routes=[Mount("/ops/scheduler", app=dash)])
    with TestClient(outer) as web:
        page = web.get(f"/ops/scheduler/queues/{q.name}/jobs/{dead_id}")
        assert page.status_code == 200
        assert f'action="/ops/scheduler/queues/{q.name}/jobs/{dead_id}/requeue"' in page.text
        assert 'src="/ops/scheduler/static/dash.js"' in page.text
        r = web.post(
            f"/ops/scheduler/queues/{q.name}/jobs/{dead_id}/requeue",
            data={"csrf": csrf_of(page.text)},
            follow_redirects=False,
        )
        assert r.status_code == 303
        assert r.headers["location"].startswith(f"/ops/scheduler/queues/{q.name}/jobs/")
    assert q.counts().dead == 0


def test_overview_api_counts_and_per_minute_outcomes(q: Queue, web: TestClient) -> None:
    dead_job(q)
    q.enqueue("mail.send", {})
    q.enqueue("mail.send", {}, delay_ms=600_000)
    data = web.get("/api/overview").json()
    (row,) = [r for r in data["queues"] if r["queue"] == q.name]
    assert (row["due"], row["scheduled"], row["dead"]) == (1, 1, 1)
    assert len(row["failed"]) == 60 and row["failed"][-1] == 1  # this minute's failure
    assert len(row["late_p99_ms"]) == 60


def stats_between(client: redis.Redis, q: Queue, first_ms: int, last_ms: int) -> dict[str, int]:
    """The stats minutes from first_ms to last_ms merged (a claim may straddle a minute)."""
    out: dict[str, int] = {}
    for minute in range(first_ms // 60_000, last_ms // 60_000 + 1):
        for k, v in client.hgetall(q.keys.stats(minute)).items():
            name, n = str(k), int(v)
            out[name] = max(out.get(name, 0), n) if name == "late_max_ms" else out.get(name, 0) + n
    return out


def test_a_claim_records_its_start_lateness_once_per_call(client: redis.Redis, q: Queue) -> None:
    # 6 s: the run time is this process's clock, the lateness the server's; at exactly 5 s a
    # clock 1 ms ahead of Redis's read 4,999 ms (CI).
    late = datetime.now(UTC) - timedelta(seconds=6)
    ids = [q.enqueue("mail.send", {"n": i}, run_at=late) for i in range(3)]
    q.enqueue("mail.send", {"n": 9})  # on time: at most a few ms late
    before = q.counts().now_ms
    got = q.claim("w-late", limit=10).jobs
    s = stats_between(client, q, before, q.counts().now_ms)
    assert {j.id for j in got} >= set(ids) and s["claim"] == 4
    assert s["late_n"] == 4 and s["late_le_10000"] == 3
    assert sum(s.get(f"late_le_{b}", 0) for b in (10, 100, 1000)) == 1
    assert 5_000 <= s["late_max_ms"] < 60_000 and 15_000 <= s["late_sum_ms"] < 180_000
    assert "late_gt_600000" not in s and "late_le_60000" not in s


def test_the_lateness_chart_reads_what_a_real_claim_recorded(client: redis.Redis, q: Queue) -> None:
    # 6 s late by this process's clock: 5 s read 4,999 ms by the server's once (CI).
    q.enqueue("mail.send", {}, run_at=datetime.now(UTC) - timedelta(seconds=6))
    q.claim("w-late", limit=1)
    # A dashboard started after the claim (no process saw it happen) shows it.
    with make_client(client, q) as web:
        data = web.get("/api/overview").json()
    (row,) = [r for r in data["queues"] if r["queue"] == q.name]
    recent = [v for v in row["late_max_ms"][-2:] if v is not None]  # this minute or the last
    assert recent and 5_000 <= max(recent) < 60_000
    # One job a minute: its p99 is its bucket's bound (10 s) capped by the minute's max.
    assert row["late_p99_ms"][-2:] == row["late_max_ms"][-2:]
    assert max(v for v in data["late_max_ms"][-2:] if v is not None) >= 5_000


def test_a_hand_edited_lateness_field_does_not_fail_a_claim(client: redis.Redis, q: Queue) -> None:
    minute = q.counts().now_ms // 60_000
    for m in (minute, minute + 1):  # whichever minute the claim falls in
        client.hset(q.keys.stats(m), mapping={"late_max_ms": "x", "late_n": "y"})
    job_id = q.enqueue("mail.send", {})
    (job,) = q.claim("w-late", limit=1).jobs
    assert job.id == job_id and q.status(job_id) == "leased"


def test_the_documented_django_asgi_route_serves_the_dashboard_under_its_prefix(
    client: redis.Redis, q: Queue
) -> None:
    """docs/dashboard.md's asgi.py router, with a stand-in for Django's app."""
    dashboard = create_app(client=client, queues=[q.name], auth=Auth())
    other = Starlette()  # stands for get_asgi_application(): 404 for everything
    prefix = "/scheduler"

    async def application(scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path == prefix or path.startswith(prefix + "/")):
            scope = dict(scope, root_path=scope.get("root_path", "") + prefix)
            await dashboard(scope, receive, send)
        else:
            await other(scope, receive, send)

    with TestClient(application) as web:
        page = web.get(f"/scheduler/queues/{q.name}")
        assert page.status_code == 200
        assert f'action="/scheduler/queues/{q.name}"' in page.text
        assert web.get("/admin/").status_code == 404


def test_a_filtered_page_looks_through_a_bounded_number_of_ids(
    client: redis.Redis, q: Queue
) -> None:
    from scheduler.dashboard.store import Store
    from scheduler.operations.browsing import filtered_page

    for i in range(30):
        q.enqueue("a.task" if i % 10 == 9 else "b.task", {"i": i})
    store = Store(client, [q.name])
    page = store.run(q, filtered_page(q.ops, "due", task="a.task", limit=5, max_scan=12))
    assert [j.task for j in page.jobs] == ["a.task"]  # only ids 0..11 were looked at
    assert (page.scanned, page.next_offset) == (12, 12)
    rest = store.run(
        q, filtered_page(q.ops, "due", task="a.task", offset=12, limit=5, max_scan=100)
    )
    assert len(rest.jobs) == 2 and rest.next_offset is None


def test_without_a_queue_list_the_queues_are_discovered(client: redis.Redis, q: Queue) -> None:
    q.enqueue("mail.send", {})
    with TestClient(create_app(client=client, auth=Auth())) as web:
        assert f'tr data-queue="{q.name}"' in web.get("/").text
