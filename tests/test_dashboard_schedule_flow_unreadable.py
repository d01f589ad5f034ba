"""The schedules page shows a schedule whose flow field was edited by hand into a value its runs
read as unset (Schedule.flow_unreadable, c3e6d39): its runs still come, so the row stays active
with its buttons, and a warning names the field and what the runs get instead (as doctor says);
a schedule with good flow fields shows none (Starlette's TestClient, a real private Redis)."""

from __future__ import annotations

import re

import pytest
import redis

from scheduler import Queue
from tests.test_dashboard import make_client

HOUR_MS = 3_600_000


def row_of(page: str, name: str) -> str:
    m = re.search(rf'<tr data-schedule="{re.escape(name)}".*?</tr>', page, re.S)
    assert m, f"no row for schedule {name!r}"
    return m.group(0)


@pytest.mark.parametrize(
    ("field", "value", "effect", "severity"),
    [
        ("rcount", "ten", "its runs get no rate limit", "error"),
        ("rwindow", "1h", "its runs get no rate limit", "error"),
        ("rkey", "no key", "its runs get no rate limit", "error"),
        ("ckey", "a b", "its runs get no concurrency limit", "error"),
        ("climit", "many", "its runs get its key at limit 1", "warning"),
        ("priority", "high", "its runs get priority 0", "warning"),
    ],
)
def test_the_schedules_page_names_a_flow_field_read_as_unset(
    client: redis.Redis, q: Queue, field: str, value: str, effect: str, severity: str
) -> None:
    flow = {
        "priority": 3, "concurrency_key": "exp", "concurrency_limit": 2,
        "rate_limit": "5/1s", "rate_key": "api",
    }  # fmt: skip
    q.schedule("rated", "report", every_ms=HOUR_MS, **flow)  # type: ignore[arg-type]
    q.schedule("fine", "report", every_ms=HOUR_MS, **flow)  # type: ignore[arg-type]
    client.hset(q.keys.schedule("rated"), field, value)  # by hand
    with make_client(client, q) as web:
        page = web.get("/schedules")
    assert page.status_code == 200
    row = row_of(page.text, "rated")
    # before: the row said only 'active', like a schedule whose flow is read in full
    assert f'class="flow-unreadable {severity}"' in row and f"flow field {field} unreadable" in row
    assert effect in row and "doctor" in row
    assert "active" in row and ">Run now</button>" in row  # its runs still come
    assert "flow-unreadable" not in row_of(page.text, "fine")


def test_a_schedule_that_cannot_be_read_shows_only_that(client: redis.Redis, q: Queue) -> None:
    """A schedule the scripts cannot read has no runs: its row says so, not what its runs get."""
    q.schedule("edited", "report", every_ms=HOUR_MS, rate_limit="5/1s", rate_key="api")
    client.hset(q.keys.schedule("edited"), "rcount", "ten")  # by hand
    client.hdel(q.keys.schedule("edited"), "task")
    with make_client(client, q) as web:
        row = row_of(web.get("/schedules").text, "edited")
    assert "unreadable task" in row and "flow-unreadable" not in row
