"""The web dashboard, from a review: each test failed on the code as reviewed (hostile stored
data, actions reported as done when nothing was done, unbounded reads, DNS rebinding)."""

from __future__ import annotations

import html
import re
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest
import redis
from click.testing import CliRunner
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler.cli.main import main
from scheduler.dashboard import Auth, create_app
from scheduler.dashboard.security import ENV_AUTH, ENV_TOKEN
from tests.test_dashboard import csrf_of, dead_job


def web_of(c: redis.Redis, q: Queue) -> TestClient:
    app = create_app(client=c, queues=[q.name], auth=Auth())
    return TestClient(app, raise_server_exceptions=False)


def hidden_inputs(page: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for k, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page):
        out.setdefault(k, []).append(html.unescape(v))
    return out


def test_hostile_schedule_name_turns_the_pause_button_into_a_job_cancel(
    client: redis.Redis, q: Queue
) -> None:
    victim = q.enqueue("mail.send", {"keep": 1})
    name = f"x/../../jobs/{victim}/cancel?"  # written by a producer-credential holder
    client.sadd(q.keys.schedules, name)
    client.hset(q.keys.schedule(name), mapping={"kind": "every", "every_ms": 60_000, "task": "t"})
    with web_of(client, q) as web:
        page = web.get("/schedules")
        assert page.status_code == 200
        assert name in page.text  # the row is shown (flagged), not hidden
        actions = [
            html.unescape(a) for a in re.findall(r'<form method="post" action="([^"]+)"', page.text)
        ]
        # A fix may drop the row's buttons (the name is not a schedule name) or encode the name
        # in the URL; either way, no button may post to another route.
        posted = []
        for pause in [a for a in actions if a.endswith("/pause")]:
            target = urlsplit(
                urljoin("http://testserver/schedules", pause)
            )  # what a browser posts to
            web.post(f"{target.path}?{target.query}", data={"csrf": csrf_of(page.text)})
            posted.append(target.path)
    assert q.status(victim) == "due", f"the Pause button posted to {posted}"


def test_cancel_of_a_job_that_is_already_dead_is_not_reported_as_cancelled(
    client: redis.Redis, q: Queue
) -> None:
    job_id = dead_job(q)
    with web_of(client, q) as web:
        token = csrf_of(web.get(f"/queues/{q.name}/dead").text)
        r = web.post(f"/queues/{q.name}/jobs/{job_id}/cancel", data={"csrf": token})
    assert q.status(job_id) == "dead"
    assert "Cancelled the job" not in r.text, "nothing was cancelled, the page says it was"


def test_pausing_a_missing_schedule_is_not_reported_as_paused(
    client: redis.Redis, q: Queue
) -> None:
    with web_of(client, q) as web:
        token = csrf_of(web.get(f"/queues/{q.name}/dead").text)
        r = web.post(f"/queues/{q.name}/schedules/no-such/pause", data={"csrf": token})
    assert q.list_schedules() == []
    assert "Paused the schedule." not in r.text, "a missing schedule is reported as paused"


def test_purge_all_matching_deletes_no_more_than_the_confirmed_count(
    client: redis.Redis, q: Queue
) -> None:
    dead_job(q, {"i": 1})
    with web_of(client, q) as web:
        token = csrf_of(web.get(f"/queues/{q.name}/dead").text)
        form = {"csrf": token, "do": "purge:matching"}
        confirm = web.post(f"/queues/{q.name}/dead/confirm", data=form).text
        assert 'id="confirm-count">1<' in confirm
        later = dead_job(q, {"i": 2})  # dies while the operator reads the confirmation
        r = web.post(
            f"/queues/{q.name}/dead/apply", data=hidden_inputs(confirm), follow_redirects=False
        )
    assert "n=1" in r.headers["location"], f"confirmed 1, applied: {r.headers['location']}"
    assert q.dead_ids() == [later]


@pytest.mark.parametrize("path", ["/queues/{q}?offset=%C2%B2", "/?notice=requeued&n=%C2%B2"])
def test_a_superscript_digit_in_a_number_is_not_a_server_error(
    client: redis.Redis, q: Queue, path: str
) -> None:
    with web_of(client, q) as web:
        r = web.get(path.format(q=q.name))  # '²'.isdigit() is True, int('²') raises
    assert r.status_code in (200, 400), r.status_code


