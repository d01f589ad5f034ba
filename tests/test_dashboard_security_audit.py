"""The web dashboard under hostile stored data, from a security audit: each test failed on the
code as audited. Whoever holds the app role writes any field and any workers-set member by
hand; the pages must stay up and small."""

from __future__ import annotations

import pytest
import redis

from scheduler import Queue
from tests.test_dashboard_review import web_of
from tests.test_review_operator_security import PAGE_MAX
from tests.test_worker_remote_stop import beat


# "America" is a directory of the zone database, a long name is too long for a file name:
# ZoneInfo raises OSError for both, not ZoneInfoNotFoundError.
@pytest.mark.parametrize("tz", ["America", "x" * 300])
def test_a_hand_edited_time_zone_does_not_fail_the_schedules_page(
    client: redis.Redis, q: Queue, tz: str
) -> None:
    q.schedule("s1", "mail.send", cron="* * * * *")
    client.hset(q.keys.schedule("s1"), "tz", tz)
    with web_of(client, q) as web:
        r = web.get("/schedules")
    assert r.status_code == 200, r.status_code
    assert 'data-schedule="s1"' in r.text


def test_a_huge_workers_set_member_does_not_make_a_huge_workers_page(
    client: redis.Redis, q: Queue
) -> None:
    beat(q, "w1")
    big = "W" * 1_000_000  # no worker id is that long (at most 200 characters)
    client.zadd(q.keys.workers, {big: 9e12})
    client.hset(q.keys.worker(big), mapping={"host": "h"})
    with web_of(client, q) as web:
        r = web.get("/workers")
    assert r.status_code == 200 and "more characters not shown" in r.text
    assert len(r.content) < PAGE_MAX, f"a workers page of {len(r.content)} bytes"
    assert 'name="worker" value="w1"' in r.text  # a real worker keeps its buttons
