"""The web dashboard from a security audit. Hostile stored data (whoever holds the app role
writes any field and any workers-set member by hand): the pages must stay up and small, and
each of these tests failed on the code as audited. Then a guard over every POST route the app
has, a route added later included: refused (403, nothing written) read-only, without the
session's token, or from another Origin."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
import redis
from starlette.routing import Route
from starlette.testclient import TestClient

from scheduler import Queue
from tests.conftest import dump_queue
from tests.test_dashboard import csrf_of, dead_job, make_client
from tests.test_dashboard_review import web_of
from tests.test_review_operator_security import PAGE_MAX
from tests.test_worker_remote_stop import beat


# "America" is a directory of the zone database, a long name is too long for a file name:
# ZoneInfo raises OSError for both, not ZoneInfoNotFoundError.
@pytest.mark.parametrize("tz", ["America", "x" * 300])
def test_a_hand_edited_time_zone_does_not_fail_the_schedules_page(
    client: redis.Redis, q: Queue, tz: str
) -> None:
    q.schedule("s1", "mail.send", cron="* * * * *")
    client.hset(q.keys.schedule("s1"), "tz", tz)
    with web_of(client, q) as web:
        r = web.get("/schedules")
    assert r.status_code == 200, r.status_code
    assert 'data-schedule="s1"' in r.text


def test_a_huge_workers_set_member_does_not_make_a_huge_workers_page(
    client: redis.Redis, q: Queue
) -> None:
    beat(q, "w1")
    big = "W" * 1_000_000  # no worker id is that long (at most 200 characters)
    client.zadd(q.keys.workers, {big: 9e12})
    client.hset(q.keys.worker(big), mapping={"host": "h"})
    with web_of(client, q) as web:
        r = web.get("/workers")
    assert r.status_code == 200 and "more characters not shown" in r.text
    assert len(r.content) < PAGE_MAX, f"a workers page of {len(r.content)} bytes"
    assert 'name="worker" value="w1"' in r.text  # a real worker keeps its buttons


def test_a_hand_written_dead_letter_with_no_job_id_does_not_block_select_all(
    client: redis.Redis, q: Queue
) -> None:
    good = dead_job(q)
    bad = "not an id"  # written by hand into the dead set, with a record: listed on the page
    fields: dict[Any, Any] = {"task": "t", "payload": "null", "state": "dead", "attempts": "1",
              "max_attempts": "1", "run_at_ms": "1", "dead_ms": "5"}  # fmt: skip
    client.hset(q.keys.job(bad), mapping=fields)
    client.zadd(q.keys.dead, {bad: 5})
    with web_of(client, q) as web:
        page = web.get(f"/queues/{q.name}/dead").text
        assert "not an id" in page  # shown, as text
        selected = [html.unescape(v) for v in re.findall(r'name="ids" value="([^"]*)"', page)]
        data = {"csrf": csrf_of(page), "do": "purge:selected", "ids": selected}
        r = web.post(f"/queues/{q.name}/dead/apply", data=data)
    assert r.status_code == 200, r.text[:300]  # every box of the page, as "select all" ticks
    assert client.zscore(q.keys.dead, good) is None  # purged
    assert client.zscore(q.keys.dead, bad) is not None  # left for "all matching"


def _post_routes(web: TestClient) -> list[str]:
    """Every POST route of the app, as a path on this test's queue (a new route is included)."""
    params = {"queue": "{q}", "job_id": "{job}", "name": "nightly"}
    inner = web.app.app  # type: ignore[attr-defined]  # DashboardApp wraps the Starlette app
    return [
        r.path.format(**params, verb="remove" if "/schedules/" in r.path else "stop")
        for r in inner.routes
        if isinstance(r, Route) and r.methods is not None and "POST" in r.methods
    ]


@pytest.mark.parametrize("read_only", [True, False])
def test_every_action_is_refused_read_only_or_without_the_sessions_token(
    client: redis.Redis, q: Queue, read_only: bool
) -> None:
    job = dead_job(q)
    q.schedule("nightly", "mail.send", every_ms=60_000)
    beat(q, "w1")
    form = {"do": "purge:matching", "worker": "w1", "ids": job}
    with make_client(client, q, read_only=read_only) as web:
        token = csrf_of(web.get(f"/queues/{q.name}/dead").text)
        paths = [p.format(q=q.name, job=job) for p in _post_routes(web)]
        assert len(paths) >= 9, paths
        before = dump_queue(client, q)
        tries = [{**form, "csrf": token}] if read_only else [form, {**form, "csrf": "0" * 64}]
        codes = {(p, str(t.get("csrf"))[:4]): web.post(p, data=t).status_code
                 for p in paths for t in tries}  # fmt: skip
        if not read_only:  # the right token from another site
            for p in paths:
                r = web.post(
                    p, data={**form, "csrf": token}, headers={"origin": "http://x.example"}
                )
                codes[(p, "origin")] = r.status_code
        assert set(codes.values()) == {403}, codes
        assert dump_queue(client, q) == before


@pytest.mark.parametrize(
    ("fetch", "status"),
    [
        # Another site's <img>, fetch() and form made the operator's browser read a page.
        (
            {
                "sec-fetch-site": "cross-site",
                "sec-fetch-mode": "no-cors",
                "sec-fetch-dest": "image",
            },
            403,
        ),
        (
            {"sec-fetch-site": "cross-site", "sec-fetch-mode": "cors", "sec-fetch-dest": "empty"},
            403,
        ),
        (
            {
                "sec-fetch-site": "same-site",
                "sec-fetch-mode": "no-cors",
                "sec-fetch-dest": "script",
            },
            403,
        ),
        (
            {
                "sec-fetch-site": "cross-site",
                "sec-fetch-mode": "navigate",
                "sec-fetch-dest": "iframe",
            },
            403,
        ),
        # A link followed from elsewhere, the dashboard's own requests, a tool: served.
        (
            {
                "sec-fetch-site": "cross-site",
                "sec-fetch-mode": "navigate",
                "sec-fetch-dest": "document",
            },
            200,
        ),
        (
            {"sec-fetch-site": "same-origin", "sec-fetch-mode": "cors", "sec-fetch-dest": "empty"},
            200,
        ),
        (
            {"sec-fetch-site": "none", "sec-fetch-mode": "navigate", "sec-fetch-dest": "document"},
            200,
        ),
        ({}, 200),
    ],
)
def test_another_sites_page_cannot_make_the_browser_read_the_dashboard(
    client: redis.Redis, q: Queue, fetch: dict[str, str], status: int
) -> None:
    dead_job(q)
    with web_of(client, q) as web:
        r = web.get(f"/queues/{q.name}/dead?task=t", headers=fetch)
    assert r.status_code == status, (r.status_code, r.text[:200])
    assert r.headers["x-frame-options"] == "DENY"
