"""Flow control against the real scripts (docs/flow-control.md): priorities with aging, key
limits with lapse and no head-of-line blocking, rate windows with the next slot in next_ms,
and how each shows (reason, counts, stats, jobs show) and works with cancel, retry, release."""

from __future__ import annotations

import json

import pytest
import redis
from click.testing import CliRunner

from scheduler import BadArgument, Queue
from scheduler.cli.main import main as cli
from scheduler.client.chain import chain
from scheduler.operations.ops import Script
from tests.conftest import FLOW_T0 as T0
from tests.conftest import Clock, dump_queue


def ids(q: Queue, limit: int = 100, lease_ms: int = 10_000) -> list[str]:
    return [j.id for j in q.claim("w", limit=limit, lease_ms=lease_ms).jobs]


def test_higher_priority_first_then_oldest_never_early(fq: tuple[Queue, Clock]) -> None:
    q, clock = fq
    low_old = q.enqueue("t", priority=0)
    clock.set_ms(T0 + 10)
    mid = q.enqueue("t", priority=5)
    high_later = q.enqueue("t", priority=9, delay_ms=1_000)
    high = q.enqueue("t", priority=9)
    assert ids(q, limit=2) == [high, mid]  # the priority-9 job due later is not taken early
    clock.set_ms(T0 + 2_000)
    assert ids(q) == [high_later, low_old]


