"""The dashboard while Redis does not answer: a page says so with 503 (not a bare 500 Internal
Server Error), and an action whose call may have reached Redis says its outcome is unknown.
A private server, stopped mid-test."""

from __future__ import annotations

import re

from starlette.testclient import TestClient

from scheduler import Queue
from scheduler._spawn import RedisProcess
from scheduler.dashboard import Auth, create_app
from tests.redis_server import require_server


def test_pages_and_actions_answer_503_while_redis_is_down() -> None:
    with RedisProcess(require_server("a private server to stop")) as server:
        Queue.from_url(server.url, "mail").enqueue("send", {"to": "a"})
        app = create_app(url=server.url, auth=Auth())
        with TestClient(app) as web:
            page = web.get("/queues/mail")
            assert page.status_code == 200
            m = re.search(r'name="csrf" value="([0-9a-f]{64})"', page.text)
            assert m is not None
            server.kill()
            for path in ("/", "/queues/mail", "/health", "/workers", "/api/overview"):
                got = web.get(path)
                assert got.status_code == 503, (path, got.status_code)
                assert "Redis unreachable" in got.text and "ConnectionError" in got.text
                assert "Reload the page once it answers" in got.text
                if "api" in path:  # a JSON endpoint answers JSON, not an HTML page
                    assert got.json()["error"] == "Redis unreachable", got.text
            acted = web.post("/queues/mail/pause", data={"csrf": m.group(1)},
                             headers={"Origin": "http://testserver"})  # fmt: skip
            assert acted.status_code == 503
            assert "outcome is unknown" in acted.text
