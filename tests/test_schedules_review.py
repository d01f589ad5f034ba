"""Recurring schedules, from a review: each test failed on the code as reviewed."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import redis
from click.testing import CliRunner

from scheduler import BadArgument, Queue
from scheduler.cli.main import main
from tests.conftest import Clock

MIN_MS = 60_000
EVERY_MS = 10_000
START_MS = 1_000 * EVERY_MS + 1


def test_same_definition_at_start_up_keeps_an_occurrence_held_by_its_key(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """README: 'call it at every start-up: the same definition again writes nothing'."""
    q, clock = tq
    opts: dict[str, Any] = {"every_ms": EVERY_MS, "concurrency_key": "hk", "concurrency_limit": 1}
    clock.set_ms(START_MS)
    q.schedule("held", "export", **opts)
    clock.set_ms(START_MS + EVERY_MS)
    (first,) = q.claim("w", limit=10, lease_ms=10 * MIN_MS).jobs
    clock.set_ms(START_MS + 2 * EVERY_MS)
    assert q.claim("w", limit=10).jobs == []
    held = q.get_schedule("held").pending
    assert client.zscore(q.keys.flow_held, held) is not None
    status = q.schedule("held", "export", **opts)
    assert (status, client.exists(q.keys.job(held))) == ("unchanged", 1)
    q.complete(first.id, first.token)
    assert [j.id for j in q.claim("w", limit=10).jobs] == [held]


def test_a_schedule_hash_missing_its_task_does_not_stop_every_claim(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(1000 * MIN_MS)
    q.schedule("tick", "ok.t", every_ms=MIN_MS)
    client.hdel(q.keys.schedule("tick"), "task")  # an operator's slip in redis-cli
    other = q.enqueue("ok.t")
    clock.set_ms(1001 * MIN_MS + 1)
    ids = [j.id for j in q.claim("w", limit=10).jobs]
    assert other in ids


def test_a_slots_key_of_another_type_does_not_starve_the_other_cron_schedules(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    base = 10_000 * MIN_MS
    clock.set_ms(base + 1)
    q.schedule("good", "t", cron="* * * * *")
    q.schedule("bad", "t", cron="* * * * *")
    client.delete(q.keys.schedule_slots("bad"))
    client.set(q.keys.schedule_slots("bad"), "hand-edited")
    # An outage longer than the buffer: the claim asks for a refill of both.
    clock.set_ms(base + 200 * MIN_MS + 1)
    for _ in range(3):
        for job in q.claim("w", limit=10).jobs:
            q.complete(job.id, job.token)
    assert q.get_schedule("good").pending != ""


def test_list_schedules_leaves_out_a_key_of_another_type(q: Queue, client: redis.Redis) -> None:
    """Its docstring: 'a hand-edited, unreadable definition is left out'."""
    q.schedule("good", "t", every_ms=MIN_MS)
    q.schedule("bad", "t", every_ms=MIN_MS)
    client.delete(q.keys.schedule("bad"))
    client.set(q.keys.schedule("bad"), "hand-edited")
    assert [s.name for s in q.list_schedules()] == ["good"]


def test_cli_resume_of_a_hand_edited_schedule_is_one_line_not_a_traceback(
    q: Queue, client: redis.Redis, redis_url: str
) -> None:
    q.schedule("nightly", "report.build", cron="0 3 * * *")
    assert q.pause_schedule("nightly") == "paused"
    client.hdel(q.keys.schedule("nightly"), "tz")
    out = CliRunner().invoke(main, ["schedules", "resume", "nightly", "--url", redis_url,
                                    "--queue", q.name])  # fmt: skip
    assert isinstance(out.exception, SystemExit), repr(out.exception)


def test_a_larger_jitter_does_not_run_a_finished_slot_again(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """lib/rearm.lua sched_insert: 'never run a slot twice' rests on the finished record,
    which expires (result_ttl_ms): after that, a redefinition that moves the cursor back
    inserts the slot that already ran as a new occurrence."""
    q0, clock = tq
    q = Queue(client, q0.name, result_ttl_ms=1, _clock="test")
    period = 10 * MIN_MS
    base = 1_000 * period
    clock.set_ms(base + 1)
    q.schedule("tick", "t", every_ms=period)
    clock.set_ms(base + period + 1_000)
    (job,) = q.claim("w", limit=10).jobs
    q.complete(job.id, job.token)
    deadline = time.monotonic() + 5
    while client.exists(q.keys.job(job.id)) and time.monotonic() < deadline:
        time.sleep(0.005)  # polling the record's 1 ms expiry
    assert not client.exists(q.keys.job(job.id))
    clock.set_ms(base + period + 2 * MIN_MS)
    assert q.schedule("tick", "t", every_ms=period, jitter_ms=9 * MIN_MS) == "updated"
    ran = [job.id]
    for step in range(1, 12):
        clock.set_ms(base + period + step * MIN_MS * 2)
        for j in q.claim("w", limit=10).jobs:
            q.complete(j.id, j.token)
            ran.append(j.id)
    assert len(ran) == len(set(ran)), ran


def _ms(y: int, mo: int, d: int, h: int = 0, mi: int = 0) -> int:
    return int(datetime(y, mo, d, h, mi, tzinfo=UTC).timestamp() * 1000)


def test_a_leap_day_cron_is_accepted(tq: tuple[Queue, Clock]) -> None:
    """Valid cron; its 64 buffered slots reach past 2200 (LIM.time_ms) and the script refuses
    them: BadArgument 'refused by the server: slot=...'."""
    q, clock = tq
    clock.set_ms(_ms(2024, 3, 1))
    assert q.schedule("leap", "t", cron="0 0 29 2 *") == "created"
    assert q.get_schedule("leap").next_run_ms == _ms(2028, 2, 29)


def test_a_seconds_cron_can_be_defined_during_the_repeated_hour(tq: tuple[Queue, Clock]) -> None:
    """02:05 CET on 27 Oct 2024 (the second pass of 02:00-03:00 in Berlin): cron_slots_after
    gives up after count * 4 + 1000 candidates, all before the start, and returns no slot."""
    q, clock = tq
    clock.set_ms(_ms(2024, 10, 27, 1, 5))
    assert q.schedule("fast", "t", cron="*/2 * * * * *", tz="Europe/Berlin") == "created"
    assert q.get_schedule("fast").next_run_ms == _ms(2024, 10, 27, 2, 0)


def test_a_random_cron_field_does_not_move_between_computations(tq: tuple[Queue, Clock]) -> None:
    """croniter's 'R' draws a new minute at each computation (upsert, resume, every refill):
    the schedule's slots change minute each time. Refusing 'R' is a fix too."""
    q, clock = tq
    clock.set_ms(_ms(2024, 1, 1))
    try:
        q.schedule("rnd", "t", cron="R * * * *")
    except BadArgument:
        return
    minutes = set()
    for _ in range(4):
        assert q.pause_schedule("rnd") == "paused"
        assert q.resume_schedule("rnd") == "resumed"
        minutes.add((q.get_schedule("rnd").next_run_ms or 0) // MIN_MS % 60)
    assert len(minutes) == 1, minutes


def test_remove_works_when_the_pending_occurrence_key_is_of_another_type(
    q: Queue, client: redis.Redis
) -> None:
    """sched_unpend reads the pending job with redis.call HMGET: WRONGTYPE fails the script,
    so the operator can neither remove nor pause the schedule."""
    q.schedule("hourly", "t", every_ms=60 * MIN_MS)
    pending = q.get_schedule("hourly").pending
    client.delete(q.keys.job(pending))
    client.set(q.keys.job(pending), "hand-edited")
    assert q.remove_schedule("hourly") == "removed"
    assert not client.exists(q.keys.schedule("hourly"))


def test_cli_add_with_a_superscript_digit_in_cron_is_bad_input(q: Queue, redis_url: str) -> None:
    """cron_field_error: '²'.isdigit() is True but int('²') raises ValueError, which the CLI
    reports as 'unreadable stored data' (exit 1) instead of bad input (exit 2)."""
    out = CliRunner().invoke(main, ["schedules", "add", "s", "t", "--cron", "\u00b2 * * * *",
                                    "--url", redis_url, "--queue", q.name])  # fmt: skip
    assert out.exit_code == 2, out.output
