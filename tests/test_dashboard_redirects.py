"""Where an action lands, and which Origin it is taken from (tests/test_dashboard_actions_review.py
has the reviewer's cases): the redirect goes back to the tab, filter or offset the button was
pressed on, with its notice; an Origin passes when it names the request's Host or a name the
operator gave (`--allow-host`, `allowed_hosts`), never another port of a loopback name, `null`
or a malformed one."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler.admin.worker_stop import ask_stop
from scheduler.cli.main import main
from scheduler.core.errors import CorruptKey
from scheduler.dashboard import Auth, create_app
from scheduler.dashboard.security import local_hosts
from tests.conftest import dump_queue
from tests.test_dashboard import csrf_of, dead_job
from tests.test_dashboard_actions_review import error, notice, web_of
from tests.test_worker_remote_stop import beat


@pytest.fixture
def web(client: redis.Redis, q: Queue) -> Iterator[TestClient]:
    with web_of(client, q) as t:
        yield t


def form_action(page: str, ends: str) -> str:
    """The action URL of the page's form posting to `.../<ends>`, unescaped."""
    found = re.findall(rf'<form method="post" action="([^"]*/{ends}(?:\?[^"]*)?)"', page)
    assert found, f"no form posting to {ends}"
    return html.unescape(found[0])


# -- the Origin check -------------------------------------------------------------------------


def proxied(client: redis.Redis, q: Queue, *extra: str) -> TestClient:
    """A dashboard without auth on loopback (the CLI's Host names plus `extra`, as given with
    --allow-host), reached through a proxy that sends `Host: 127.0.0.1:8080`."""
    app = create_app(client=client, queues=[q.name], auth=Auth(),
                     allowed_hosts=local_hosts("127.0.0.1", extra))  # fmt: skip
    return TestClient(app, base_url="http://127.0.0.1:8080")


@pytest.mark.parametrize(
    "origin",
    [
        "https://dash.example.com",  # the proxy's name, not given with --allow-host
        "https://attacker.example",  # a rebinding page through that proxy
        "http://localhost:3000",  # another local server's page: a loopback name, another port
        "http://127.0.0.1:3000",
        "null",
        "http://[::1",  # malformed: refused, no server error
        "",
    ],
)
def test_an_origin_neither_the_host_nor_a_name_given_is_refused(
    client: redis.Redis, q: Queue, origin: str
) -> None:
    with proxied(client, q) as web:
        token = csrf_of(web.get(f"/queues/{q.name}").text)
        r = web.post(f"/queues/{q.name}/pause", data={"csrf": token}, headers={"origin": origin})
    assert r.status_code == 403, (r.status_code, r.text[:100])
    assert not q.counts().paused


@pytest.mark.parametrize("origin", ["https://DASH.example.com", "http://dash.example.com:8443"])
def test_an_origin_of_a_name_given_passes_whatever_the_port_and_scheme(
    client: redis.Redis, q: Queue, origin: str
) -> None:
    with proxied(client, q, "dash.example.com") as web:
        token = csrf_of(web.get(f"/queues/{q.name}").text)
        r = web.post(f"/queues/{q.name}/pause", data={"csrf": token}, headers={"origin": origin},
                     follow_redirects=False)  # fmt: skip
        other = web.post(f"/queues/{q.name}/resume", data={"csrf": token},
                         headers={"origin": "https://other.example.com"})  # fmt: skip
    assert r.status_code == 303
    assert other.status_code == 403  # only the name given
    assert q.counts().paused


def test_the_request_host_itself_still_passes_and_any_host_trusts_no_other_origin(
    client: redis.Redis, q: Queue
) -> None:
    """allowed_hosts=None (authentication set, or a mount that checks no Host): an Origin must
    name the request's Host, as before."""
    with web_of(client, q) as web:  # Host: testserver
        token = csrf_of(web.get(f"/queues/{q.name}").text)
        refused = web.post(f"/queues/{q.name}/pause", data={"csrf": token},
                           headers={"origin": "https://dash.example.com"})  # fmt: skip
        assert refused.status_code == 403
        ok = web.post(f"/queues/{q.name}/pause", data={"csrf": token},
                      headers={"origin": "https://testserver"})  # fmt: skip
    assert (notice(ok.text) or "").startswith("Paused the queue")


# -- where the redirect lands -----------------------------------------------------------------


@pytest.mark.parametrize("scope", ["selected", "matching"])
def test_a_dead_letters_action_and_its_cancel_keep_every_filter(
    client: redis.Redis, q: Queue, web: TestClient, scope: str
) -> None:
    job = dead_job(q, error="Boom")
    query = "task=mail.send&error_type=Boom&older_than=0s"
    page = web.get(f"/queues/{q.name}/dead?{query}")
    assert job in page.text
    form = {"csrf": csrf_of(page.text), "do": f"requeue:{scope}", "ids": job,
            "task": "mail.send", "error_type": "Boom", "older_than": "0s"}  # fmt: skip
    confirm = web.post(f"/queues/{q.name}/dead/confirm", data=form)
    (cancel,) = re.findall(r'<a href="([^"]*)">Cancel</a>', confirm.text)
    assert html.unescape(cancel) == f"/queues/{q.name}/dead?{query}"
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', confirm.text))
    r = web.post(f"/queues/{q.name}/dead/apply", data=fields, follow_redirects=False)
    assert r.headers["location"].startswith(f"/queues/{q.name}/dead?notice=requeued&n=1&{query}&")
    landed = web.get(r.headers["location"])
    assert notice(landed.text) == "Requeued 1 dead job(s)."
    assert 'name="task" maxlength="200" value="mail.send"' in landed.text


