"""The dashboard's actions (POST), from a review: a button pressed on a stale page (the job or
record changed since the page was drawn), a double submit, a record edited by hand into another
type, malformed form input, the Origin check behind a proxy, and where the redirect after an
action lands. Each test says what it pins; those that fail on the code as reviewed say
"Defect" in their docstring."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

import pytest
import redis
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler.dashboard import Auth, create_app
from scheduler.dashboard.security import local_hosts
from tests.conftest import delete_queue, dump_queue, job_keys, new_queue
from tests.test_dashboard import csrf_of, dead_job
from tests.test_worker_remote_stop import beat


def web_of(c: redis.Redis, q: Queue, **kwargs: object) -> TestClient:
    """A client of a dashboard serving `q`; a server error is a 500 answer, not a raise."""
    kwargs.setdefault("auth", Auth())
    app = create_app(client=c, queues=[q.name], **kwargs)  # type: ignore[arg-type]
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture
def web(client: redis.Redis, q: Queue) -> Iterator[TestClient]:
    with web_of(client, q) as t:
        yield t


def notice(text: str) -> str | None:
    m = re.search(r'<p class="notice" role="status">(.*?)</p>', text, re.DOTALL)
    return html.unescape(m.group(1)) if m else None


def error(text: str) -> str | None:
    m = re.search(r'<p class="error">(.*?)</p>', text, re.DOTALL)
    return html.unescape(m.group(1)) if m else None


def hidden_inputs(page: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for k, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page):
        out.setdefault(k, []).append(html.unescape(v))
    return out


def token_of(web: TestClient, q: Queue) -> str:
    return csrf_of(web.get(f"/queues/{q.name}/dead").text)  # a form whatever the queue holds


# -- stale pages: the job changed since the page was drawn ------------------------------------


def test_purge_selected_from_a_stale_page_leaves_a_job_requeued_meanwhile(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    """Held: the dead page was drawn, another operator requeued the job (now due): a Purge
    of the selection deletes nothing and says 0."""
    job = dead_job(q)
    token = token_of(web, q)
    form = {"csrf": token, "do": "purge:selected", "ids": job}
    confirm = web.post(f"/queues/{q.name}/dead/confirm", data=form)
    assert confirm.status_code == 200
    assert q.requeue_dead([job]) == 1  # meanwhile, elsewhere
    r = web.post(f"/queues/{q.name}/dead/apply", data=hidden_inputs(confirm.text))
    assert notice(r.text) == "Purged 0 dead job(s)."
    assert q.status(job) == "due"
    assert client.exists(q.keys.spec(job)) or client.exists(q.keys.job(job))


def test_requeue_selected_from_a_stale_page_leaves_a_job_leased_meanwhile(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    """Held: the job was requeued elsewhere and a worker holds it now: a Requeue of the stale
    selection neither moves it nor takes its lease (its token still completes it)."""
    job = dead_job(q)
    token = token_of(web, q)
    q.requeue_dead([job])
    (leased,) = q.claim("w-2", limit=1).jobs
    r = web.post(
        f"/queues/{q.name}/dead/apply",
        data={"csrf": token, "action": "requeue", "scope": "selected", "ids": job},
    )
    assert notice(r.text) == "Requeued 0 dead job(s)."
    assert q.status(job) == "leased"
    q.complete(job, leased.token, {"ok": True})
    assert q.status(job) == "done"


def test_a_double_submitted_requeue_says_the_second_did_nothing(q: Queue, web: TestClient) -> None:
    """Held: the job page's Requeue pressed twice (two tabs, a reload of the POST): the job is
    requeued once, the second answer names its state."""
    job = dead_job(q)
    token = csrf_of(web.get(f"/queues/{q.name}/jobs/{job}").text)
    first = web.post(f"/queues/{q.name}/jobs/{job}/requeue", data={"csrf": token})
    second = web.post(f"/queues/{q.name}/jobs/{job}/requeue", data={"csrf": token})
    assert notice(first.text) == "Requeued 1 dead job(s)."
    assert notice(second.text) == "Nothing requeued: the job is due, not a dead letter."
    assert [j.id for j in q.list_jobs("due")] == [job]


def test_cancel_of_a_job_finished_meanwhile_keeps_its_outcome(q: Queue, web: TestClient) -> None:
    """Held: the page showed the job due with a Cancel button; a worker ran it meanwhile."""
    job = q.enqueue("mail.send", {"i": 1})
    page = web.get(f"/queues/{q.name}/jobs/{job}").text
    assert 'id="cancel-job"' in page
    (leased,) = q.claim("w-1", limit=1).jobs
    q.complete(job, leased.token, {"sent": 1})
    r = web.post(f"/queues/{q.name}/jobs/{job}/cancel", data={"csrf": csrf_of(page)})
    assert notice(r.text) == "Nothing cancelled: the job was already done."
    assert q.status(job) == "done"


def test_cancel_of_a_job_gone_meanwhile_says_nothing_was_cancelled(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    """Defect: the page showed the job due; it ran and its record expired (or was deleted)
    before Cancel was pressed. Cancel answers a 400 "Bad request" page (`no job 'x'`: the
    JobNotFound of Queue.cancel, not caught at actions.py:131), where
    Requeue and Run now on the same stale page say "Nothing ...: the job is missing" and
    docs/dashboard.md says an action names what the call did ("Nothing cancelled: ...")."""
    job = q.enqueue("mail.send", {"i": 1})
    page = web.get(f"/queues/{q.name}/jobs/{job}").text
    assert 'id="cancel-job"' in page
    (leased,) = q.claim("w-1", limit=1).jobs
    q.complete(job, leased.token, None)
    client.delete(*job_keys(client, q, job))  # what the record's expiry does
    client.zrem(q.keys.finished, job)
    r = web.post(f"/queues/{q.name}/jobs/{job}/cancel", data={"csrf": csrf_of(page)})
    assert r.status_code != 400, f"a stale Cancel is a 'Bad request': {error(r.text)!r}"
    assert (notice(r.text) or "").startswith("Nothing cancelled"), notice(r.text)


# -- records edited by hand into another type -------------------------------------------------


def test_stop_of_a_worker_whose_presence_hash_is_another_type_is_no_server_error(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    """Defect: the workers page showed w1 with its Stop button; its presence hash was then
    edited by hand into a string. Stop answers a bare 500 (a WRONGTYPE from ask_stop's
    pipeline: admin/worker_stop.py:77), where `scheduler workers stop w1` says "a key edited by
    hand? scheduler doctor" and every other action a 400 naming the key."""
    beat(q, "w1")
    page = web.get("/workers").text
    assert f'action="/queues/{q.name}/workers/stop"' in page
    token = token_of(web, q)
    client.delete(q.keys.worker("w1"))
    client.set(q.keys.worker("w1"), "edited")
    before = dump_queue(client, q)
    r = web.post(f"/queues/{q.name}/workers/stop", data={"csrf": token, "worker": "w1"})
    assert r.status_code < 500, r.text[:200]
    assert dump_queue(client, q) == before


