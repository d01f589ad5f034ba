"""The workers page's Quiet and Stop buttons (Starlette's TestClient, a real private Redis):
admin/worker_stop.ask_stop as a POST action like the others (CSRF token, Origin, read-only),
for a worker whose presence worker_beat wrote; the redirect's notice says what was done, or that
nothing was. Its effect on a real worker is tests/test_worker_remote_stop.py's."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import redis
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler.dashboard.render import NOTICES
from tests.conftest import dump_queue
from tests.test_dashboard import csrf_of, make_client
from tests.test_dashboard_pause import post
from tests.test_worker_remote_stop import beat


@pytest.fixture
def web(client: redis.Redis, q: Queue) -> Iterator[TestClient]:
    with make_client(client, q) as t:
        yield t


def row(page: str, worker: str) -> str:
    m = re.search(rf'<tr data-worker="{re.escape(worker)}">.*?</tr>', page, re.DOTALL)
    assert m, f"no row of worker {worker}"
    return m.group(0)


def ask(web: TestClient, queue: str, verb: str, worker: str, **kw: object) -> tuple[int, str]:
    """(status, the notice shown after the redirect, or the refusal's text)."""
    token = csrf_of(web.get(f"/queues/{queue}/dead").text)  # a form whatever the workers
    data = {"csrf": token, "worker": worker}
    r = web.post(f"/queues/{queue}/workers/{verb}", data=data, **kw)  # type: ignore[arg-type]
    m = re.search(r'<p class="notice" role="status">(.*?)</p>', r.text)
    return r.status_code, m.group(1) if m else r.text


@pytest.mark.parametrize("verb", ["quiet", "stop"])
def test_a_button_writes_the_request_and_the_page_shows_it(
    client: redis.Redis, q: Queue, web: TestClient, verb: str
) -> None:
    beat(q, "w1")
    shown = row(web.get("/workers").text, "w1")
    assert f'action="/queues/{q.name}/workers/quiet"' in shown and ">Quiet</button>" in shown
    assert f'action="/queues/{q.name}/workers/stop"' in shown and ">Stop</button>" in shown
    status, notice = ask(web, q.name, verb, "w1")
    assert (status, notice) == (200, NOTICES[f"worker-{verb}"])
    assert client.get(q.keys.worker_stop("w1")) == verb
    assert client.pttl(q.keys.worker_stop("w1")) > 0
    assert f"{verb} asked" in row(web.get("/workers").text, "w1")
    beat(q, "w1")  # the worker reads it
    shown = row(web.get("/workers").text, "w1")
    assert ("stopping" if verb == "stop" else "quiet") in shown
    assert ">Quiet</button>" not in shown  # stopping or quiet already
    assert (">Stop</button>" in shown) is (verb == "quiet")  # a quiet one may still be stopped
    assert ask(web, q.name, verb, "w1")[1] == NOTICES["worker-already"]


def test_a_worker_gone_meanwhile_is_said_and_nothing_is_written(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    beat(q, "w1")
    before = dump_queue(client, q)
    assert ask(web, q.name, "stop", "w-gone") == (200, NOTICES["worker-gone"])
    assert ask(web, q.name, "halt", "w1")[0] == 400  # not a verb
    assert ask(web, q.name, "stop", "")[0] == 400  # not an id
    assert dump_queue(client, q) == before


def test_without_a_valid_token_or_from_another_site_nothing_is_written(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    beat(q, "w1")
    url = f"/queues/{q.name}/workers/stop"
    token = csrf_of(web.get("/workers").text)
    before = dump_queue(client, q)
    assert web.post(url, data={"worker": "w1"}).status_code == 403
    assert web.post(url, data={"worker": "w1", "csrf": "0" * 64}).status_code == 403
    evil = {"origin": "https://evil.example"}
    assert post(web, url, token, headers=evil)[0] == 403
    assert web.get(url).status_code == 405  # GET changes nothing
    assert dump_queue(client, q) == before


def test_read_only_shows_no_button_and_refuses_the_post(client: redis.Redis, q: Queue) -> None:
    beat(q, "w1")
    with make_client(client, q, read_only=True) as web:
        token = csrf_of(web.get(f"/queues/{q.name}/dead").text)  # that page has a form
        shown = row(web.get("/workers").text, "w1")
        assert "</button>" not in shown and "/workers/stop" not in shown
        before = dump_queue(client, q)
        for verb in ("quiet", "stop"):
            r = web.post(f"/queues/{q.name}/workers/{verb}", data={"csrf": token, "worker": "w1"})
            assert r.status_code == 403 and "read-only" in r.text
        assert dump_queue(client, q) == before
