"""Failed-login throttling of the dashboard (scheduler/dashboard/throttle.py), through HTTP on a
real private Redis: a client that keeps guessing gets 429 (right credentials too) until its
window ends; other clients, and requests without credentials, are not counted against it."""

from __future__ import annotations

import base64

import redis
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler.dashboard import Auth, create_app
from scheduler.dashboard.throttle import LoginThrottle, client_key


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"authorization": f"Basic {token}"}


def test_a_guessing_client_is_throttled_then_let_back(client: redis.Redis, q: Queue) -> None:
    clock = Clock()
    app = create_app(client=client, queues=[q.name], auth=Auth("ops", "right-password-1"))
    app.throttle = LoginThrottle(limit=5, window_s=60, clock=clock)
    good, bad = basic("ops", "right-password-1"), basic("ops", "guess")
    with (
        TestClient(app, client=("203.0.113.7", 4000)) as guesser,
        TestClient(app, client=("198.51.100.2", 4000)) as other,
    ):
        for _ in range(10):  # a browser's credential-less first request is not a guess
            assert guesser.get("/").status_code == 401
        for _ in range(5):
            assert guesser.get("/", headers=bad).status_code == 401
        refused = guesser.get("/", headers=good)
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) == 60
        assert guesser.get("/", headers=bad).status_code == 429  # not even checked
        assert other.get("/", headers=good).status_code == 200  # another address is not locked
        clock.now += 30
        assert int(guesser.get("/", headers=good).headers["retry-after"]) == 30
        clock.now += 30
        assert guesser.get("/", headers=good).status_code == 200
        for _ in range(4):  # a fresh window: four more guesses are answered 401 again
            assert guesser.get("/", headers=bad).status_code == 401
        assert guesser.get("/", headers=good).status_code == 200


def test_token_guesses_count_too(client: redis.Redis, q: Queue) -> None:
    app = create_app(client=client, queues=[q.name], auth=Auth(token="t" * 24))
    app.throttle = LoginThrottle(limit=3)
    with TestClient(app) as web:
        for _ in range(3):
            assert web.get("/", headers={"authorization": "Bearer " + "x" * 24}).status_code == 401
        assert web.get("/", headers={"authorization": "Bearer " + "t" * 24}).status_code == 429


def test_no_auth_means_no_throttle(client: redis.Redis, q: Queue) -> None:
    app = create_app(client=client, queues=[q.name], auth=Auth())
    app.throttle = LoginThrottle(limit=1)
    with TestClient(app) as web:
        for _ in range(3):
            assert web.get("/", headers=basic("any", "thing")).status_code == 200


def test_buckets_and_memory_bound() -> None:
    # An IPv6 host owns its /64: rotating addresses inside it is one bucket.
    assert client_key("2001:db8::1") == client_key("2001:db8::ffff:1") == "2001:db8::/64"
    assert client_key("2001:db8:0:1::1") != client_key("2001:db8::1")
    assert client_key("::ffff:192.0.2.1") == "192.0.2.1"
    assert client_key("testclient") == "testclient"
    clock = Clock()
    t = LoginThrottle(limit=2, clock=clock, max_tracked=3)
    t.failed("192.0.2.1")
    t.failed("192.0.2.1")
    assert t.retry_after_s("192.0.2.1") == 60
    for i in range(2, 5):
        t.failed(f"192.0.2.{i}")
    assert len(t._failed) == 3  # the oldest bucket was dropped to make room
    assert t.retry_after_s("192.0.2.1") == 0