@pytest.mark.parametrize("path", ["confirm", "apply"])
@pytest.mark.parametrize("task", ["", "mail.send"])
def test_all_matching_with_a_dead_index_of_another_type_is_no_server_error(
    client: redis.Redis, q: Queue, web: TestClient, path: str, task: str
) -> None:
    """Defect: "Requeue / Purge all matching" when the dead ZSET was edited by hand into
    another type answers a bare 500 (dead.py:199 _matching_count's ZCOUNT, dead.py:192-193
    _matching_ids' scan), where the dead page and the queue page say "a key of the queue
    holds another type ... see `scheduler doctor`" (400) and the job page's Requeue too."""
    dead_job(q)
    token = token_of(web, q)  # the page drawn before the edit
    client.delete(q.keys.dead)
    client.hset(q.keys.dead, "edited", "1")
    before = dump_queue(client, q)
    form = {"csrf": token, "do": "purge:matching", "task": task}
    r = web.post(f"/queues/{q.name}/dead/{path}", data=form)
    assert r.status_code < 500, r.text[:200]
    assert "scheduler doctor" in (error(r.text) or "")
    assert dump_queue(client, q) == before


# -- malformed form input: refused, nothing changed -------------------------------------------


@pytest.mark.parametrize(
    "form",
    [
        {"do": "purge:selected", "ids": "\u00e9"},
        {"do": "purge:selected", "ids": "a" * 129},
        {"do": "purge:selected"},
        {"do": "purge:selected", "ids": [f"id{i}" for i in range(501)]},
        {"do": "delete:selected", "ids": "x"},
        {"do": "purge:everything"},
        {"do": "purge:matching", "older_than": "2 weeks"},
        {"do": "purge:matching", "task": "t" * 201},
        {"action": "purge", "scope": "matching", "upto_ms": "\u00b2"},
        {"action": "purge", "scope": "matching", "count": "-1"},
        {"action": "purge", "scope": "matching", "upto_ms": "9" * 16},
    ],
)
def test_a_malformed_dead_letters_form_is_a_400_and_changes_nothing(
    client: redis.Redis, q: Queue, web: TestClient, form: dict[str, object]
) -> None:
    """Held: a hand-made or damaged form is refused by the apply with 400 before anything is
    changed (no purge of everything by a form missing its selection); the confirmation page,
    which changes nothing and reads neither upto_ms nor count, is no server error either."""
    job = dead_job(q)
    token = token_of(web, q)
    before = dump_queue(client, q)
    r = web.post(f"/queues/{q.name}/dead/confirm", data={"csrf": token, **form})
    assert r.status_code in (200, 400), (r.status_code, r.text[:200])
    r = web.post(f"/queues/{q.name}/dead/apply", data={"csrf": token, **form})
    assert r.status_code == 400, (r.status_code, r.text[:200])
    assert dump_queue(client, q) == before
    assert q.dead_ids() == [job]


