"""The dashboard against one queue's key edited by hand into another type (a fuzzing audit):
`/api/overview` answered a 400 HTML page and `/` a 400 that hid the healthy queues too;
`/schedules` and `/workers` answered bare 500s. Now each page shows the other queues and names
the damaged one ("edited by hand ... see doctor"), as `scheduler stats` does."""

from __future__ import annotations

import uuid

import redis
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler.dashboard import Auth, create_app


def test_one_damaged_queue_leaves_the_others_shown(redis_url: str, client: redis.Redis) -> None:
    bad, good = (Queue(client, f"h-{uuid.uuid4().hex[:8]}") for _ in range(2))
    bad.enqueue("t", 1)
    good.enqueue("t", 2)
    good.schedule("tick", "t", every_ms=60_000)
    app = create_app(url=redis_url, queues=(bad.name, good.name), auth=Auth())
    with TestClient(app) as web:
        for key, paths in (
            (bad.keys.leased, ("/api/overview", "/")),
            (bad.keys.schedules, ("/schedules",)),
            (bad.keys.workers, ("/workers",)),
        ):
            client.delete(key)
            client.set(key, "x")
            for path in paths:
                page = web.get(path)
                assert page.status_code == 200, (key, path, page.text[-300:])
                assert "edited by hand" in page.text and bad.name in page.text, (key, path)
            client.delete(key)
        data = web.get("/api/overview").json()
        assert [r["queue"] for r in data["queues"]] == [bad.name, good.name]
        client.set(bad.keys.leased, "x")
        data = web.get("/api/overview").json()
        assert [r["queue"] for r in data["queues"]] == [good.name]
        assert "tick" in web.get("/schedules").text  # the healthy queue's schedule still listed
    for q in (bad, good):
        client.delete(*[str(k) for k in client.scan_iter(match=q.keys.pattern())])
