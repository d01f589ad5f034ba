"""The web dashboard from a security audit of its scale: whoever holds the app role can create
any number of queues and store any value, and no page may grow with them. Each test failed on
the code as audited (a 3,000-queue overview was 7.6 MB of JSON, polled every 3 s per tab)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler._spawn import RedisProcess
from scheduler.client.partitioned import PartitionedQueue
from scheduler.dashboard import Auth, create_app, schedule_view
from scheduler.dashboard.pages import OVERVIEW_SHOWN
from scheduler.dashboard.render import ENTRY_SHOWN
from scheduler.dashboard.store import Store
from tests.test_dashboard_review import web_of
from tests.test_review_operator_security import PAGE_MAX

QUEUES = 2 * OVERVIEW_SHOWN + 50


@pytest.fixture(scope="module")
def many(module_server: RedisProcess) -> Iterator[tuple[redis.Redis, list[str]]]:
    """QUEUES plain queues (one due job each) and one partitioned queue of 4 partitions, on a
    private server: the overview discovers exactly these."""
    c = redis.Redis.from_url(module_server.url, decode_responses=True)
    c.flushall()
    names = [f"tenant-{i:04d}" for i in range(QUEUES)]
    for name in names:
        Queue(c, name).enqueue("t", {"n": 1})
    PartitionedQueue.create(c, "tenant-0150-split", partitions=4).enqueue("t", {"n": 1})
    yield c, sorted([*names, "tenant-0150-split"])
    c.close()


def _web(c: redis.Redis) -> TestClient:
    return TestClient(create_app(client=c, auth=Auth()), raise_server_exceptions=False)


def test_the_overview_reads_and_shows_one_page_of_queues_by_name(
    many: tuple[redis.Redis, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, names = many
    read: list[str] = []
    summary = Store.queue_summary

    def counted(self: Store, name: str, minutes: int = 60) -> dict[str, Any]:
        read.append(name)
        return summary(self, name, minutes)

    monkeypatch.setattr(Store, "queue_summary", counted)
    seen: list[str] = []
    with _web(c) as web:
        for offset in range(0, len(names), OVERVIEW_SHOWN):
            read.clear()
            r = web.get(f"/api/overview?offset={offset}")
            assert r.status_code == 200, r.text
            got = r.json()
            assert (got["total"], got["offset"], got["limit"]) == (len(names), offset, 200)
            rows = [row["queue"] for row in got["queues"]]
            assert len(rows) == min(OVERVIEW_SHOWN, len(names) - offset)
            assert read == rows  # only the page's queues are read, not all then cut
            seen += rows
        page = web.get("/")
        past = web.get(f"/api/overview?offset={len(names)}").json()
    assert seen == names  # by name, each once: the partitioned queue as one row
    assert "tenant-0150-split.p0" not in seen
    assert past["queues"] == [] and past["total"] == len(names)
    assert page.status_code == 200
    assert page.text.count("<tr data-queue=") == OVERVIEW_SHOWN
    note = re.search(r'<p class="hint" id="queues-cut">(.*?)</p>', page.text, re.S)
    assert note is not None, "no note saying the overview is cut"
    assert f"1-{OVERVIEW_SHOWN} of {len(names)}" in note.group(1)
    assert f'href="/?offset={OVERVIEW_SHOWN}"' in note.group(1)
    assert "scheduler stats" in note.group(1)


@pytest.mark.parametrize(
    ("path", "owner", "read"),
    [
        ("/workers", Store, "view"),  # workers_read.read_page: each queue's view, then pipelines
        ("/health", Store, "counts"),
        ("/schedules", schedule_view, "schedule_rows"),
    ],
)
def test_workers_health_and_schedules_read_one_page_of_queues_by_name(
    many: tuple[redis.Redis, list[str]],
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    owner: object,
    read: str,
) -> None:
    """Each read a workers set, a counts script or a schedules set per queue (per partition
    for /schedules): 451 queues were 451 reads a request, whatever ?offset= said."""
    c, names = many
    split = "tenant-0150-split"
    whole = {p.name: split for p in PartitionedQueue.open(c, split).parts}
    seen: list[str] = []
    original = getattr(owner, read)

    def counted(*args: Any) -> Any:  # (store, queue name, ...)
        seen.append(whole.get(args[1], args[1]))
        return original(*args)

    monkeypatch.setattr(owner, read, counted)
    with _web(c) as web:
        for offset in range(0, len(names), OVERVIEW_SHOWN):
            seen.clear()
            r = web.get(f"{path}?offset={offset}")
            assert r.status_code == 200, r.text
            shown = names[offset:][:OVERVIEW_SHOWN]
            assert list(dict.fromkeys(seen)) == shown  # only this page's queues, by name
            assert len(seen) <= len(shown) + 3  # each once (/schedules: 4 partitions of one)
            note = re.search(r'<p class="hint" id="queues-cut">(.*?)</p>', r.text, re.S)
            assert note is not None, f"{path}: no note saying which queues are shown"
            assert f"{offset + 1}-{offset + len(shown)} of {len(names)}" in note.group(1)
            more = offset + OVERVIEW_SHOWN < len(names)
            assert (f'href="{path}?offset={offset + OVERVIEW_SHOWN}"' in note.group(1)) == more
            assert ('id="queues-prev"' in note.group(1)) == (offset > 0)


def test_an_offset_past_the_last_page_or_not_a_number_is_handled(
    many: tuple[redis.Redis, list[str]],
) -> None:
    c, names = many
    with _web(c) as web:
        last = web.get(f"/?offset={len(names) - 1}")
        bad = web.get("/api/overview?offset=-1")
    assert last.status_code == 200 and last.text.count("<tr data-queue=") == 1
    assert 'id="queues-prev"' in last.text and 'id="queues-next"' not in last.text
    assert bad.status_code == 400


def test_a_job_page_with_every_value_at_its_cap_stays_small(client: redis.Redis, q: Queue) -> None:
    """Each value was cut at 100,000 characters, but not the page: payload, result, progress,
    last error and ten hand-written history entries (message and traceback) at that cap made
    a page of 2.4 million characters (9.6 MB when each is an HTML-escaped '<')."""
    job_id = q.enqueue("mail.send", {"n": 1})
    big = "x" * 150_000
    history = [{"type": "E", "message": big, "traceback": big, "attempt": i} for i in range(10)]
    client.hset(q.keys.job(job_id), mapping={"payload": json.dumps(big), "result": json.dumps(big),
        "progress": json.dumps(big), "last_error_type": "E", "last_error": big,
        "errors": json.dumps(history)})  # fmt: skip
    with web_of(client, q) as web:
        r = web.get(f"/queues/{q.name}/jobs/{job_id}")
    assert r.status_code == 200
    assert len(r.content) < PAGE_MAX, f"a job page of {len(r.content)} bytes"
    # Each entry's message and traceback cut, saying how much is not shown.
    assert r.text.count(f"({len(big) - ENTRY_SHOWN} more characters not shown") == 20


def test_an_error_entry_as_a_worker_stores_it_is_shown_whole(client: redis.Redis, q: Queue) -> None:
    """fail stores at most 2,000 characters of message and 8,000 of traceback: the job page's
    smaller cap for errors never cuts one."""
    job_id = q.enqueue("mail.send", {"n": 1})
    job = q.claim("w1", limit=1).jobs[0]
    q.fail(job.id, job.token, ("E", "m" * 5_000, "t" * 20_000), retryable=False)
    with web_of(client, q) as web:
        r = web.get(f"/queues/{q.name}/jobs/{job_id}")
    assert r.status_code == 200
    assert "m" * 2_000 in r.text and "t" * 8_000 in r.text
    errors = r.text.split('id="job-errors"')[1].split("</section>")[0]
    assert "more characters not shown" not in errors