def test_a_form_larger_than_the_cap_is_refused_and_changes_nothing(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    """Held: a body past MAX_FORM_BYTES is refused (403) without being acted on."""
    dead_job(q)
    token = token_of(web, q)
    before = dump_queue(client, q)
    r = web.post(
        f"/queues/{q.name}/dead/apply",
        data={"csrf": token, "do": "purge:matching", "task": "", "pad": "x" * 100_001},
    )
    assert r.status_code == 403
    assert dump_queue(client, q) == before


def test_a_stop_naming_another_queues_worker_writes_nothing_there(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    """Held: a dashboard serving one queue cannot stop another queue's worker by posting its
    id to its own queue's route: "no live worker", nothing written anywhere."""
    other = new_queue(client, "t-actrev-")
    try:
        beat(other, "w-other")
        before = (dump_queue(client, q), dump_queue(client, other))
        r = web.post(
            f"/queues/{q.name}/workers/stop",
            data={"csrf": token_of(web, q), "worker": "w-other"},
        )
        assert notice(r.text) == (
            "Nothing asked: no live worker by that id (it stopped meanwhile?)."
        )
        assert (dump_queue(client, q), dump_queue(client, other)) == before
    finally:
        delete_queue(client, other)


@pytest.mark.parametrize("verb", ["pause", "resume", "remove"])
def test_a_schedule_action_on_a_schedule_removed_meanwhile_writes_nothing(
    client: redis.Redis, q: Queue, web: TestClient, verb: str
) -> None:
    """Held: the schedules page was drawn, the schedule removed elsewhere; its button says so
    and leaves no key behind (no husk of the schedule)."""
    q.schedule("nightly", "mail.send", every_ms=60_000)
    page = web.get("/schedules").text
    token = csrf_of(page)
    q.remove_schedule("nightly")
    before = dump_queue(client, q)
    r = web.post(f"/queues/{q.name}/schedules/nightly/{verb}", data={"csrf": token})
    assert notice(r.text) == "Nothing changed: there is no such schedule (removed meanwhile?)."
    assert dump_queue(client, q) == before


def test_an_action_posted_with_origin_null_is_refused(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    """Held: `Origin: null` (a sandboxed frame, a page of file://) is not the dashboard's."""
    job = dead_job(q)
    token = token_of(web, q)
    r = web.post(
        f"/queues/{q.name}/jobs/{job}/requeue", data={"csrf": token}, headers={"origin": "null"}
    )
    assert r.status_code == 403
    assert q.status(job) == "dead"


# -- a proxy in front, and where the redirect lands -------------------------------------------


def test_actions_work_behind_a_proxy_that_sends_host_127_0_0_1(
    client: redis.Redis, q: Queue
) -> None:
    """Defect (fixed; the doc changed): docs/dashboard.md "Host names" said behind a local proxy
    "add that name with `--allow-host` (or have the proxy send `Host: 127.0.0.1`)". With the
    proxy sending `Host: 127.0.0.1` (nginx's default proxy_pass does) every action was refused
    403 "cross-origin request refused": the browser's Origin is the proxy's
    (https://dash.example.com), compared with the Host header the proxy sent. The Host alone
    cannot be the fix (a rebinding page's requests through the proxy carry it too), so the doc
    now says to name the proxy's name with `--allow-host` in both cases; an Origin naming it
    passes (tests/test_dashboard_redirects.py: one not named is still refused)."""
    app = create_app(client=client, queues=[q.name], auth=Auth(),
                     allowed_hosts=local_hosts("127.0.0.1", ["dash.example.com"]))  # fmt: skip
    with TestClient(app, base_url="http://127.0.0.1:8080") as proxied:
        page = proxied.get(f"/queues/{q.name}")
        assert page.status_code == 200
        r = proxied.post(
            f"/queues/{q.name}/pause",
            data={"csrf": csrf_of(page.text)},
            headers={"origin": "https://dash.example.com"},  # what the browser sends
            follow_redirects=False,
        )
    assert r.status_code == 303, (r.status_code, r.text[:100])
    assert q.counts().paused


def test_the_redirect_after_a_dead_letters_action_keeps_the_filter(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    """Defect: on the dead letters page filtered by task, "Requeue selected" then "Yes" lands
    on the unfiltered dead page (dead.py:248 redirects to /queues/<q>/dead with the notice
    only), and the confirmation's Cancel link drops the filter too (confirm.html): the
    operator working through one task's dead letters is shown every task's again."""
    mine = dead_job(q, {"i": 1})
    dead_job(q, {"i": 2})
    client.hset(q.keys.job(mine), "task", "report.build")
    page = web.get(f"/queues/{q.name}/dead?task=report.build")
    assert page.status_code == 200 and mine in page.text
    form = {"csrf": csrf_of(page.text), "do": "requeue:selected", "ids": mine,
            "task": "report.build", "error_type": "", "older_than": ""}  # fmt: skip
    confirm = web.post(f"/queues/{q.name}/dead/confirm", data=form)
    cancel = re.findall(r'<a href="([^"]*)">Cancel</a>', confirm.text)
    r = web.post(
        f"/queues/{q.name}/dead/apply", data=hidden_inputs(confirm.text), follow_redirects=False
    )
    assert r.status_code == 303
    assert q.status(mine) == "due"
    assert "task=report.build" in r.headers["location"], r.headers["location"]
    assert cancel and "task=report.build" in html.unescape(cancel[0]), cancel