def test_an_unfiltered_dead_letters_action_lands_on_the_plain_page(
    q: Queue, web: TestClient
) -> None:
    job = dead_job(q)
    page = web.get(f"/queues/{q.name}/dead")
    form = {"csrf": csrf_of(page.text), "action": "purge", "scope": "selected", "ids": job,
            "task": "", "error_type": "", "older_than": ""}  # fmt: skip
    confirm = web.post(f"/queues/{q.name}/dead/confirm", data={**form, "do": "purge:selected"})
    assert f'<a href="/queues/{q.name}/dead">Cancel</a>' in confirm.text
    r = web.post(f"/queues/{q.name}/dead/apply", data=form, follow_redirects=False)
    assert r.headers["location"].startswith(f"/queues/{q.name}/dead?notice=purged&n=1&sig=")


@pytest.mark.parametrize("verb", ["pause", "resume"])
def test_pause_and_resume_keep_the_queue_pages_tab_and_search(
    q: Queue, web: TestClient, verb: str
) -> None:
    q.enqueue("mail.send", {})
    if verb == "resume":
        q.pause()
    page = web.get(f"/queues/{q.name}?state=held&task=mail.send&limit=20")
    action = form_action(page.text, verb)
    assert action == f"/queues/{q.name}/{verb}?state=held&task=mail.send&limit=20"
    r = web.post(action, data={"csrf": csrf_of(page.text)}, follow_redirects=False)
    assert r.headers["location"].startswith(
        f"/queues/{q.name}?notice=queue-{verb}d&state=held&task=mail.send&limit=20&sig="
    )
    landed = web.get(r.headers["location"])  # the tab's state is in the notice's signature
    assert (notice(landed.text) or "").startswith("Paused" if verb == "pause" else "Resumed")
    assert f'href="/queues/{q.name}?state=held" class="on"' in landed.text


def test_the_forms_do_not_carry_the_last_notice(q: Queue, web: TestClient) -> None:
    """The page after an action (?notice=...&sig=...): its forms' actions carry the page's own
    query only."""
    page = web.get(f"/queues/{q.name}")
    r = web.post(f"/queues/{q.name}/pause", data={"csrf": csrf_of(page.text)})
    assert notice(r.text)
    assert form_action(r.text, "resume") == f"/queues/{q.name}/resume"


def test_a_schedule_action_keeps_the_pages_offset(q: Queue, web: TestClient) -> None:
    q.schedule("nightly", "mail.send", every_ms=60_000)
    page = web.get("/schedules?offset=0")
    action = form_action(page.text, "pause")
    assert action.endswith("/schedules/nightly/pause?offset=0")
    r = web.post(action, data={"csrf": csrf_of(page.text)}, follow_redirects=False)
    assert r.headers["location"].startswith("/schedules?notice=paused&offset=0&sig=")
    assert notice(web.get(r.headers["location"]).text)


def test_a_worker_action_keeps_the_pages_offsets(q: Queue, web: TestClient) -> None:
    beat(q, "w1")
    page = web.get("/workers?offset=0&from=0")
    action = form_action(page.text, "quiet")
    assert action == f"/queues/{q.name}/workers/quiet?offset=0&from=0"
    r = web.post(action, data={"csrf": csrf_of(page.text), "worker": "w1"},
                 follow_redirects=False)  # fmt: skip
    assert r.headers["location"].startswith("/workers?notice=")
    assert "&offset=0&from=0&sig=" in r.headers["location"]


def test_a_kept_value_is_encoded_and_an_overlong_one_dropped(q: Queue, web: TestClient) -> None:
    """A hand-made action URL: the values are re-encoded into the redirect's query (no header
    or path of the attacker's making), a value past 200 characters is left out."""
    page = web.get(f"/queues/{q.name}")
    r = web.post(
        f"/queues/{q.name}/pause?task=a%26notice%3Dx%0d%0aX: 1&offset=" + "9" * 201,
        data={"csrf": csrf_of(page.text)},
        follow_redirects=False,
    )
    location = r.headers["location"]
    assert location.startswith(f"/queues/{q.name}?notice=queue-paused&task=a%26notice%3Dx%0D%0AX")
    assert "offset" not in location


# -- a worker's presence hash of another type: the same words in the dashboard and the CLI ----


def test_stop_of_a_worker_whose_presence_hash_is_another_type_names_the_key(
    redis_url: str, client: redis.Redis, q: Queue, web: TestClient
) -> None:
    beat(q, "w1")
    page = web.get("/workers")
    client.delete(q.keys.worker("w1"))
    client.set(q.keys.worker("w1"), "edited")
    before = dump_queue(client, q)
    r = web.post(
        f"/queues/{q.name}/workers/stop", data={"csrf": csrf_of(page.text), "worker": "w1"}
    )
    said = (f"worker 'w1': its presence hash {q.keys.worker('w1')} holds another type "
            "(edited by hand): nothing asked; delete it, the worker's next beat writes it "
            "again")  # fmt: skip
    assert r.status_code == 400 and error(r.text) == said
    # ask_stop's error is a CorruptKey: a ResponseError still, as the WRONGTYPE it raised before.
    with pytest.raises(CorruptKey, match=re.escape(said)):
        ask_stop(client, [q.keys], "w1", "stop")
    # The CLI stops before it (the listing of live workers reads every presence hash).
    res = CliRunner().invoke(main, ["workers", "stop", "w1", "-q", q.name, "--url", redis_url])
    assert res.exit_code == 1 and "a key edited by hand? `scheduler doctor`" in res.output
    assert dump_queue(client, q) == before
    client.delete(q.keys.worker("w1"))
    beat(q, "w1")  # as the worker's next beat writes it
    r = web.post(
        f"/queues/{q.name}/workers/stop", data={"csrf": csrf_of(page.text), "worker": "w1"}
    )
    assert notice(r.text) and r.status_code == 200
