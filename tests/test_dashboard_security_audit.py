"""The web dashboard under hostile stored data, from a security audit: each test failed on the
code as audited. Whoever holds the app role writes any field and any workers-set member by
hand; the pages must stay up and small."""

from __future__ import annotations

import pytest
import redis

from scheduler import Queue
from tests.test_dashboard_review import web_of


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
