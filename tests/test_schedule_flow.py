"""Recurring schedules with flow-control options (issue 15, docs/flow-control.md): every
occurrence takes the schedule's priority, concurrency key and rate limit, and goes through the
same flow path as an enqueued job; removing or pausing a schedule clears a held occurrence out
of every flow set; a bad option is refused before anything is written."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler import BadArgument, Queue
from scheduler.cli.main import main as cli
from scheduler.operations.ops import Script
from tests.conftest import Clock, dump_queue

EVERY_MS = 10_000
START_MS = 1_000 * EVERY_MS + 1  # just after a slot: the next one is EVERY_MS - 1 ms away


def held_ids(client: redis.Redis, q: Queue) -> list[str]:
    return [str(i) for i in client.zrange(q.keys.flow_held, 0, -1)]


def occurrences_leased(client: redis.Redis, q: Queue, name: str) -> list[str]:
    ids = [str(i) for i in client.zrange(q.keys.leased, 0, -1)]
    return [i for i in ids if i.startswith(f"schedule:{name}:")]


def test_an_occurrence_of_priority_9_is_claimed_before_older_priority_0_jobs(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(START_MS)
    older = [q.enqueue("plain", {"i": i}) for i in range(3)]
    assert q.schedule("urgent", "report", every_ms=EVERY_MS, priority=9) == "created"
    clock.set_ms(START_MS + EVERY_MS)  # the occurrence is due; the plain jobs for 10 s already
    first = q.claim("w", limit=1).jobs
    assert [j.id for j in first] == [f"schedule:urgent:{1_001 * EVERY_MS}"]
    rest = q.claim("w", limit=10).jobs
    assert sorted(j.id for j in rest) == sorted(older)
    assert q.get_schedule("urgent").priority == 9


def test_a_schedule_with_concurrency_limit_1_never_has_two_occurrences_leased(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(START_MS)
    # catch_up: a late occurrence still runs (the misfire policy drops none here).
    opts: dict[str, Any] = {"concurrency_key": "exp", "concurrency_limit": 1}
    assert q.schedule("slow", "export", every_ms=EVERY_MS, misfire="catch_up:100", **opts)
    sch = q.get_schedule("slow")
    assert (sch.concurrency_key, sch.concurrency_limit) == ("exp", 1)
    ran: list[str] = []
    running: list[Any] = []
    holds = 0
    now = START_MS
    for step in range(12):
        now += EVERY_MS
        clock.set_ms(now)
        running += q.claim("w", limit=10, lease_ms=10 * 60_000).jobs
        assert len(occurrences_leased(client, q, "slow")) <= 1
        holds += len(held_ids(client, q))
        # Each run takes two periods: a next occurrence comes due while one is leased.
        if step % 2 == 1 and running:
            job = running.pop(0)
            q.complete(job.id, job.token)
            ran.append(job.id)
    assert holds > 0
    assert len(ran) >= 5
    assert len(set(ran)) == len(ran)


def _held_occurrence(q: Queue, clock: Clock, client: redis.Redis) -> tuple[Any, str]:
    """A schedule whose next occurrence is held behind its running one: (leased, held)."""
    clock.set_ms(START_MS)
    q.schedule("held", "export", every_ms=EVERY_MS, concurrency_key="hk", concurrency_limit=1)
    clock.set_ms(START_MS + EVERY_MS)
    (first,) = q.claim("w", limit=10, lease_ms=10 * 60_000).jobs
    clock.set_ms(START_MS + 2 * EVERY_MS)
    assert q.claim("w", limit=10).jobs == []
    nxt = q.get_schedule("held").pending
    assert held_ids(client, q) == [nxt]
    assert client.zrange(q.keys.prefix + "flow:ckheld:hk", 0, -1) == [nxt]
    return first, nxt


@pytest.mark.parametrize("how", ["remove", "pause"])
def test_removing_or_pausing_a_schedule_clears_its_held_occurrence(
    tq: tuple[Queue, Clock], client: redis.Redis, how: str
) -> None:
    q, clock = tq
    leased, nxt = _held_occurrence(q, clock, client)
    if how == "remove":
        assert q.remove_schedule("held") == "removed"
    else:
        assert q.pause_schedule("held") == "paused"
    assert held_ids(client, q) == []
    assert client.exists(q.keys.prefix + "flow:ckheld:hk") == 0
    assert client.exists(q.keys.job(nxt)) == 0
    assert client.zscore(q.keys.due, nxt) is None
    assert client.zscore(q.keys.leased, leased.id) is not None  # the running one finishes normally


def test_a_held_occurrence_runs_once_its_key_is_free(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    leased, nxt = _held_occurrence(q, clock, client)
    q.complete(leased.id, leased.token)
    assert held_ids(client, q) == []
    assert [j.id for j in q.claim("w", limit=10).jobs] == [nxt]


def test_an_occurrence_waits_for_its_rate_window(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(START_MS)
    q.enqueue("plain", None, rate_limit="1/1h", rate_key="shared")
    assert len(q.claim("w", limit=10).jobs) == 1
    q.schedule("rated", "report", every_ms=EVERY_MS, rate_limit="1/1h", rate_key="shared")
    assert q.get_schedule("rated").rate_limit == "1/3600000ms"
    clock.set_ms(START_MS + EVERY_MS)
    assert q.claim("w", limit=10).jobs == []
    assert client.zrange(q.keys.flow_rheld, 0, -1) == [q.get_schedule("rated").pending]


@pytest.mark.parametrize(
    "bad",
    [
        {"priority": 10},
        {"priority": -1},
        {"concurrency_key": "k"},
        {"concurrency_key": "bad key", "concurrency_limit": 1},
        {"concurrency_key": "k", "concurrency_limit": 0},
        {"rate_limit": "often"},
        {"rate_key": "r"},
    ],
)
def test_a_bad_flow_option_is_refused_and_nothing_written(
    tq: tuple[Queue, Clock], client: redis.Redis, bad: dict[str, Any]
) -> None:
    q, clock = tq
    clock.set_ms(START_MS)
    q.schedule("keep", "t", every_ms=EVERY_MS)
    before = dump_queue(client, q)
    with pytest.raises(BadArgument):
        q.schedule("s", "t", every_ms=EVERY_MS, **bad)
    with pytest.raises(BadArgument):
        q.schedule("keep", "t", every_ms=EVERY_MS, **bad)
    assert dump_queue(client, q) == before


def test_the_script_refuses_a_bad_flow_field_too(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(START_MS)
    before = dump_queue(client, q)
    args = ["s", "d" * 32, "every", "", "", str(EVERY_MS), "0", "0", "run_once", "1", "t"]
    args += ["null", "5", "1000,2.0,60000,0.0", "0"]
    # priority 10, a key without its limit, a parent: each refused by the script itself.
    for flow in ("10||0||0|0|", "0|k|0||0|0|", "0||0||0|0|" + "0" * 16):
        with pytest.raises(BadArgument):
            q._execute(Script("schedule_upsert", [*args, flow]))
    assert dump_queue(client, q) == before
    q._execute(Script("schedule_upsert", [*args, "9||0||0|0|"]))
    assert client.hget(q.keys.schedule("s"), "priority") == "9"


def test_cli_schedules_add_takes_the_flow_options(
    tq: tuple[Queue, Clock], client: redis.Redis, redis_url: str
) -> None:
    q, _ = tq
    base = ["schedules", "add", "cli", "report", "--every-ms", "60000", "--url", redis_url]
    base += ["-q", q.name]
    before = dump_queue(client, q)
    bad = CliRunner().invoke(cli, [*base, "--priority", "12"])
    assert bad.exit_code == 2, bad.output
    assert dump_queue(client, q) == before
    flow = ["--priority", "7", "--concurrency-key", "k", "--concurrency-limit", "2"]
    flow += ["--rate-limit", "5/1s"]
    run = CliRunner().invoke(cli, [*base, *flow, "--json"])
    assert run.exit_code == 0, run.output
    assert json.loads(run.stdout)["status"] == "created"
    row = q.get_schedule("cli").as_dict()
    assert {k: row[k] for k in ("priority", "concurrency_key", "concurrency_limit")} == {
        "priority": 7,
        "concurrency_key": "k",
        "concurrency_limit": 2,
    }
    assert (row["rate_limit"], row["rate_key"]) == ("5/1000ms", "report")
    pending = q.get_schedule("cli").pending
    assert client.hget(q.keys.job(pending), "priority") == "7"