def test_an_aged_job_goes_ahead_of_every_priority(
    fq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = fq
    client.hset(q.keys.config, "priority_aging_ms", 5_000)
    low = q.enqueue("t")
    clock.set_ms(T0 + 4_000)
    flood = [q.enqueue("t", priority=9) for _ in range(3)]
    assert ids(q, limit=1) == [flood[0]]  # not aged yet: priority wins
    clock.set_ms(T0 + 5_000)
    assert ids(q, limit=1) == [low]  # due for 5 s: ahead of the flood


def test_a_retry_and_a_release_keep_the_priority(fq: tuple[Queue, Clock]) -> None:
    q, _ = fq
    high = q.enqueue("t", priority=7)
    batch = q.claim("w", limit=1, lease_ms=10_000)
    q.fail(high, batch.jobs[0].token, ("E", "m", ""), delay_ms=0)
    plain = q.enqueue("t")
    assert ids(q, limit=1) == [high]  # back in its level's index, not only in due
    released = q.claim("w", limit=1, lease_ms=10_000).jobs[0]
    assert released.id == plain
    other = q.enqueue("t", priority=3)
    q.release([(plain, released.token)])
    assert ids(q, limit=1) == [other]


def test_at_most_k_leased_per_key_and_other_keys_run(fq: tuple[Queue, Clock]) -> None:
    q, _ = fq
    hot = [q.enqueue("t", concurrency_key="hot", concurrency_limit=2) for _ in range(50)]
    cold = [q.enqueue("t", concurrency_key=f"c{i}", concurrency_limit=1) for i in range(5)]
    got = ids(q, limit=10)
    # No head-of-line blocking: 48 hot jobs ahead of the cold ones do not stop them.
    assert got == hot[:2] + cold
    assert ids(q) == []
    job = q.get_job(hot[2])
    assert job.state == "held"
    assert job.fields["flow_reason"] == "limited by key hot (2 leased)"
    assert q.counts().due == 48


def test_a_finished_lease_frees_its_slot_for_the_oldest_held_job(
    fq: tuple[Queue, Clock],
) -> None:
    q, _ = fq
    jobs = [q.enqueue("t", concurrency_key="k", concurrency_limit=1) for _ in range(3)]
    first = q.claim("w", limit=5, lease_ms=10_000).jobs
    assert [j.id for j in first] == [jobs[0]]
    q.complete(jobs[0], first[0].token, None)
    second = q.claim("w", limit=5, lease_ms=10_000).jobs
    assert [j.id for j in second] == [jobs[1]]
    assert q.cancel(jobs[1]) == "leased"  # a cancel frees the slot too
    assert ids(q) == [jobs[2]]


def test_a_lapsed_lease_frees_its_slot_and_a_heartbeat_keeps_it(fq: tuple[Queue, Clock]) -> None:
    q, clock = fq
    a = q.enqueue("t", concurrency_key="k", concurrency_limit=1)
    b = q.enqueue("t", concurrency_key="k", concurrency_limit=1)
    lease = q.claim("w", limit=5, lease_ms=1_000).jobs[0]
    assert lease.id == a
    clock.set_ms(T0 + 900)
    q.heartbeat([(a, lease.token)], lease_ms=1_000)  # held until T0 + 1900
    clock.set_ms(T0 + 1_500)
    assert ids(q) == []  # the claim-time lease end passed, the heartbeat's did not
    clock.set_ms(T0 + 1_900)
    # Lapsed: the reaper puts `a` back (due at its lease's end) and the slot is free again.
    assert ids(q, limit=1) == [b]


def test_a_rate_window_limits_starts_and_next_ms_is_the_next_slot(
    fq: tuple[Queue, Clock],
) -> None:
    q, clock = fq
    jobs = [q.enqueue("send", rate_limit="2/1s") for _ in range(5)]
    batch = q.claim("w", limit=10, lease_ms=60_000)
    assert [j.id for j in batch.jobs] == jobs[:2]
    # The rest are held (not failed); the worker sleeps until the next slot, not the lease end.
    assert batch.next_ms == T0 + 1_000
    held = q.get_job(jobs[2])
    assert held.state == "held" and held.attempts == 0
    assert held.fields["flow_reason"] == f"rate window send (2 per 1000 ms) until {T0 + 1_000}"
    clock.set_ms(T0 + 999)
    assert ids(q) == []
    clock.set_ms(T0 + 1_000)
    assert ids(q) == jobs[2:4]


def test_a_rate_key_is_shared_across_tasks(fq: tuple[Queue, Clock]) -> None:
    q, _ = fq
    a = q.enqueue("a", rate_limit=(1, 60_000), rate_key="api")
    q.enqueue("b", rate_limit=(1, 60_000), rate_key="api")
    plain = q.enqueue("c")
    assert ids(q) == [a, plain]


def test_a_held_job_can_be_cancelled_and_the_key_moves_on(fq: tuple[Queue, Clock]) -> None:
    q, _ = fq
    jobs = [q.enqueue("t", concurrency_key="k", concurrency_limit=1) for _ in range(3)]
    lease = q.claim("w", limit=5, lease_ms=10_000).jobs[0]
    assert q.cancel(jobs[1]) == "held"  # set aside, found through flow:held
    assert q.status(jobs[1]).value == "cancelled"
    q.complete(jobs[0], lease.token, None)
    assert ids(q) == [jobs[2]]


def test_a_bad_flow_field_is_refused_by_the_script_and_writes_nothing(
    fq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, _ = fq
    q.enqueue("t")
    before = dump_queue(client, q)
    good = ["id1", "t", "{}", "in", "0", "5", "1000,2.0,1000,0.0", "0", "", "1000", "", ""]
    bad_flows = (
        "10||0||0|0|",
        "x",
        "1|k|0||0|0|",
        "1||0|r|0|1000|",
        "1||0||0|0|a",
        "1|a b|2||0|0|",
    )
    for flow in bad_flows:
        with pytest.raises(BadArgument):
            q._execute(Script("enqueue", ["1", *good, flow]))
    assert dump_queue(client, q) == before
    with pytest.raises(BadArgument, match="priority"):
        q.enqueue("t", priority=10)
    assert dump_queue(client, q) == before


def test_jobs_show_and_stats_say_why(fq: tuple[Queue, Clock], redis_url: str) -> None:
    q, _ = fq
    jobs = [q.enqueue("t", concurrency_key="k", concurrency_limit=1, priority=3) for _ in range(2)]
    q.enqueue("r", rate_limit="1/1h")
    q.enqueue("r", rate_limit="1/1h")
    ids(q)
    run = CliRunner().invoke(
        cli, ["jobs", "show", jobs[1], "--url", redis_url, "-q", q.name, "--json"]
    )
    assert run.exit_code == 0, run.output
    data = json.loads(run.stdout)
    assert data["flow"] == "limited by key k (1 leased)"
    assert (data["priority"], data["concurrency_key"], data["concurrency_limit"]) == (3, "k", 1)
    run = CliRunner().invoke(cli, ["stats", "--url", redis_url, "-q", q.name, "--json"])
    assert run.exit_code == 0, run.output
    row = json.loads(run.stdout)["queues"][0]
    assert row["held"] == {"key_limit": 1, "rate_window": 1, "waiting": 0}
    assert row["due"] == 2


def test_cli_enqueue_takes_the_flow_options(
    fq: tuple[Queue, Clock], client: redis.Redis, redis_url: str
) -> None:
    q, _ = fq
    base = ["enqueue", "t", "--url", redis_url, "-q", q.name, "--json"]
    before = dump_queue(client, q)
    bad = CliRunner().invoke(cli, [*base, "--priority", "12"])
    assert bad.exit_code == 2 and "priority" in bad.output
    bad = CliRunner().invoke(cli, [*base, "--rate-limit", "often"])
    assert bad.exit_code == 2 and "rate_limit" in bad.output
    assert dump_queue(client, q) == before
    flags = ["--priority", "4", "--concurrency-key", "k", "--concurrency-limit", "3"]
    run = CliRunner().invoke(cli, [*base, *flags, "--rate-limit", "5/1m"])
    assert run.exit_code == 0, run.output
    f = q.get_job(json.loads(run.stdout)["id"]).fields
    assert (f["priority"], f["ckey"], f["climit"]) == ("4", "k", "3")
    assert (f["rkey"], f["rcount"], f["rwindow"]) == ("t", "5", "60000")


def test_a_job_after_others_runs_once_all_are_done(fq: tuple[Queue, Clock]) -> None:
    q, _ = fq
    a, b = q.enqueue("t"), q.enqueue("t")
    child = q.enqueue("t", after=[a, b])
    assert q.get_job(child).fields["flow_reason"] == "waiting for 2 jobs"
    assert q.status(child).value == "held" and q.counts().due == 3
    leases = q.claim("w", limit=10, lease_ms=10_000).jobs
    assert [j.id for j in leases] == [a, b]  # not the child: its parents are not done
    q.complete(a, leases[0].token, "A")
    assert q.get_job(child).fields["flow_reason"] == "waiting for 1 jobs"
    assert ids(q) == []
    q.complete(b, leases[1].token, "B")
    assert ids(q) == [child]
    late = q.enqueue("t", after=[a])  # a parent already done counts as done
    assert ids(q) == [late]


def test_a_dead_or_cancelled_parent_parks_the_subtree(fq: tuple[Queue, Clock]) -> None:
    q, _ = fq
    parent = q.enqueue("t", max_attempts=1)
    child = q.enqueue("t", after=[parent])
    grandchild = q.enqueue("t", after=[child])
    lease = q.claim("w", limit=1, lease_ms=10_000).jobs[0]
    assert q.fail(parent, lease.token, ("E", "m", "")).status == "dead"
    assert q.get_job(child).dead_reason == f"parent dead: {parent}"
    assert q.get_job(grandchild).dead_reason == f"parent dead: {child}"
    other = q.enqueue("t")
    waiting = q.enqueue("t", after=[other])
    assert q.cancel(other) == "due"
    assert q.get_job(waiting).dead_reason == f"parent cancelled: {other}"
    at_once = q.enqueue("t", after=[other])  # a parent already cancelled: parked at enqueue
    assert q.get_job(at_once).dead_reason == f"parent cancelled: {other}"
    assert ids(q) == []


def test_a_missing_parent_is_refused_and_writes_nothing(
    fq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, _ = fq
    before = dump_queue(client, q)
    with pytest.raises(BadArgument, match="no such job"):
        q.enqueue("t", after=["nope"])
    assert dump_queue(client, q) == before


def test_chain_runs_each_step_after_the_previous(fq: tuple[Queue, Clock]) -> None:
    q, _ = fq
    first, second = chain(q, [("a", 1), ("b", 2)])
    lease = q.claim("w", limit=10, lease_ms=10_000).jobs
    assert [j.id for j in lease] == [first]
    q.complete(first, lease[0].token, {"out": 10})
    step = q.claim("w", limit=10, lease_ms=10_000).jobs[0]
    assert step.id == second and step.payload() == {"payload": 2, "parent": first}
    assert q.result(first, timeout_s=1) == {"out": 10}


def test_task_defaults_give_priority_and_a_per_task_limit(fq: tuple[Queue, Clock]) -> None:
    from scheduler import Registry

    q, _ = fq
    reg = Registry()

    @reg.task("slow", concurrency_limit=1, priority=2)
    def slow(payload: object, ctx: object) -> None: ...

    a, b = slow.enqueue(q), slow.enqueue(q)
    assert q.get_job(a).fields["ckey"] == "slow"  # the task name is the key
    urgent = slow.enqueue(q, priority=9, concurrency_key="other", concurrency_limit=5)
    assert ids(q) == [urgent, a]  # b waits for a's slot; the job's own values win
    assert q.get_job(b).fields["flow_reason"] == "limited by key slow (1 leased)"
    with pytest.raises(BadArgument, match="priority"):
        reg.task("bad", priority=12)(lambda p, c: None)
