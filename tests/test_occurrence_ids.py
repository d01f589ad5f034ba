"""Ids of the form `schedule:<name>:<slot_ms>` belong to recurring schedules' runs
(lua/lib/rearm.lua). A job enqueued with one was taken over by the schedule when it reached
that slot (its task and payload replaced) and deleted by a pause: an accepted job lost to
someone else's action. Enqueue refuses them, client and server; one accepted before is left
alone by its schedule."""

from __future__ import annotations

import pytest
import redis

from scheduler import BadArgument, JobSpec, Queue
from scheduler.operations.ops import Script
from tests.conftest import Clock, dump_queue

MIN_MS = 60_000
T0 = 10 * MIN_MS + 1


@pytest.mark.parametrize("how", ["enqueue", "enqueue_many", "script"])
def test_enqueue_refuses_a_schedule_runs_id(q: Queue, client: redis.Redis, how: str) -> None:
    before = dump_queue(client, q)
    jid = "schedule:nightly:660000"
    with pytest.raises(BadArgument, match="schedule"):
        if how == "enqueue":
            q.enqueue("t", {}, job_id=jid)
        elif how == "enqueue_many":
            q.enqueue_many([JobSpec("t", {}, job_id="fine-1"), JobSpec("t", {}, job_id=jid)])
        else:  # a client that skips the Python checks meets the script's refusal
            args = [jid, "t", "{}", "in", "0", "5", "1000,2.0,1000,0.0", "0", "", "1000", "", ""]
            q._execute(Script("enqueue", ["1", *args]))
    assert dump_queue(client, q) == before
    assert q.enqueue("t", {}, job_id="schedulex:1") == "schedulex:1"  # only the prefix


def test_a_job_accepted_with_such_an_id_before_is_left_alone(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    jid = "schedule:nightly:660000"  # the schedule's first slot to come
    # As an older version accepted it (its spec record, waiting in due).
    client.set(q.keys.spec(jid), f"2|user.task||||{T0}|||" + '{"order":7}')
    client.zadd(q.keys.due, {jid: T0 + 2 * MIN_MS})
    q.schedule("nightly", "report.build", {"s": 1}, every_ms=MIN_MS)
    # The schedule skips that slot: before, it wrote its run over the job (task, payload).
    assert q.get_schedule("nightly").pending == "schedule:nightly:720000"
    mine = q.get_job(jid)
    assert (mine.task, mine.payload_json) == ("user.task", '{"order":7}')
    assert q.pause_schedule("nightly") == "paused"
    assert q.get_job(jid).task == "user.task"  # before: deleted with the schedule's run
