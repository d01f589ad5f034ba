"""Review of the dashboard's /schedules actions (pause, resume, remove, run now) on a
partitioned queue and on plain queues under edge cases: the logical name against a partition's
physical name in the URL, a schedule removed or edited by hand between the page and the action,
CSRF / Origin, the page's offset kept by the redirect, the served-queues list. Starlette's
TestClient on the test run's private Redis (no browser). The three defects it found (strict
xfails once) are fixed."""

from __future__ import annotations

import html
import re
import uuid

import pytest
import redis
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.partitions import meta_key
from scheduler.dashboard import Auth, create_app
from scheduler.dashboard.pages import OVERVIEW_SHOWN
from scheduler.dashboard.render import NOTICES
from tests.conftest import delete_queue, dump_queue
from tests.fixtures.partitioned import MakePq

HOUR_MS = 3_600_000
VERBS = ("pause", "resume", "remove", "run")


def app(client: redis.Redis, queues: list[str] | None = None) -> TestClient:
    made = create_app(client=client, queues=queues or [], auth=Auth())
    return TestClient(made, raise_server_exceptions=False)


def token(web: TestClient, path: str = "/schedules") -> str:
    m = re.search(r'name="csrf" value="([0-9a-f]{64})"', web.get(path).text)
    assert m is not None, f"no CSRF field on {path}"
    return m.group(1)


def post(web: TestClient, path: str, csrf: str | None, **kw: object) -> tuple[int, str]:
    data = {} if csrf is None else {"csrf": csrf}
    r = web.post(path, data=data, follow_redirects=False, **kw)  # type: ignore[arg-type]
    return r.status_code, r.headers.get("location", r.text)


def shown_notice(web: TestClient, location: str) -> str:
    page = html.unescape(web.get(location).text)  # a notice's "schedule's" is &#39; on the page
    return next((t for t in NOTICES.values() if t in page), "")


def part_of(pq: PartitionedQueue, name: str) -> Queue:
    return pq.parts[pq.layout.partition_of_schedule(name)]


def dump_all(client: redis.Redis, pq: PartitionedQueue) -> list[dict[str, object]]:
    return [dump_queue(client, p) for p in pq.parts]


# -- a partitioned queue -------------------------------------------------------------------


