"""A schedule definition a hand edit made unreadable (found by a fuzzing audit).

The scripts treat such a schedule as absent (lua/lib/schedule.lua sched_load): its pending run
is the last. `schedules list` showed it as healthy ("every 0 ms", a next time), doctor said
nothing and the same definition sent again was 'unchanged'. Now the stored Schedule says which
field is unreadable (by sched_load's rules: checked against the scripts below), list and doctor
say its runs stopped, and sending the definition again repairs it. Server time: the test clock."""

from __future__ import annotations

import pytest
import redis
from click.testing import CliRunner

from scheduler import CorruptKey, Queue
from scheduler.admin.doctor import check_queue
from scheduler.cli.main import main
from tests.conftest import Clock

EDITS = [
    ("every_ms", "garbage"),
    ("every_ms", "0"),
    ("max_attempts", "0"),
    ("backoff", "x"),
    ("offset_ms", "-5"),
    ("kind", "weekly"),
    ("task", "no spaces allowed"),
]


def rearmed(q: Queue, clock: Clock, client: redis.Redis) -> bool:
    """Does claiming the pending run arm the next one (what the scripts do with the hash)?"""
    key = q.keys.schedule("tick")
    first = str(client.hget(key, "pending"))
    clock.set_ms(10_000_000)
    (job,) = q.claim("w", limit=5).jobs  # a run of it, the pending one or a later slot
    q.complete(job.id, job.token)
    return str(client.hget(key, "pending")) not in ("", first, job.id)


@pytest.mark.parametrize(("field", "value"), EDITS)
def test_unreadable_as_the_scripts_read_it(
    tq: tuple[Queue, Clock], client: redis.Redis, field: str, value: str
) -> None:
    q, clock = tq
    clock.set_ms(1_000_000)
    q.schedule("tick", "t", every_ms=60_000)
    assert q.get_schedule("tick").unreadable == ""
    client.hset(q.keys.schedule("tick"), field, value)
    assert q.get_schedule("tick").unreadable == field
    assert not rearmed(q, clock, client)  # the scripts agree: its runs stopped
    codes = [i.code for i in check_queue(client, q.name)]
    assert codes == ["schedule-unreadable"]


def test_a_readable_one_is_rearmed(tq: tuple[Queue, Clock], client: redis.Redis) -> None:
    q, clock = tq
    clock.set_ms(1_000_000)
    q.schedule("tick", "t", every_ms=60_000)
    assert rearmed(q, clock, client)  # the check above can fail
    assert check_queue(client, q.name) == []


def test_list_says_so_and_the_same_definition_repairs_it(
    redis_url: str, tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(1_000_000)
    q.schedule("tick", "t", every_ms=60_000)
    client.hset(q.keys.schedule("tick"), "every_ms", "garbage")
    out = CliRunner().invoke(main, ["schedules", "list", "-q", q.name, "--url", redis_url])
    assert out.exit_code == 0 and "UNREADABLE every_ms" in out.output
    assert q.schedule("tick", "t", every_ms=60_000) != "unchanged"
    assert q.get_schedule("tick").unreadable == "" and check_queue(client, q.name) == []


def test_an_index_of_another_type(q: Queue, client: redis.Redis) -> None:
    client.set(q.keys.schedules, "x")
    with pytest.raises(CorruptKey, match="SET of schedule names"):
        q.list_schedules()
    assert [i.code for i in check_queue(client, q.name)] == ["wrong-type"]