@pytest.mark.parametrize(
    ("cron", "slot"), [(None, "\u00b2"), ("* * * * *", "99999999999999999999999")]
)
def test_a_hostile_pending_field_does_not_crash_the_schedules_page(
    client: redis.Redis, q: Queue, cron: str | None, slot: str
) -> None:
    if cron is None:
        q.schedule("s1", "mail.send", every_ms=60_000)
    else:
        q.schedule("s1", "mail.send", cron=cron)
    client.hset(q.keys.schedule("s1"), "pending", f"schedule:s1:{slot}")
    with web_of(client, q) as web:
        r = web.get("/schedules")
    assert r.status_code == 200, r.status_code


def test_a_non_dict_error_entry_does_not_crash_the_job_page(client: redis.Redis, q: Queue) -> None:
    job_id = q.enqueue("mail.send", {})
    client.hset(q.keys.job(job_id), "errors", "[1, null]")
    with web_of(client, q) as web:
        r = web.get(f"/queues/{q.name}/jobs/{job_id}")
    assert r.status_code == 200, r.status_code


def test_a_non_utf8_value_does_not_crash_the_app_made_from_a_url(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    job_id = q.enqueue("mail.send", {})
    client.hset(q.keys.job(job_id), "note", b"\xff\xfe")
    app = create_app(url=redis_url, queues=[q.name], auth=Auth())  # the documented mount
    with TestClient(app, raise_server_exceptions=False) as web:
        r = web.get(f"/queues/{q.name}?state=due")
    assert r.status_code == 200, r.status_code


def test_a_stored_job_id_is_shown_with_its_controls_neutralised(
    client: redis.Redis, q: Queue
) -> None:
    bad = "inv\u202efdp.exe"  # a hand-written index entry and record
    client.zadd(q.keys.due, {bad: 1})
    client.hset(q.keys.job(bad), mapping={"state": "due", "task": "t", "run_at_ms": "1"})
    with web_of(client, q) as web:
        r = web.get(f"/queues/{q.name}?state=due")
    assert r.status_code == 200 and "fdp.exe" in r.text
    assert "\u202e" not in r.text, "a bidi override in a job id reaches the page raw"


def test_the_fence_is_shown_with_its_controls_neutralised(client: redis.Redis, q: Queue) -> None:
    job_id = q.enqueue("mail.send", {})
    client.hset(q.keys.job(job_id), "token", "\u202e7-abc")
    with web_of(client, q) as web:
        r = web.get(f"/queues/{q.name}/jobs/{job_id}")
    assert r.status_code == 200 and "\\u202e7-abc" in r.text  # the token row is cleaned
    assert "\u202e" not in r.text, "the fence row shows the stored token's controls raw"


def test_a_job_page_does_not_read_every_entry_of_the_workers_set(
    client: redis.Redis, q: Queue
) -> None:
    job_id = q.enqueue("mail.send", {})
    client.zadd(q.keys.workers, {f"fake-{i}": 9_999_999_999_999 for i in range(3_000)})

    def hgetalls() -> int:
        stats: dict[str, Any] = client.info("commandstats")
        return int(stats.get("cmdstat_hgetall", {}).get("calls", 0))

    with web_of(client, q) as web:
        before = hgetalls()
        assert web.get(f"/queues/{q.name}/jobs/{job_id}").status_code == 200
        spent = hgetalls() - before
    assert spent < 100, f"one job page ran {spent} HGETALLs"


def test_the_cli_dashboard_refuses_a_foreign_host_header(
    redis_url: str, q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    served: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(app=app, **kw))
    result = CliRunner().invoke(
        main, ["dashboard", "--url", redis_url, "-q", q.name], env={ENV_AUTH: None, ENV_TOKEN: None}
    )
    assert result.exit_code == 0, result.output
    with TestClient(served["app"], base_url="http://127.0.0.1:8080") as web:
        assert web.get("/").status_code == 200
        # DNS rebinding: a page of attacker.example, re-pointed at 127.0.0.1, reads the
        # dashboard (no auth on loopback) and can post with its CSRF token.
        rebound = web.get("/", headers={"host": "attacker.example:8080"})
    assert rebound.status_code >= 400, "a foreign Host is served by the loopback dashboard"