def test_the_page_posts_to_the_schedules_partition_and_acts_on_that_schedule_only(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    pq.schedule("nightly", "report", every_ms=HOUR_MS)
    pq.schedule("hourly", "report", every_ms=HOUR_MS)
    part = part_of(pq, "nightly").name
    with app(client, [pq.name]) as web:  # a served list: a listed queue's partition is served
        page = web.get("/schedules").text
        assert f'action="/queues/{part}/schedules/nightly/pause"' in page
        code, location = post(web, f"/queues/{part}/schedules/nightly/pause", token(web))
        assert code == 303 and shown_notice(web, location) == NOTICES["paused"]
        assert pq.get_schedule("nightly").paused and not pq.get_schedule("hourly").paused
        code, location = post(web, f"/queues/{part}/schedules/nightly/resume", token(web))
        assert code == 303 and shown_notice(web, location) == NOTICES["resumed"]
        assert not pq.get_schedule("nightly").paused


def test_another_queues_partition_or_a_lookalike_is_not_served_and_nothing_is_written(
    client: redis.Redis, make_pq: MakePq
) -> None:
    served = make_pq(partitions=2)
    other = make_pq(partitions=2, suffix="-other")
    other.schedule("nightly", "report", every_ms=HOUR_MS)
    lookalike = Queue(client, f"{served.name}.p7")  # named like a partition, not one
    lookalike.schedule("nightly", "report", every_ms=HOUR_MS)
    try:
        before = [*dump_all(client, other), dump_queue(client, lookalike)]
        with app(client, [served.name]) as web:
            csrf = token(web, f"/queues/{served.name}/dead")
            for queue in (part_of(other, "nightly").name, lookalike.name):
                for verb in VERBS:
                    assert post(web, f"/queues/{queue}/schedules/nightly/{verb}", csrf)[0] == 404
        assert [*dump_all(client, other), dump_queue(client, lookalike)] == before
    finally:
        delete_queue(client, lookalike)


@pytest.mark.parametrize("verb", VERBS)
def test_an_action_on_the_logical_name_reaches_the_schedules_partition(
    client: redis.Redis, pq: PartitionedQueue, verb: str
) -> None:
    # The dashboard shows a partitioned queue as ONE queue and the CLI's `schedules pause -q
    # emails nightly` goes to the schedule's partition: the logical name in the URL (a script,
    # a bookmark, a link from the logical queue's pages) should do the same.
    pq.schedule("nightly", "report", every_ms=HOUR_MS)
    if verb == "resume":
        pq.pause_schedule("nightly")
    with app(client, [pq.name]) as web:
        code, location = post(web, f"/queues/{pq.name}/schedules/nightly/{verb}", token(web))
        assert code == 303, location
        if verb == "run":
            assert "/jobs/" in location and shown_notice(web, location) == NOTICES["ran-now"]
            return
        want = {"pause": "paused", "resume": "resumed", "remove": "removed"}[verb]
        assert shown_notice(web, location) == NOTICES[want]
    if verb == "remove":
        assert pq.list_schedules() == []
    else:
        assert pq.get_schedule("nightly").paused == (verb == "pause")


def test_run_now_after_the_layout_record_was_edited_into_another_type_is_no_500(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    pq.schedule("nightly", "report", every_ms=HOUR_MS)
    part = part_of(pq, "nightly").name
    layout = client.get(meta_key(pq.name))
    with app(client) as web:  # every queue served: a partition's URL needs no layout read
        csrf = token(web, f"/queues/{part}/dead")  # a page with a form, no discovery
        client.delete(meta_key(pq.name))
        client.hset(meta_key(pq.name), "by", "hand")  # the page was loaded before the edit
        try:
            code, text = post(web, f"/queues/{part}/schedules/nightly/run", csrf)
        finally:
            client.delete(meta_key(pq.name))
            client.set(meta_key(pq.name), str(layout))
    # A 400 naming the record (as its pages say), or the run made untagged: not a 500.
    assert code in (303, 400), text[:300]
    # Made untagged: another queue's damaged record does not block a run in this one.
    assert code == 303 and f"/queues/{part}/jobs/" in text


# -- plain queues: stale pages, hand edits, guards, paging -----------------------------------


@pytest.mark.parametrize("verb", ["pause", "resume", "remove"])
def test_a_schedule_removed_meanwhile_is_said_nothing_written_and_the_offset_kept(
    client: redis.Redis, q: Queue, verb: str
) -> None:
    q.schedule("hourly", "mail.send", every_ms=HOUR_MS)
    with app(client, [q.name]) as web:
        csrf = token(web)
        q.remove_schedule("hourly")
        before = dump_queue(client, q)
        code, location = post(web, f"/queues/{q.name}/schedules/hourly/{verb}?offset=7", csrf)
        assert code == 303 and location.startswith("/schedules?notice=no-schedule")
        assert "offset=7" in location
        assert shown_notice(web, location) == NOTICES["no-schedule"]
    assert dump_queue(client, q) == before


@pytest.mark.parametrize("verb", VERBS)
def test_without_a_token_from_another_origin_or_read_only_nothing_is_written(
    client: redis.Redis, q: Queue, verb: str
) -> None:
    q.schedule("hourly", "mail.send", every_ms=HOUR_MS)
    url = f"/queues/{q.name}/schedules/hourly/{verb}"
    before = dump_queue(client, q)
    with app(client, [q.name]) as web:
        csrf = token(web)
        assert post(web, url, None)[0] == 403
        assert post(web, url, "f" * 64)[0] == 403
        assert post(web, url, csrf, headers={"origin": "https://evil.example"})[0] == 403
        assert post(web, url, csrf, headers={"origin": "null"})[0] == 403
        assert web.get(url).status_code == 405
    with TestClient(create_app(client=client, queues=[q.name], auth=Auth(), read_only=True)) as ro:
        assert post(ro, url, token(ro, f"/queues/{q.name}/dead"))[0] == 403
    assert dump_queue(client, q) == before


def test_an_unknown_verb_or_an_invalid_name_is_a_400_writing_nothing(
    client: redis.Redis, q: Queue
) -> None:
    q.schedule("hourly", "mail.send", every_ms=HOUR_MS)
    before = dump_queue(client, q)
    with app(client, [q.name]) as web:
        csrf = token(web)
        assert post(web, f"/queues/{q.name}/schedules/hourly/delete", csrf)[0] == 400
        assert post(web, f"/queues/{q.name}/schedules/bad%20name/pause", csrf)[0] == 400
        assert post(web, f"/queues/{q.name}/schedules/bad%20name/run", csrf)[0] == 400
    assert dump_queue(client, q) == before


def test_a_hash_edited_into_another_type_gives_typed_answers_and_remove_clears_it(
    client: redis.Redis, q: Queue
) -> None:
    q.schedule("hourly", "mail.send", every_ms=HOUR_MS)
    key = q.keys.schedule("hourly")
    with app(client, [q.name]) as web:
        csrf = token(web)
        client.delete(key)
        client.rpush(key, "by hand")
        for verb in ("pause", "resume", "run"):  # pause said "no such schedule" before
            code, text = post(web, f"/queues/{q.name}/schedules/hourly/{verb}", csrf)
            assert code == 400 and "unreadable" in text, (verb, code)
        assert client.type(key) == "list"  # the refused calls wrote nothing
        code, location = post(web, f"/queues/{q.name}/schedules/hourly/remove", csrf)
        assert code == 303 and shown_notice(web, location) == NOTICES["removed"]
    assert not client.exists(key) and not client.sismember(q.keys.schedules, "hourly")


@pytest.mark.parametrize("edit", ["another type", "hash deleted"])
def test_a_schedule_edited_by_hand_is_shown_flagged_not_hidden(
    client: redis.Redis, q: Queue, edit: str
) -> None:
    q.schedule("a-broken", "mail.send", every_ms=HOUR_MS)
    q.schedule("b-fine", "mail.send", every_ms=HOUR_MS)
    key = q.keys.schedule("a-broken")
    client.delete(key)
    if edit == "another type":
        client.set(key, "by hand")
    with app(client, [q.name]) as web:
        page = web.get("/schedules").text
    assert 'data-schedule="b-fine"' in page
    # Documented: a definition the scripts cannot read is shown flagged (its runs stopped);
    # a row lets the operator press Remove, which clears both edits (schedule_remove.lua).
    assert 'data-schedule="a-broken"' in page
    row = page.split('data-schedule="a-broken"', 1)[1].split("</tr>", 1)[0]
    assert "unreadable (" in row and "/schedules/a-broken/remove" in row
    assert "/schedules/a-broken/run" not in row  # no Run now of a definition not read
    assert "schedules-cut" not in page  # both shown: no "the first 1 of 2"
    assert [s.name for s in q.list_schedules()] == ["b-fine"]  # the API: readable ones only


def test_the_second_page_of_queues_keeps_its_offset_through_an_action(
    client: redis.Redis, q: Queue
) -> None:
    # Queue names sort before q's (t-...), so q's schedule is on the second page of queues.
    fillers = [f"a-{uuid.uuid4().hex[:6]}-{i:03d}" for i in range(OVERVIEW_SHOWN)]
    q.schedule("hourly", "mail.send", every_ms=HOUR_MS)
    with app(client, [*fillers, q.name]) as web:
        assert 'data-schedule="hourly"' not in web.get("/schedules").text
        page = web.get(f"/schedules?offset={OVERVIEW_SHOWN}").text
        action = f"/queues/{q.name}/schedules/hourly/pause?offset={OVERVIEW_SHOWN}"
        assert f'action="{action}"' in page
        code, location = post(web, action, token(web, f"/schedules?offset={OVERVIEW_SHOWN}"))
        assert code == 303 and f"offset={OVERVIEW_SHOWN}" in location
        back = web.get(location).text
        assert NOTICES["paused"] in back and 'data-schedule="hourly"' in back
    assert q.get_schedule("hourly").paused
