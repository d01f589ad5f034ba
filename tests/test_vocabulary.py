"""One list of outcome words (scheduler/core/vocabulary.py) shared by the worker's metrics, the
stats counters the Lua writes, and the stats reader; old stored counter names stay readable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis

from scheduler import LeaseExpired
from scheduler.admin.inspection import server_now_ms, window_counts
from scheduler.client.queue import Queue
from scheduler.core.keys import QueueKeys
from scheduler.core.vocabulary import LEGACY_STAT_FIELDS, OUTCOMES, STAT_FIELDS, stat_field
from scheduler.worker.metrics import WorkerMetrics

LUA = Path(__file__).resolve().parent.parent / "lua"


def lua_stat_counters() -> set[str]:
    found: set[str] = set()
    for path in LUA.rglob("*.lua"):
        found |= set(re.findall(r"bump_stat\(\s*prefix,\s*now,\s*'([a-z_]+)'", path.read_text()))
    return found


def test_every_counter_the_lua_writes_is_a_stats_field_under_its_current_name() -> None:
    counters = lua_stat_counters()
    assert {"fail", "claim"} <= counters  # the scan found the transitions' counters
    assert sorted(c for c in counters if stat_field(c) not in STAT_FIELDS) == []


def test_an_outcome_counted_in_stats_and_in_metrics_has_one_word() -> None:
    # done, retry, dead and expired are both stats counters and metric labels: the same words.
    assert {"done", "retry", "dead", "expired"} <= set(OUTCOMES) & set(STAT_FIELDS)
    # no old word survives as a current name anywhere
    assert set(LEGACY_STAT_FIELDS).isdisjoint(set(OUTCOMES) | set(STAT_FIELDS))
    assert "complete" not in OUTCOMES and "lease_lost" not in OUTCOMES


def test_metrics_take_only_vocabulary_words() -> None:
    m = WorkerMetrics()
    for word in OUTCOMES:
        m.outcome("q", "t", word)
    assert (
        m.registry.get_sample_value(
            "scheduler_jobs_total", {"queue": "q", "task": "t", "outcome": "done"}
        )
        == 1
    )
    for old in ("complete", "lease_lost"):
        with pytest.raises(ValueError, match="unknown outcome"):
            m.outcome("q", "t", old)


def test_the_lease_error_is_named_for_the_expired_outcome() -> None:
    import scheduler

    assert issubclass(LeaseExpired, scheduler.SchedulerError)
    assert not hasattr(scheduler, "LeaseLost")


def test_stats_read_old_and_new_counter_names_as_the_new_word(
    client: redis.Redis, q: Queue
) -> None:
    keys = QueueKeys(q.name)
    now_ms = server_now_ms(client)
    minute = now_ms // 60_000
    # a bucket written before the rename and one written after, in the same window
    client.hset(keys.stats(minute), mapping={"complete": 2, "lease_expired": 1})
    client.hset(keys.stats(minute - 1), mapping={"done": 3, "expired": 4})
    five = window_counts(client, keys, now_ms)["5m"]
    assert (five["done"], five["expired"]) == (5, 5)
    assert "complete" not in five and "lease_expired" not in five


def test_stats_windows_hold_only_outcome_counters(client: redis.Redis, q: Queue) -> None:
    """The claim's start-lateness fields share the minute bucket; they are no outcome counts
    (a summed late_max_ms would mean nothing), so the windows of `stats --json` leave them out."""
    keys = QueueKeys(q.name)
    now_ms = server_now_ms(client)
    minute = now_ms // 60_000
    client.hset(keys.stats(minute), mapping={"done": 1, "late_max_ms": 40, "late_n": 3})
    client.hset(keys.stats(minute - 1), mapping={"done": 2, "late_max_ms": 70})
    five = window_counts(client, keys, now_ms)["5m"]
    assert five["done"] == 3
    assert set(five) == set(STAT_FIELDS)


def test_waiting_jobs_are_counted_as_due_and_scheduled(q: Queue) -> None:
    from dataclasses import fields

    from scheduler import JobSpec, QueueCounts

    assert "due_now" not in {f.name for f in fields(QueueCounts)}
    q.enqueue_many([JobSpec("t", None), JobSpec("t", None, delay_ms=60_000)])
    c = q.counts()
    assert (c.due, c.scheduled) == (1, 1)
