"""`scheduler doctor --fix` against live workers and producers, from an adversarial review.

Each repair plan (Issue.repair: lua/repair.lua moves) promises to check, in the same atomic
step, that the job is still as the check read it, and to do nothing otherwise ("a job claimed,
reaped, finished or requeued since the check is not moved", lua/repair.lua). Here each plan is
made by `check_queue`, then a worker or a producer changes the job, then the plan runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import Queue
from scheduler.admin import doctor
from scheduler.admin.doctor import Issue, check_queue, repair_queue
from scheduler.admin.inspection import server_now_ms
from scheduler.cli.main import main
from tests.conftest import dump_queue
from tests.test_doctor_repair import due_with_a_hash, run_plan

HOUR_MS = 3_600_000


def only(issues: list[Issue], code: str) -> Issue:
    assert [i.code for i in issues] == [code], [(i.code, i.message) for i in issues]
    return issues[0]


# -- defects: a stale plan moves a job the check no longer describes ----------------------------
def test_bad_score_plan_run_after_a_reschedule_does_not_run_the_job_early(
    q: Queue, client: redis.Redis
) -> None:
    """A due job's score was edited into `inf` (bad-score, fix: score := now). Before the fix
    runs, an operator reschedules the job an hour ahead (a valid score again). The stale
    'score' move only checks the job is still in due, not that its score is still the bad one
    it read: it sets the score to now and the next claim runs the job an hour early."""
    job_id = due_with_a_hash(q)
    client.zadd(q.keys.due, {job_id: "inf"})
    issue = only(check_queue(client, q.name), "bad-score")
    assert q.reschedule(job_id, delay_ms=HOUR_MS) == "rescheduled"
    later = client.zscore(q.keys.due, job_id)
    run_plan(client, issue)
    assert client.zscore(q.keys.due, job_id) == later, "the rescheduled run time was overwritten"
    assert q.claim("w", limit=1).jobs == [], "the job ran an hour before its run time"


def test_bad_score_plan_run_after_a_heartbeat_keeps_the_live_lease(
    q: Queue, client: redis.Redis
) -> None:
    """A leased job's lease score was edited into `inf` (bad-score, fix: lease := now). Its
    worker is alive and heartbeats before the fix runs (the lease is a valid time again). The
    stale 'score' move sets the lease to now all the same: the next claim reaps it and a second
    worker runs the job while the first still runs it, whose next heartbeat is refused."""
    job_id = q.enqueue("t", 1)
    (job,) = q.claim("w1", limit=1).jobs
    client.zadd(q.keys.leased, {job_id: "inf"})
    issue = only(check_queue(client, q.name), "bad-score")
    _, status = q.heartbeat([(job_id, job.token)])
    assert status == {job_id: "held"}
    run_plan(client, issue)
    assert q.claim("w2", limit=1).jobs == [], "a second worker got the job while w1 runs it"
    assert q.heartbeat([(job_id, job.token)])[1] == {job_id: "held"}


def test_orphan_plan_run_after_the_worker_completed_does_not_run_the_job_again(
    q: Queue, client: redis.Redis
) -> None:
    """A running job's leased entry was lost (ZREM by hand): orphan-hash, state 'leased', fix
    puts it in due. Its worker then completes it (done, result kept, an expiry). The stale
    'due' move checks only that the id is still in no place, which a finished record is too:
    it turns the done record back into a due job (its expiry dropped) and it runs a second
    time, after its result was acknowledged; the plan answers 1, 'moved'."""
    job_id = q.enqueue("t", 1)
    (job,) = q.claim("w", limit=1).jobs
    client.zrem(q.keys.leased, job_id)
    issue = only(check_queue(client, q.name), "orphan-hash")
    q.complete(job_id, job.token, {"sent": True})
    assert client.hget(q.keys.job(job_id), "state") == "done"
    before = dump_queue(client, q)
    assert run_plan(client, issue) == [0]
    assert dump_queue(client, q) == before
    assert q.claim("w2", limit=1).jobs == [], "a completed job ran a second time"


def test_bad_score_plan_run_after_a_debounced_enqueue_does_not_run_it_early(
    q: Queue, client: redis.Redis
) -> None:
    """A producer's race, no operator needed: a debounced job's due score is damaged (`inf`,
    bad-score). The producer's next debounced call replaces the job (same id) to run in an
    hour, acknowledged. The stale 'score' move then sets the score to now: the job the
    producer asked for in an hour runs at once."""
    jid = q.enqueue("t", {"v": 1}, key="digest:1", debounce=True)
    client.zadd(q.keys.due, {jid: "inf"})
    issue = only(check_queue(client, q.name), "bad-score")
    assert q.enqueue("t", {"v": 2}, key="digest:1", debounce=True, delay_ms=HOUR_MS) == jid
    run_plan(client, issue)
    assert q.claim("w", limit=1).jobs == [], "the debounced job ran an hour early"


@pytest.mark.xfail(
    strict=True,
    reason="a documented limit (docs/durability.md, doctor): a plan run by hand later checks "
    "the job's place and lease, not its payload; doctor --fix itself WATCHes the job's keys",
)
def test_park_plan_run_after_a_debounced_enqueue_does_not_park_the_new_job(
    q: Queue, client: redis.Redis
) -> None:
    """A debounced pending job's payload is damaged (bad-payload: fix parks it on the dead
    list). The producer's next debounced call replaces it with a good payload (same id, still
    due): an acknowledged enqueue. The stale 'dead' move checks only that the id is still in
    due and parks the new job as 'invalid payload: not JSON': it never runs, and the dead
    list blames a payload it does not have."""
    jid = q.enqueue("t", {"v": 1}, key="digest:1", debounce=True, delay_ms=60_000)
    spec = str(client.get(q.keys.spec(jid)))
    client.set(q.keys.spec(jid), spec.rsplit("|", 1)[0] + "|{not json")
    issue = only(check_queue(client, q.name), "bad-payload")
    assert q.enqueue("t", {"v": 2}, key="digest:1", debounce=True) == jid
    run_plan(client, issue)
    assert q.dead_ids() == [], "the producer's new job was parked as an invalid payload"
    (job,) = q.claim("w", limit=1).jobs
    assert (job.id, job.payload_json) == (jid, '{"v":2}')


def test_orphan_plan_run_after_its_schedule_was_removed_lists_no_ghost(
    q: Queue, client: redis.Redis
) -> None:
    """A schedule's pending run is off due (ZREM by hand): orphan-hash, fix puts it in due.
    The operator removes the schedule first (remove_schedule deletes the run's record). The
    stale 'due' move does not check the job still exists: it answers 1 ('moved') and writes
    the bare id into due, where the next claim parks it as 'job hash missing': a dead letter
    for a schedule that was removed, and a report of a repair of a job that is gone."""
    q.schedule("tick", "t", every_ms=60_000)
    run = str(client.hget(q.keys.schedule("tick"), "pending"))
    client.zrem(q.keys.due, run)
    issue = only(check_queue(client, q.name), "orphan-hash")
    assert q.remove_schedule("tick") == "removed"
    assert client.exists(q.keys.job(run), q.keys.spec(run)) == 0
    assert run_plan(client, issue) == [0]
    assert client.zscore(q.keys.due, run) is None
    assert check_queue(client, q.name) == []


# -- held: what --fix (repair_queue: every move re-planned under WATCH) does ---------------------
def _busy_healthy_queue(q: Queue) -> None:
    """Every normal state a live queue has at once."""
    q.enqueue("t", {"n": 1})  # due
    q.enqueue("t", {"n": 2}, delay_ms=HOUR_MS)  # scheduled
    parent = q.enqueue("t", {"n": 3}, delay_ms=HOUR_MS)
    q.enqueue("t", {"n": 4}, after=[parent])  # waiting for its parent (held)
    q.enqueue("t", {"n": 5}, job_id="dies", max_attempts=1)
    q.enqueue("t", {"n": 6}, job_id="done")
    q.enqueue("t", {"n": 7}, job_id="runs")
    for j in q.claim("w", limit=10).jobs:
        if j.id == "dies":
            q.fail(j.id, j.token, ValueError("x"), retryable=False)
        elif j.id == "done":
            q.complete(j.id, j.token, 1)
        elif j.id != "runs":
            q.release([(j.id, j.token)])


def test_fix_on_a_healthy_busy_queue_changes_nothing(q: Queue, client: redis.Redis) -> None:
    _busy_healthy_queue(q)
    assert check_queue(client, q.name) == []
    before = dump_queue(client, q)
    report = repair_queue(client, q.name)
    assert (report.fixed, report.remaining) == ([], [])
    assert dump_queue(client, q) == before


def test_fix_twice_is_idempotent_and_keeps_every_job(q: Queue, client: redis.Redis) -> None:
    a, b, c = (q.enqueue("t", n) for n in range(3))
    q.release([(j.id, j.token) for j in q.claim("w0", limit=3).jobs])  # each has its hash
    _busy_healthy_queue(q)
    client.hset(q.keys.job(a), "state", "dead")  # state-mismatch
    client.zadd(q.keys.dead, {b: 0})  # two-places
    client.zrem(q.keys.due, c)  # orphan-hash
    first = repair_queue(client, q.name)
    assert sorted(i.code for i in first.fixed) == ["orphan-hash", "state-mismatch", "two-places"]
    assert first.remaining == []
    after = dump_queue(client, q)
    second = repair_queue(client, q.name)
    assert (second.fixed, second.remaining) == ([], [])
    assert dump_queue(client, q) == after
    claimed = {j.id for j in q.claim("w2", limit=10).jobs}
    assert {a, b, c} <= claimed


def test_state_plan_run_after_claim_and_complete_moves_nothing(
    q: Queue, client: redis.Redis
) -> None:
    job_id = due_with_a_hash(q)
    client.hset(q.keys.job(job_id), "state", "dead")
    issue = only(check_queue(client, q.name), "state-mismatch")
    (job,) = q.claim("w", limit=1).jobs
    q.complete(job_id, job.token, 1)
    before = dump_queue(client, q)
    assert run_plan(client, issue) == [0]
    assert dump_queue(client, q) == before


def test_lease_expired_plan_run_after_the_worker_failed_moves_nothing(
    q: Queue, client: redis.Redis
) -> None:
    job_id = q.enqueue("t", 1, max_attempts=1)
    (job,) = q.claim("w", limit=1).jobs
    # The lease lapsed long ago (nobody claimed since): doctor would park it.
    client.zadd(q.keys.leased, {job_id: server_now_ms(client) - HOUR_MS})
    issue = only(check_queue(client, q.name), "lease-expired")
    # The worker's late report arrives first: fail parks the lapsed job itself or refuses.
    q.fail(job_id, job.token, ValueError("late"), retryable=False)
    before = dump_queue(client, q)
    run_plan(client, issue)
    assert dump_queue(client, q) == before or q.dead_ids() == [job_id]
    assert q.claim("w2", limit=1).jobs == []


def test_fix_replans_when_a_producer_debounces_between_its_read_and_its_write(
    q: Queue, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`doctor --fix` (repair_queue) re-reads each job under WATCH before its move: a debounced
    enqueue landing right after that read (the race the stale plans above lose) aborts the
    move, and the re-read finds nothing to fix."""
    jid = q.enqueue("t", {"v": 1}, key="digest:1", debounce=True)
    client.zadd(q.keys.due, {jid: "inf"})
    real = doctor._quiet
    raced: list[str] = []

    def read_then_race(pipe: Any, cmd: tuple[str, ...]) -> Any:
        out = real(pipe, cmd)
        if not raced and cmd[0] == "ZSCORE" and cmd[1] == q.keys.due:
            raced.append(q.enqueue("t", {"v": 2}, key="digest:1", debounce=True, delay_ms=HOUR_MS))
        return out

    monkeypatch.setattr(doctor, "_quiet", read_then_race)
    report = repair_queue(client, q.name)
    assert raced == [jid]
    assert (report.fixed, report.remaining) == ([], [])
    assert q.claim("w", limit=1).jobs == []  # still an hour ahead


def test_fix_does_not_rerun_a_job_whose_live_worker_lost_only_its_leased_entry(
    q: Queue, client: redis.Redis
) -> None:
    """A running job's entry in leased is lost (ZREM by hand) while its worker still runs it
    and heartbeats. `doctor --fix` reads state 'leased' with a current token and puts it in
    due ("no worker will see it"): a second worker runs it at once, concurrently, and the
    first worker's heartbeat and complete are refused as 'stale': its finished run is thrown
    away. A lapse never happened; restoring the lease (leased at now + a lease length, so its
    worker's heartbeat keeps it and the reaper reruns it only if that worker is gone) keeps
    at-least-once without a concurrent second run."""
    jid = q.enqueue("t", 1)
    (job,) = q.claim("w1", limit=1).jobs
    client.zrem(q.keys.leased, jid)
    repair_queue(client, q.name)
    assert q.claim("w2", limit=1).jobs == [], "a second worker runs the job while w1 runs it"
    assert q.heartbeat([(jid, job.token)])[1] == {jid: "held"}


def test_fix_restored_lease_lapses_when_its_holder_is_gone(q: Queue, client: redis.Redis) -> None:
    """The other half of the restore: a holder that is gone never renews it, so the lease
    lapses as any other and the reaper makes the job due again (at-least-once, one lapse)."""
    jid = q.enqueue("t", 1)
    q.claim("w1", limit=1)
    client.zrem(q.keys.leased, jid)
    repair_queue(client, q.name)
    until = client.zscore(q.keys.leased, jid)
    assert until is not None and until - server_now_ms(client) > 20_000
    later = Queue(client, q.name, _clock="test")
    client.set(later.keys.test_clock, int(until) - 1)
    assert later.claim("w2", limit=1).jobs == []  # not before its end
    client.set(later.keys.test_clock, int(until) + 1)
    (again,) = later.claim("w2", limit=1).jobs
    assert (again.id, again.attempts, client.hget(q.keys.job(jid), "lapses")) == (jid, 2, "1")


def test_lease_plan_run_after_the_token_changed_moves_nothing(
    q: Queue, client: redis.Redis
) -> None:
    """The restore is for the claim doctor read: a token changed since (by hand here, as a
    new claim changes it) leaves the job where it is (reply 0, no lease written)."""
    jid = q.enqueue("t", 1)
    q.claim("w1", limit=1)
    client.zrem(q.keys.leased, jid)
    issue = only(check_queue(client, q.name), "orphan-hash")
    client.hset(q.keys.job(jid), "token", "9-0123456789abcdef")
    run_plan(client, issue)
    assert client.zscore(q.keys.leased, jid) is None


def _act(q: Queue, what: str, tokens: dict[str, str]) -> None:
    """What live workers, producers and another operator do meanwhile."""
    if what == "complete":  # g's end lets h, held behind it, go
        q.complete("g", tokens["g"], 1)
    if what == "claim":
        q.claim("w", limit=3)
    elif what in ("complete", "retry", "die"):
        for j in q.claim("w", limit=3).jobs:
            if what == "complete":
                q.complete(j.id, j.token, 1)
            else:
                q.fail(j.id, j.token, ValueError("x"), retryable=what == "retry")
    elif what == "enqueue":
        q.enqueue("t", 9, delay_ms=HOUR_MS)
        q.enqueue("t", 9)
    elif what == "cancel":
        for jid in ("a", "c", "e"):
            q.cancel(jid)
    else:
        q.requeue_dead(q.dead_ids())


@pytest.mark.parametrize(
    "what", ["claim", "complete", "retry", "die", "enqueue", "cancel", "requeue"]
)
@pytest.mark.parametrize(
    ("hook", "call"),
    [("_load_zset", 3), ("queue_key_issues", 1), ("live_ids", 1), ("unclaimed_suspects", 1)],
)
def test_fix_while_the_queue_changes_between_its_reads_finds_and_moves_nothing(
    q: Queue,
    client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    what: str,
    hook: str,
    call: int,
) -> None:
    """--fix's check reads the places, then the records, not at one moment: a claim, complete,
    retry, park, enqueue, cancel or requeue landing between those reads (after due was read,
    before leased; before the scan of records; before the pending jobs' reads) is no finding
    and --fix moves nothing."""
    q.enqueue("t", 1, job_id="a")
    q.enqueue("t", 2, job_id="b", max_attempts=1)
    q.enqueue("t", 3, job_id="c", delay_ms=HOUR_MS)
    q.enqueue("t", 4, job_id="d", max_attempts=1)
    q.enqueue("t", 5, job_id="e", max_attempts=1)
    for jid in ("g", "h"):  # one key, limit 1: g leased, h held behind it
        q.enqueue("t", 7, job_id=jid, concurrency_key="acct", concurrency_limit=1)
    tokens: dict[str, str] = {}
    for j in q.claim("w0", limit=10).jobs:  # a, b, d, e, g: each gets its hash
        tokens[j.id] = j.token
        if j.id == "d":
            q.fail(j.id, j.token, ValueError("x"), retryable=False)
        elif j.id not in ("e", "g"):  # e and g stay leased
            q.release([(j.id, j.token)])
    assert client.zscore(q.keys.flow_held, "h") is not None
    q.enqueue("t", 6, job_id="f")  # pending, its spec record alone
    real = getattr(doctor, hook)
    calls: list[int] = []

    def meanwhile(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == call:
            _act(q, what, tokens)
        return real(*args, **kwargs)

    monkeypatch.setattr(doctor, hook, meanwhile)
    report = repair_queue(client, q.name)
    assert len(calls) >= call
    assert (report.fixed, report.remaining) == ([], []), [
        (i.code, i.job_id, i.message) for i in report.fixed + report.remaining
    ]


def test_bad_score_of_a_held_job_names_where_the_score_is(q: Queue, client: redis.Redis) -> None:
    """A job held behind its concurrency key (flow:held) whose score there was edited into
    `inf`: the finding says "its score in due is inf ... so the next claim runs it". The score
    an operator must look at is in flow:held (not in due, where redis-cli ZSCORE finds
    nothing), and the next claim does not run it: it stays held until its key has room. The
    other findings name a held job's place as 'due (flow:held)'; this one uses the bare place."""
    for jid in ("g", "h"):
        q.enqueue("t", 1, job_id=jid, concurrency_key="acct", concurrency_limit=1)
    assert [j.id for j in q.claim("w", limit=2).jobs] == ["g"]
    client.zadd(q.keys.flow_held, {"h": "inf"})
    issue = only(check_queue(client, q.name), "bad-score")
    assert "flow:held" in issue.message, issue.message
    assert "next claim runs it" not in issue.message, issue.message


def test_fix_of_one_job_is_not_starved_by_producers_enqueuing_other_jobs(
    q: Queue, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--fix` WATCHes the whole due, leased and dead ZSETs around each job's repair, so any
    enqueue, claim or completion of any other job between its read and its write aborts it;
    after 5 tries it gives up silently. On a queue a producer keeps busy (here: one unrelated
    enqueue per try) the damaged job is never repaired, and the report gives the same
    finding with the same advice, `scheduler doctor --fix`, which the operator just ran."""
    job_id = due_with_a_hash(q)
    client.hset(q.keys.job(job_id), "state", "done")  # state-mismatch: fix sets 'due'
    real = doctor._quiet

    def busy(pipe: Any, cmd: tuple[str, ...]) -> Any:
        out = real(pipe, cmd)
        if cmd[0] == "ZSCORE" and cmd[1] == q.keys.due:
            q.enqueue("t", "other", delay_ms=HOUR_MS)  # another job, another producer
        return out

    monkeypatch.setattr(doctor, "_quiet", busy)
    report = repair_queue(client, q.name)
    assert client.hget(q.keys.job(job_id), "state") == "due", [
        (i.code, i.message, i.fix) for i in report.remaining
    ]


def test_an_orphan_the_operator_cancelled_is_not_run_by_the_fix(
    q: Queue, client: redis.Redis
) -> None:
    """doctor reports a waiting job in no place (orphan-hash, state 'due'; fix puts it in
    due). The operator decides to cancel it instead: `cancel` answers 'due', its word for
    "was waiting, now cancelled", but changes nothing (cancel.lua answers the stored state of
    a job in no place). The next `doctor --fix` (the re-read under WATCH still sees a due
    job in no place) puts it back in due and a worker runs the job the operator cancelled."""
    job_id = due_with_a_hash(q)
    client.zrem(q.keys.due, job_id)
    only(check_queue(client, q.name), "orphan-hash")
    answer = q.cancel(job_id)
    assert answer == "due"  # read by every caller as: cancelled, it was waiting
    repair_queue(client, q.name)
    assert q.claim("w", limit=1).jobs == [], "the job the operator cancelled ran"
    assert q.get_job(job_id).state == "cancelled"


def test_two_places_fix_keeps_a_lease_in_force(q: Queue, client: redis.Redis) -> None:
    """A running job (leased, its worker heartbeating) is also in due, its state field 'due'
    (hand edits, or a buggy tool that requeued it). --fix keeps the place its state names,
    due, and takes it out of leased: the worker's lease, still in force, is revoked (its
    heartbeat answers 'stale', its result will be refused) and a second worker runs the job
    at once, concurrently. Keeping the lease in force (leased; its end, or its lapse and the
    reaper, puts it back in due) loses nothing and runs it once."""
    jid = q.enqueue("t", 1)
    (job,) = q.claim("w1", limit=1).jobs
    client.zadd(q.keys.due, {jid: server_now_ms(client)})
    client.hset(q.keys.job(jid), "state", "due")
    repair_queue(client, q.name)
    assert q.heartbeat([(jid, job.token)])[1] == {jid: "held"}, "the live lease was revoked"
    assert q.claim("w2", limit=1).jobs == []


# -- the command line -----------------------------------------------------------------------------
@pytest.fixture
def cli(redis_url: str) -> Callable[..., Result]:
    runner = CliRunner(env={"COLUMNS": "200"})

    def run(*args: str) -> Result:
        return runner.invoke(main, [*args, "--url", redis_url], catch_exceptions=False)

    return run


def test_cli_fix_reports_what_it_did_and_a_second_fix_does_nothing(
    cli: Callable[..., Result], q: Queue, client: redis.Redis
) -> None:
    a, b = q.enqueue("t", 1), q.enqueue("t", 2)
    q.release([(j.id, j.token) for j in q.claim("w0", limit=2).jobs])
    client.hset(q.keys.job(a), "state", "done")
    client.zrem(q.keys.due, b)
    r = cli("doctor", "--no-server", "-q", q.name)
    assert r.exit_code == 1, r.output  # findings, nothing changed
    assert "state field says 'done' but the job is in due: fix sets it to 'due'" in r.output
    assert f"job {b}: job with state 'due' is in none of due, leased, dead" in r.output
    first = cli("doctor", "--no-server", "--fix", "--json", "-q", q.name)
    out = json.loads(first.output)
    assert first.exit_code == 0 and out["ok"] and out["findings"] == []
    assert sorted((f["code"], f["job_id"]) for f in out["fixed"]) == sorted(
        [("state-mismatch", a), ("orphan-hash", b)]
    )
    after = dump_queue(client, q)
    again = json.loads(cli("doctor", "--no-server", "--fix", "--json", "-q", q.name).output)
    assert (again["fixed"], again["findings"], again["ok"]) == ([], [], True)
    assert dump_queue(client, q) == after
    assert {j.id for j in q.claim("w", limit=5).jobs} == {a, b}
