"""The dashboard's pure parts: the bounded lateness history, the age filter's parser, the
credential check on malformed headers, the display of durations. No server."""

from __future__ import annotations

import base64

import pytest

from scheduler.core.errors import BadArgument
from scheduler.core.models import Job
from scheduler.dashboard.dead import parse_age_ms
from scheduler.dashboard.history import BUCKET_MS, KEEP_BUCKETS, LatenessHistory, merge_max
from scheduler.dashboard.reasons import why_not_running
from scheduler.dashboard.render import fmt_duration
from scheduler.dashboard.security import Auth


def test_lateness_history_keeps_one_hour_of_worst_values() -> None:
    h = LatenessHistory()
    h.record("q", 0, 500)
    h.record("q", 1, 200)  # same bucket: the worst stays
    series = h.series("q", 0)
    assert len(series) == KEEP_BUCKETS and series[-1] == 500 and series[-2] is None
    for i in range(1, 2 * KEEP_BUCKETS):
        h.record("q", i * BUCKET_MS, i)
    assert len(h._by_queue["q"]) == KEEP_BUCKETS  # bounded, whatever the uptime
    now = (2 * KEEP_BUCKETS - 1) * BUCKET_MS
    assert h.series("q", now)[0] == KEEP_BUCKETS and h.series("other", now)[-1] is None
    assert merge_max([[None, 3, 1], [2, None, 5]]) == [2, 3, 5]


def test_age_filter_text() -> None:
    assert parse_age_ms("90s") == 90_000
    assert parse_age_ms(" 2h ") == 7_200_000
    assert parse_age_ms("7d") == 7 * 86_400_000
    assert parse_age_ms("") is None
    for bad in ("2 hours", "-1h", "1e9s", "h", "1.5h"):
        with pytest.raises(BadArgument):
            parse_age_ms(bad)


def test_malformed_credentials_are_refused_not_an_error() -> None:
    auth = Auth("ops", "pw-long-enough", None)
    for header in ("", "Basic", "Basic !!!not-base64", "Bearer pw-long-enough", "Digest x"):
        assert not auth.allows(header)
    latin = base64.b64encode("ops:\xff".encode("latin-1")).decode()
    assert not auth.allows(f"Basic {latin}")
    assert auth.allows("Basic " + base64.b64encode(b"ops:pw-long-enough").decode())
    assert Auth().allows("")  # no credentials configured: nothing to check


def test_durations_and_reasons() -> None:
    assert [fmt_duration(v) for v in (850, 12_300, 245_000, 7_380_000, None)] == [
        "850ms", "12.3s", "4m05s", "2h03m", "-",
    ]  # fmt: skip
    job = Job("j1", "weird", "t", "{}", {"state": "weird"})
    (reason,) = why_not_running(job, 0, 1)
    assert reason.code == "unknown-state"
    due = Job("j2", "due", "t", "{}", {"state": "due", "run_at_ms": "0"})
    assert [r.code for r in why_not_running(due, 10, 0)] == ["no-live-worker"]
    assert [r.code for r in why_not_running(due, 10, 2)] == ["waiting-for-worker"]
