"""The dashboard as a person uses it: a real headless Chromium (Debian's `chromium`, driven by
Playwright) against the app served by uvicorn on a private Redis. Enqueue jobs, let some die,
open the pages, requeue a dead letter and pause a schedule by clicking; Redis must change.

Under CI=true a missing chromium fails (`make install-test` installs it); elsewhere it skips.
The screenshots in docs/screenshots/ come from docs/screenshots/capture.py, a longer real run."""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis
import uvicorn

from scheduler import Queue
from scheduler.dashboard import Auth, create_app, pages
from scheduler.dashboard.app import DashboardApp
from tests.conftest import delete_queue
from tests.redis_server import free_port

CHROMIUM = "/usr/bin/chromium"

if not os.path.exists(CHROMIUM):
    message = f"no {CHROMIUM}: apt-get install chromium (make install-test does)"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message, allow_module_level=True)

from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402


@pytest.fixture
def queue_name() -> str:
    # A readable name for the screenshots, unique like conftest's (tests never flush).
    return "reports-" + uuid.uuid4().hex[:4]


@pytest.fixture
def served(client: redis.Redis, q: Queue) -> Iterator[str]:
    with serve(create_app(client=client, queues=[q.name], auth=Auth())) as url:
        yield url


@contextmanager
def serve(app: DashboardApp) -> Iterator[str]:
    """`app` served by uvicorn in a thread on a free loopback port while the block runs: its
    base URL. Stopped after the block (also when it did not start in 10 s)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = context.new_page()
    yield pg
    context.close()


def _work(q: Queue) -> list[str]:
    """Jobs in every state: some done, some dead (with a traceback), some due, one later."""
    ids = [q.enqueue("reports.build", {"report": i, "owner": "ops"}) for i in range(8)]
    batch = q.claim("worker-1", limit=5)
    dead = []
    for n, job in enumerate(batch.jobs):
        if n < 2:
            q.complete(job.id, job.token, {"rows": 10 * n})
            continue
        tb = 'Traceback (most recent call last):\n  File "reports.py", line 42, in build\n'
        tb += "    raise TimeoutError('warehouse did not answer')\nTimeoutError: warehouse"
        q.fail(job.id, job.token, ("TimeoutError", "warehouse did not answer", tb), retryable=False)
        dead.append(job.id)
    q.enqueue("emails.digest", {"to": "team@example.com"}, delay_ms=900_000)
    q.claim("worker-2", limit=1, lease_ms=120_000)
    assert len(ids) == 8
    return dead


def test_requeue_a_dead_job_through_the_ui(page: Page, served: str, q: Queue) -> None:
    dead = _work(q)
    page.goto(served + "/")
    row = page.locator(f'tr[data-queue="{q.name}"]')
    expect(row.locator('[data-live="dead"]')).to_have_text("3")
    # Live refresh: a new dead letter shows without reloading the page.
    (job,) = [j for j in q.claim("worker-3", limit=1).jobs]
    q.fail(job.id, job.token, ("KeyError", "'owner'", ""), retryable=False)
    expect(row.locator('[data-live="dead"]')).to_have_text("4", timeout=10_000)
    # The start lateness those claims recorded in Redis: the p99 and max lines.
    expect(page.locator("#lateness-chart path")).to_have_count(2, timeout=10_000)

    page.locator(f'a[href="/queues/{q.name}/dead"]').first.click()
    expect(page.locator("#dead-total")).to_contain_text("4 dead letters match")
    page.check(f'input[name="ids"][value="{dead[0]}"]')
    page.click("#requeue-selected")
    expect(page.locator("#confirm-count")).to_have_text("1")
    assert q.counts().dead == 4  # the confirmation page changed nothing
    page.click("#confirm-apply")
    expect(page.locator(".notice")).to_have_text("Requeued 1 dead job(s).")
    assert q.get_job(dead[0]).state == "due"
    assert q.counts().dead == 3

    page.goto(f"{served}/queues/{q.name}/jobs/{dead[1]}")
    expect(page.locator("#job-errors")).to_contain_text("warehouse did not answer")
    page.goto(f"{served}/queues/{q.name}?state=due")
    expect(page.locator("#jobs")).to_contain_text(dead[0])


def test_pause_a_schedule_through_the_ui(page: Page, served: str, q: Queue) -> None:
    q.schedule("nightly-report", "reports.build", cron="0 2 * * *", tz="Europe/Berlin")
    q.schedule("heartbeat", "ops.ping", every_ms=60_000)
    page.goto(served + "/schedules")
    row = page.locator('tr[data-schedule="nightly-report"]')
    expect(row).to_contain_text(re.compile(r"CES?T"))  # next runs in the schedule's own time zone
    row.locator("button.pause").click()
    expect(page.locator(".notice")).to_have_text("Paused the schedule.")
    assert q.get_schedule("nightly-report").paused
    assert not q.get_schedule("heartbeat").paused
    expect(page.locator('tr[data-schedule="nightly-report"] .sched-state')).to_have_text("paused")
    page.goto(served + "/health")
    expect(page.locator("h1")).to_have_text("Server health")
    page.goto(served + "/workers")


def test_the_live_overview_greys_out_a_queue_it_could_not_read(
    page: Page, client: redis.Redis, q: Queue
) -> None:
    """A queue whose node stops answering (a cluster node down: stood in for here by its
    summary raising redis' ConnectionError) keeps its row, greyed, and the status says so."""
    other = Queue(client, q.name + "-b")
    q.enqueue("reports.build", {})
    other.enqueue("reports.build", {})
    app = create_app(client=client, queues=[q.name, other.name], auth=Auth())
    summary, down = app.store.queue_summary, threading.Event()

    def flaky(name: str, minutes: int = 60) -> dict[str, object]:
        if down.is_set() and name == other.name:
            raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:7001")
        return summary(name, minutes)

    app.store.queue_summary = flaky  # type: ignore[method-assign]
    try:
        with serve(app) as url:
            page.goto(f"{url}/")
            row = page.locator(f'tr[data-queue="{other.name}"]')
            expect(page.locator("#live-status")).to_contain_text("live ·", timeout=10_000)
            expect(row).not_to_have_class(re.compile("stale"))
            down.set()
            expect(row).to_have_class(re.compile("stale"), timeout=10_000)
            expect(page.locator(f'tr[data-queue="{q.name}"]')).not_to_have_class(
                re.compile("stale")
            )
            expect(page.locator("#live-status")).to_contain_text("partly unreadable")
            down.clear()
            expect(row).not_to_have_class(re.compile("stale"), timeout=10_000)
            expect(page.locator("#live-status")).to_contain_text("live ·")
    finally:
        delete_queue(client, other)


def test_the_live_overview_polls_the_page_of_queues_it_shows(
    page: Page, client: redis.Redis, q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The overview shows OVERVIEW_SHOWN queues a page (?offset=): its live refresh must read
    the same page, or every row of a later page is greyed out as unread."""
    monkeypatch.setattr(pages, "OVERVIEW_SHOWN", 2)
    names = [q.name, q.name + "-b", q.name + "-c"]
    for name in names:
        Queue(client, name).enqueue("reports.build", {})
    app = create_app(client=client, queues=names, auth=Auth())
    try:
        with serve(app) as url:
            page.goto(f"{url}/?offset=2")
            expect(page.locator("#queues-cut")).to_contain_text("3-3 of 3")
            # The refresh time is UTC and says so, as every time the pages print (fmt_time).
            expect(page.locator("#live-status")).to_have_text(
                re.compile(r"live · \d\d:\d\d:\d\d UTC"), timeout=10_000
            )
            row = page.locator(f'tr[data-queue="{names[2]}"]')
            expect(row).to_have_count(1)
            expect(row).not_to_have_class(re.compile("stale"))
            page.locator("#queues-prev").click()
            expect(page.locator("tr[data-queue]")).to_have_count(2)
    finally:
        for name in names[1:]:
            delete_queue(client, Queue(client, name))
