"""The dashboard's pure parts: the lateness quantiles of a stats minute, the age filter, the
credential check on malformed headers, the display of durations. No server."""

from __future__ import annotations

import base64

import pytest

from scheduler.core.errors import BadArgument
from scheduler.core.models import Job
from scheduler.dashboard.dead import parse_age_ms
from scheduler.dashboard.history import lateness_max, lateness_mean, lateness_quantile, merge_max
from scheduler.dashboard.reasons import why_not_running
from scheduler.dashboard.render import fmt_duration
from scheduler.dashboard.security import Auth


def test_lateness_quantiles_from_a_minute_histogram() -> None:
    assert lateness_quantile({"late_n": 0}) is None and lateness_max({}) is None
    row = {"late_n": 100, "late_le_10": 98, "late_le_1000": 1, "late_gt_600000": 1}
    row |= {"late_max_ms": 900_000, "late_sum_ms": 901_000}
    assert lateness_quantile(row, 0.98) == 10
    assert lateness_quantile(row, 0.99) == 1_000  # the 99th job sits in the <= 1 s bucket
    assert lateness_quantile(row, 1.0) == 900_000  # past the last bound: the minute's max
    assert lateness_quantile({"late_n": 1, "late_le_10000": 1, "late_max_ms": 2_500}) == 2_500
    assert (lateness_max(row), lateness_mean(row)) == (900_000, 9_010)
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
    for header in (
        "",
        "Basic",
        "Basic !!!not-base64",
        "Basic é",
        "Bearer pw-long-enough",
        "Digest x",
    ):
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


def test_a_due_suspect_says_why_it_may_wait() -> None:
    def due(lapses: str) -> Job:
        return Job("j3", "due", "t", "{}", {"state": "due", "run_at_ms": "0", "lapses": lapses})

    codes = [r.code for r in why_not_running(due("2"), 10, 2)]
    assert codes == ["waiting-for-worker", "suspect"]
    assert "lapsed 2 times" in why_not_running(due("2"), 10, 2)[1].text
    for innocent in ("1", "", "x2", "\u0662"):  # one lapse, unset, garbage: not a suspect
        assert [r.code for r in why_not_running(due(innocent), 10, 2)] == ["waiting-for-worker"]


def test_a_due_job_lapsed_once_before_its_last_attempt_is_a_suspect() -> None:
    # claim.lua suspect_at: one lapse makes a suspect when the next attempt is the last.
    def due(attempts: str, max_attempts: str) -> Job:
        fields = {"state": "due", "run_at_ms": "0", "lapses": "1", "attempts": attempts}
        return Job("j4", "due", "t", "{}", {**fields, "max_attempts": max_attempts})

    assert [r.code for r in why_not_running(due("1", "2"), 10, 2)][-1] == "suspect"
    assert [r.code for r in why_not_running(due("1", "3"), 10, 2)] == ["waiting-for-worker"]
