"""Pausing a whole queue from the dashboard (Starlette's TestClient, a real private Redis): the
queue page's Pause / Resume buttons are POST actions like the others (CSRF token, Origin,
read-only), a partitioned queue is paused and resumed whole, and the overview, the queue page
and their JSON show the pause; a GET of any page changes nothing."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import redis
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from scheduler import JobSpec, Queue
from scheduler.client.partitioned import PartitionedQueue
from scheduler.dashboard import Auth, create_app
from scheduler.dashboard.render import fmt_time
from tests.conftest import delete_queue, dump_queue
from tests.test_dashboard import csrf_of, make_client

PAUSED_NOTICE = "Paused the queue: workers claim none of its jobs until it is resumed."
RESUMED_NOTICE = "Resumed the queue: workers claim its jobs again."
# pq: its own name, as the plain `q` of a test beside it may not write under a partitioned one
pytestmark = pytest.mark.pq(suffix="-p")


@pytest.fixture
def web(client: redis.Redis, q: Queue) -> Iterator[TestClient]:
    with make_client(client, q) as t:
        yield t


def tag(html: str, pattern: str) -> str:
    """The one start tag matching `pattern` (a regex of its inside)."""
    found: list[str] = re.findall(rf"<[a-z]+ [^>]*{pattern}[^>]*>", html)
    assert len(found) == 1, (pattern, found)
    return found[0]


def shown(start_tag: str) -> bool:
    return re.search(r"\shidden[\s>]", start_tag) is None


def queue_state(html: str) -> dict[str, bool]:
    """What the queue page shows: the badge, the notice, each button (present and not hidden)."""
    out = {
        "badge": shown(tag(html, 'class="state state-paused"')),
        "notice": shown(tag(html, 'id="queue-paused"')),
    }
    for verb in ("pause", "resume"):
        forms = re.findall(rf'<form [^>]*action="[^"]*/{verb}"[^>]*>', html)
        out[verb] = bool(forms) and shown(forms[0]) and f'id="{verb}-queue"' in html
    return out


PAUSED = {"badge": True, "notice": True, "pause": False, "resume": True}
ACTIVE = {"badge": False, "notice": False, "pause": True, "resume": False}


def overview_row(html: str, name: str) -> str:
    m = re.search(rf'<tr data-queue="{re.escape(name)}">.*?</tr>', html, re.S)
    assert m, f"no overview row of {name}"
    return m.group(0)


def post(web: TestClient, path: str, token: str | None, **kw: object) -> tuple[int, str]:
    data = {} if token is None else {"csrf": token}
    r = web.post(path, data=data, follow_redirects=False, **kw)  # type: ignore[arg-type]
    return r.status_code, r.headers.get("location", r.text)


def test_pause_and_resume_from_the_queue_page(q: Queue, web: TestClient) -> None:
    ids = q.enqueue_many([JobSpec("mail.send", {"i": i}) for i in range(2)])
    page = web.get(f"/queues/{q.name}").text
    assert queue_state(page) == ACTIVE
    token = csrf_of(page)

    r = post(web, f"/queues/{q.name}/pause", token)
    assert r[0] == 303 and r[1].startswith(f"/queues/{q.name}?notice=queue-paused&sig=")
    assert q.counts().paused
    assert q.claim("w").jobs == []  # a paused queue's claims lease nothing
    page = web.get(r[1]).text
    assert PAUSED_NOTICE in page
    assert queue_state(page) == PAUSED
    since = fmt_time(q.counts().paused_ms)
    assert f"Paused since <span data-paused-since>{since}</span>" in page  # as other times
    again = web.post(f"/queues/{q.name}/pause", data={"csrf": token}).text
    assert "Nothing changed: the queue was already paused." in again
    assert queue_state(again) == PAUSED

    r = post(web, f"/queues/{q.name}/resume", token)
    assert r[0] == 303 and r[1].startswith(f"/queues/{q.name}?notice=queue-resumed&sig=")
    assert not q.counts().paused
    page = web.get(r[1]).text
    assert RESUMED_NOTICE in page and queue_state(page) == ACTIVE
    again = web.post(f"/queues/{q.name}/resume", data={"csrf": token}).text
    assert "Nothing changed: the queue was not paused." in again
    assert queue_state(again) == ACTIVE
    assert sorted(j.id for j in q.claim("w", limit=10).jobs) == sorted(ids)


def test_a_pause_or_resume_without_a_valid_token_or_from_another_site_changes_nothing(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    job = q.enqueue("mail.send", None)
    token = csrf_of(web.get(f"/queues/{q.name}").text)
    with make_client(client, q) as other:  # a valid token of another session
        other_token = csrf_of(other.get(f"/queues/{q.name}").text)
    for verb, paused in (("pause", False), ("resume", True)):
        if paused:
            q.pause()
        before = dump_queue(client, q)
        url = f"/queues/{q.name}/{verb}"
        assert post(web, url, None)[0] == 403
        assert post(web, url, "0" * 64)[0] == 403
        assert post(web, url, other_token)[0] == 403
        assert post(web, url, token, headers={"origin": "https://evil.example"})[0] == 403
        assert dump_queue(client, q) == before
        assert q.counts().paused is paused
    q.resume()
    assert [j.id for j in q.claim("w").jobs] == [job]


def test_read_only_shows_no_button_and_refuses_the_post(client: redis.Redis, q: Queue) -> None:
    q.enqueue("mail.send", None)
    with make_client(client, q, read_only=True) as web:
        token = csrf_of(web.get(f"/queues/{q.name}/dead").text)  # that page has a form
        for paused in (False, True):
            if paused:
                q.pause()
            page = web.get(f"/queues/{q.name}").text
            assert "read-only" in page
            assert "pause-queue" not in page and "resume-queue" not in page
            assert f"/queues/{q.name}/pause" not in page and f"/queues/{q.name}/resume" not in page
            assert shown(tag(page, 'class="state state-paused"')) is paused  # still shown
            before = dump_queue(client, q)
            for verb in ("pause", "resume"):
                r = web.post(f"/queues/{q.name}/{verb}", data={"csrf": token})
                assert r.status_code == 403 and "read-only" in r.text
            assert dump_queue(client, q) == before
            assert q.counts().paused is paused


def test_overview_queue_page_and_json_show_the_pause(q: Queue, web: TestClient) -> None:
    q.enqueue("mail.send", None)

    def seen() -> tuple[bool, dict[str, bool], object, object]:
        row = overview_row(web.get("/").text, q.name)
        badge = shown(tag(row, 'class="state state-paused"'))
        (api_row,) = [r for r in web.get("/api/overview").json()["queues"] if r["queue"] == q.name]
        page = queue_state(web.get(f"/queues/{q.name}").text)
        assert api_row["paused_partitions"] == []  # a plain queue has none
        return (
            badge,
            page,
            api_row["paused_ms"],
            web.get(f"/queues/{q.name}/api").json()["paused_ms"],
        )

    assert seen() == (False, ACTIVE, None, None)
    q.pause()
    paused_ms = q.counts().paused_ms
    assert paused_ms is not None
    assert seen() == (True, PAUSED, paused_ms, paused_ms)
    row = overview_row(web.get("/").text, q.name)
    assert f'title="paused since {fmt_time(paused_ms)}"' in row
    q.resume()
    assert seen() == (False, ACTIVE, None, None)


def test_a_partitioned_queue_is_paused_and_resumed_whole(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    ids = pq.enqueue_many([JobSpec("mail.send", {"i": i}) for i in range(6)])
    with TestClient(create_app(client=client, queues=[pq.name], auth=Auth())) as web:
        page = web.get(f"/queues/{pq.name}").text
        assert queue_state(page) == ACTIVE
        token = csrf_of(page)
        assert post(web, f"/queues/{pq.name}/pause", token)[0] == 303
        assert [p.counts().paused for p in pq.parts] == [True, True, True]
        assert all(p.claim("w").jobs == [] for p in pq.parts)
        assert queue_state(web.get(f"/queues/{pq.name}").text) == PAUSED
        row = overview_row(web.get("/").text, pq.name)
        assert shown(tag(row, 'class="state state-paused"'))
        api = web.get(f"/queues/{pq.name}/api").json()
        assert api["paused_ms"] == pq.counts().paused_ms is not None
        assert api["paused_partitions"] == list(pq.layout.names)
        assert not shown(tag(web.get(f"/queues/{pq.name}").text, 'id="paused-partly"'))

        assert post(web, f"/queues/{pq.name}/resume", token)[0] == 303
        assert [p.counts().paused for p in pq.parts] == [False, False, False]
        assert queue_state(web.get(f"/queues/{pq.name}").text) == ACTIVE

        # One partition paused on its own: the queue shows paused, "partly", with both buttons.
        pq.parts[1].pause()
        page = web.get(f"/queues/{pq.name}").text
        assert queue_state(page) == {**PAUSED, "pause": True}
        assert (
            shown(tag(page, 'id="paused-partly"'))
            and "in <span data-paused-count>1</span> of its 3" in page
        )
        api = web.get(f"/queues/{pq.name}/api").json()
        assert (api["paused_ms"], api["paused_partitions"]) == (
            pq.parts[1].counts().paused_ms,
            [pq.parts[1].name],
        )
        r = web.post(f"/queues/{pq.name}/pause", data={"csrf": token})  # completes the pause
        assert PAUSED_NOTICE in r.text and queue_state(r.text) == PAUSED
        assert not shown(tag(r.text, 'id="paused-partly"'))
        assert [p.counts().paused for p in pq.parts] == [True, True, True]
        pq.parts[0].resume()
        r = web.post(f"/queues/{pq.name}/resume", data={"csrf": token})
        assert RESUMED_NOTICE in r.text and queue_state(r.text) == ACTIVE
        assert [p.counts().paused for p in pq.parts] == [False, False, False]
    assert sum(len(p.claim("w", limit=10).jobs) for p in pq.parts) == len(ids)


def test_a_pause_of_a_queue_with_no_keys_is_refused_and_writes_nothing(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    q.enqueue("mail.send", None)
    typo = Queue(client, q.name + "-typo")
    # Outside the dashboard's queue list: 404 (tests/test_dashboard_queue_scope.py).
    token = csrf_of(web.get(f"/queues/{q.name}").text)
    assert post(web, f"/queues/{typo.name}/pause", token)[0] == 404
    # A dashboard of every queue: a name with no keys is refused, not paused.
    with TestClient(create_app(client=client, auth=Auth())) as every:
        token = csrf_of(every.get(f"/queues/{q.name}").text)
        r = every.post(f"/queues/{typo.name}/pause", data={"csrf": token})
        assert r.status_code == 400 and "no queue named" in r.text
        assert dump_queue(client, typo) == {}
        assert post(every, f"/queues/{typo.name}/resume", token)[0] == 303  # writes nothing
    assert dump_queue(client, typo) == {}
    # A queue the dashboard was told to show is paused even before its first job.
    empty = Queue(client, q.name + "-empty")
    try:
        with make_client(client, empty) as shown_web:
            own = csrf_of(shown_web.get(f"/queues/{empty.name}").text)
            assert post(shown_web, f"/queues/{empty.name}/pause", own)[0] == 303
        assert empty.counts().paused
    finally:
        delete_queue(client, empty)


def test_the_buttons_and_the_redirect_stay_under_a_mount_prefix(
    client: redis.Redis, q: Queue
) -> None:
    q.enqueue("mail.send", None)
    outer = Starlette(
        routes=[Mount("/ops", app=create_app(client=client, queues=[q.name], auth=Auth()))]
    )
    with TestClient(outer) as web:
        page = web.get(f"/ops/queues/{q.name}").text
        assert f'action="/ops/queues/{q.name}/pause"' in page
        r = post(web, f"/ops/queues/{q.name}/pause", csrf_of(page))
        assert r[0] == 303 and r[1].startswith(f"/ops/queues/{q.name}?notice=queue-paused&sig=")
    assert q.counts().paused


def test_a_get_of_any_page_changes_no_key(
    client: redis.Redis, q: Queue, pq: PartitionedQueue
) -> None:
    q.enqueue("mail.send", None)
    pq.enqueue_many([JobSpec("mail.send", None) for _ in range(3)])
    pages = ["/", "/api/overview", "/schedules", "/workers", "/health"]
    for name in (q.name, pq.name):
        pages += [f"/queues/{name}", f"/queues/{name}/api", f"/queues/{name}/dead"]
    actions = [f"/queues/{n}/{verb}" for n in (q.name, pq.name) for verb in ("pause", "resume")]

    def dump() -> list[dict[str, object]]:
        return [dump_queue(client, x) for x in (q, *pq.parts)]

    with TestClient(create_app(client=client, queues=[q.name, pq.name], auth=Auth())) as both:
        for paused in (False, True):
            if paused:
                q.pause()
                pq.pause()
            before = dump()
            codes = {p: both.get(p).status_code for p in pages + actions}
            assert codes == {**dict.fromkeys(pages, 200), **dict.fromkeys(actions, 405)}
            assert dump() == before
            assert q.counts().paused is paused and pq.counts().paused is paused
