"""`scheduler doctor` / `doctor --fix`, a second adversarial review: the flow-control repairs
('ckfree': a stray member of a key's lease set flow:ck:<key>; 'ckstale': a stale entry of its
hold set flow:ckheld:<key>), the record repairs ('expire', 'persist') and the two-places
repair that ends a lapsed lease, each run stale (the queue changed between doctor's read and
the fix), and doctor's findings on a healthy queue busy with every flow-control state.

Unlike the per-job repairs (re-planned under WATCH by repair_queue), the ckfree and ckstale
plans are run as check_queue made them (doctor_flow.fix_stray_slots): lua/repair.lua's own
guards are all that keeps them safe. Real scripts on the session's private Redis."""

from __future__ import annotations

import json
import shlex
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import JobState, Queue
from scheduler.admin import doctor, doctor_flow
from scheduler.admin.doctor import Issue, check_queue, repair_queue
from scheduler.admin.inspection import server_now_ms
from scheduler.cli.main import main
from scheduler.core.connection import connect
from tests.conftest import dump_queue
from tests.test_doctor_repair import run_plan

HOUR_MS = 3_600_000
FAR_MS = 4_000_000_000_000


def only(issues: list[Issue], code: str) -> Issue:
    assert [i.code for i in issues] == [code], [(i.code, i.message) for i in issues]
    return issues[0]


def ck(q: Queue, key: str = "k") -> str:
    return q.keys.prefix + "flow:ck:" + key


def ckheld(q: Queue, key: str = "k") -> str:
    return q.keys.prefix + "flow:ckheld:" + key


def keyed(q: Queue, jid: str, limit: int, **kw: Any) -> str:
    return q.enqueue("t", jid, job_id=jid, concurrency_key="k", concurrency_limit=limit, **kw)


@pytest.fixture
def cli(redis_url: str) -> Callable[..., Result]:
    runner = CliRunner(env={"COLUMNS": "250"})

    def run(*args: str) -> Result:
        return runner.invoke(main, [*args, "--url", redis_url], catch_exceptions=True)

    return run


# -- defects ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kept", ["dead", "due"])
def test_two_places_fix_that_ends_a_lapsed_lease_frees_its_key_slot(
    q: Queue, client: redis.Redis, kept: str
) -> None:
    """A job of key k (limit 1) is both leased (its lease lapsed a second ago: not in force)
    and dead (or due), its state naming the other place (a park or a requeue whose ZREM from
    leased was lost: a hand edit, an old tool); h waits behind it, held by the key. --fix
    keeps the place its state names and ZREMs it from leased ('unlist'), but, unlike every
    transition out of leased (fail's park, a release, the reaper, repair.lua's own 'dead' and
    'due' moves: lib/flow.lua flow_release), leaves its slot in flow:ck:k. The same --fix then
    ends with a finding it made itself ('flow-slot-stray ... added by hand?', an error: exit
    1); kept dead, h stays held with no lease of k running: claims get nothing until a second
    --fix."""
    keyed(q, "a", 1)
    keyed(q, "h", 1)
    assert [j.id for j in q.claim("w", limit=5).jobs] == ["a"]
    now = server_now_ms(client)
    client.zadd(q.keys.leased, {"a": now - 1000})
    client.zadd(ck(q), {"a": now - 1000})
    client.zadd(getattr(q.keys, kept), {"a": now})
    client.hset(q.keys.job("a"), "state", kept)
    only(check_queue(client, q.name), "two-places")
    report = repair_queue(client, q.name)
    assert [i.code for i in report.fixed] == ["two-places"]
    assert client.zscore(q.keys.leased, "a") is None
    assert report.remaining == [], [(i.code, i.message) for i in report.remaining]
    assert client.zcard(ck(q)) == 0, "the slot of the lease --fix ended is still taken"
    first = "h" if kept == "dead" else "a"  # kept due, a is k's oldest job again
    assert [j.id for j in q.claim("w", limit=5).jobs] == [first], "h is stranded"


@pytest.mark.parametrize(
    ("key", "member"),
    [("bad key", "ghost"), ("k", "x" * 1100)],
    ids=["key-name-with-a-space", "member-longer-than-an-id"],
)
def test_fix_reports_a_key_set_repair_redis_refuses_and_repairs_the_rest(
    q: Queue, client: redis.Redis, key: str, member: str
) -> None:
    """A stray member doctor reports as fixable (its 'what --fix runs' line printed), in a
    lease set whose key name repair.lua refuses ('bad key': no concurrency_key can be so, but
    SCAN finds the hand-written set) or whose id is longer than repair.lua takes. --fix runs
    fix_stray_slots before any job repair, without the ResponseError handling the job repairs
    have (_attempt: '--fix was refused: ...', then the next job): repair_queue raises
    `BAD_ARGUMENT key=` / `id=`, the orphan beside it is not re-armed, and the CLI exits with
    one line, 'Redis refused the command', no report (and no other queue checked)."""
    client.zadd(ck(q, key), {member: FAR_MS})
    orphan = q.enqueue("t", 1)
    q.release([(j.id, j.token) for j in q.claim("w0", limit=1).jobs])
    client.zrem(q.keys.due, orphan)
    found = sorted(i.code for i in check_queue(client, q.name))
    assert found == ["flow-slot-stray", "orphan-hash"]
    report = repair_queue(client, q.name)  # raised: redis.exceptions.ResponseError
    assert [i.code for i in report.fixed] == ["orphan-hash"]
    (left,) = report.remaining
    assert left.code == "flow-slot-stray" and "refused" in left.message
    assert client.zscore(q.keys.due, orphan) is not None


def test_cli_fix_with_a_refused_key_set_repair_still_prints_its_report(
    cli: Callable[..., Result], q: Queue, client: redis.Redis
) -> None:
    client.zadd(ck(q, "bad key"), {"ghost": FAR_MS})
    q.enqueue("t", 1)
    res = cli("doctor", "--no-server", "--fix", "--json", "-q", q.name)
    assert "Redis refused the command" not in res.output, res.output
    out = json.loads(res.output)
    assert [f["code"] for f in out["findings"]] == ["flow-slot-stray"]


def test_fix_does_not_report_a_stray_slot_a_claim_dropped_before_its_repair(
    q: Queue, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stray member whose score has passed (a lapsed entry no lease backs) is a finding;
    a claim of one of the key's jobs drops such a member itself (lib/flow.lua flow_ck_live).
    When that claim lands between --fix's check and its 'ckfree' (repair.lua answers 0: not
    a member), repair_queue keeps the check's list: the report says the stray is still there
    (an error: exit 1) on a queue where nothing is wrong, and a second --fix finds nothing."""
    client.zadd(ck(q), {"ghost": server_now_ms(client) - 60_000})
    keyed(q, "a", 1)
    only(check_queue(client, q.name), "flow-slot-stray")
    real = doctor_flow.fix_stray_slots

    def after_a_claim(c: redis.Redis, issues: list[Issue]) -> list[Issue]:
        assert [j.id for j in q.claim("w", limit=1).jobs] == ["a"]  # drops the lapsed member
        return real(c, issues)

    monkeypatch.setattr(doctor, "fix_stray_slots", after_a_claim)
    report = repair_queue(client, q.name)
    assert check_queue(client, q.name) == []
    assert report.remaining == [], [(i.code, i.message) for i in report.remaining]


# -- held: the stale key-set plans, run as fix_stray_slots runs them -------------------------
def test_stale_ckfree_plan_keeps_a_member_that_became_a_lease_of_the_key(
    q: Queue, client: redis.Redis
) -> None:
    """m is due; its id is in k's lease set by hand (stray). Before the fix, a claim leases m
    for real (the claim keeps the member, now its lease). The stale plan answers 0: the slot
    of the running job stays taken, and a job of the key behind it stays held."""
    keyed(q, "a", 3)
    (ja,) = q.claim("w", limit=1).jobs
    keyed(q, "m", 3)
    client.zadd(ck(q), {"m": FAR_MS})
    issue = only(check_queue(client, q.name), "flow-slot-stray")
    assert [j.id for j in q.claim("w", limit=1).jobs] == ["m"]
    keyed(q, "x", 3)
    keyed(q, "y", 3)
    assert [j.id for j in q.claim("w", limit=5).jobs] == ["x"]  # 3 of 3: a, m, x
    assert q.status("y") == JobState.HELD
    assert run_plan(client, issue) == [0]
    assert client.zscore(ck(q), "m") is not None
    assert q.status("y") == JobState.HELD
    assert q.claim("w", limit=5).jobs == []
    q.complete("a", ja.token, 1)
    assert [j.id for j in q.claim("w", limit=5).jobs] == ["y"]


def test_stale_ckfree_plan_after_a_lease_of_the_key_ended_keeps_the_limit(
    q: Queue, client: redis.Redis
) -> None:
    """A stray holds one of k's two slots; a (leased) holds the other; h and i wait. Before the
    fix, a completes: its end lets h go (one slot free). Then the stale ckfree frees the stray's
    slot: i goes too. Never more than two leases of k at once."""
    keyed(q, "a", 2)
    client.zadd(ck(q), {"ghost": FAR_MS})
    (ja,) = q.claim("w", limit=5).jobs
    keyed(q, "h", 2)
    keyed(q, "i", 2)
    assert q.claim("w", limit=5).jobs == []
    issue = only(check_queue(client, q.name), "flow-slot-stray")
    q.complete("a", ja.token, 1)
    assert run_plan(client, issue) == [1]
    got = [j.id for j in q.claim("w", limit=5).jobs]
    assert sorted(got) == ["h", "i"]
    assert client.zcard(ck(q)) == 2
    keyed(q, "j", 2)
    assert q.claim("w", limit=5).jobs == []


def test_stale_ckstale_plan_keeps_an_entry_whose_job_was_since_set_aside(
    q: Queue, client: redis.Redis
) -> None:
    """x is due (not held) with an entry in k's hold set by hand (stale). Before the fix, a
    claim finds k full and sets x aside for real. The stale plan answers 0 and the entry stays:
    x goes once a's lease ends."""
    keyed(q, "a", 1)
    (ja,) = q.claim("w", limit=1).jobs
    client.zrem(q.keys.prefix + "flow:ck:k", "a")  # k looks empty: x is enqueued due
    keyed(q, "x", 1)
    client.zadd(ck(q), {"a": FAR_MS})
    client.zadd(ckheld(q), {"x": 0})
    issue = only(check_queue(client, q.name), "flow-held-stale")
    assert q.claim("w", limit=1).jobs == []  # k full: x set aside
    assert q.status("x") == JobState.HELD
    assert run_plan(client, issue) == [0]
    assert client.zscore(ckheld(q), "x") is not None
    q.complete("a", ja.token, 1)
    assert [j.id for j in q.claim("w", limit=5).jobs] == ["x"]


def test_key_set_repair_lines_name_the_move_the_key_and_the_member(
    q: Queue, client: redis.Redis
) -> None:
    client.zadd(ck(q), {"ghost": FAR_MS})
    issue = only(check_queue(client, q.name), "flow-slot-stray")
    (line,) = issue.redis_cli()
    assert line.startswith("scheduler doctor --fix   # runs lua/repair.lua on ")
    assert line.split(": ", 1)[1].split()[:3] == ["ckfree", "ghost", "''"]
    assert line.endswith(" k")
    assert issue.to_json()["fixable"] is True


# -- held: the record repairs run stale ------------------------------------------------------
def test_stale_expire_plan_leaves_a_job_enqueued_again_under_the_id(
    q: Queue, client: redis.Redis
) -> None:
    """A done record kept forever (record-no-ttl, fix: expire it). It is deleted meanwhile (an
    operator's DEL, or an expiry set by hand ran out) and a producer enqueues the id again.
    The stale plan answers 0: the new pending job gets no expiry."""
    q.enqueue("t", 1, job_id="x")
    (job,) = q.claim("w", limit=1).jobs
    q.complete("x", job.token, 1)
    client.persist(q.keys.job("x"))
    issue = only(check_queue(client, q.name), "record-no-ttl")
    client.delete(q.keys.job("x"), q.keys.spec("x"))
    assert q.enqueue("t", 2, job_id="x") == "x"
    assert run_plan(client, issue) == [0]
    assert client.pttl(q.keys.spec("x")) == -1
    assert client.pttl(q.keys.job("x")) in (-1, -2)
    (again,) = q.claim("w", limit=1).jobs
    assert again.payload_json == "2"


def test_stale_persist_plan_leaves_the_record_of_a_job_that_finished_meanwhile(
    q: Queue, client: redis.Redis
) -> None:
    """A due job with an expiry (expiring-job, fix: persist). A worker claims and completes it
    before the fix: the stale plan answers 0 and the done record keeps its expiry."""
    q.enqueue("t", 1, job_id="x")
    q.release([(j.id, j.token) for j in q.claim("w0", limit=1).jobs])
    client.pexpire(q.keys.job("x"), HOUR_MS)
    only(check_queue(client, q.name), "expiring-job")
    issue = only(check_queue(client, q.name), "expiring-job")
    (job,) = q.claim("w", limit=1).jobs
    q.complete("x", job.token, 1)
    assert run_plan(client, issue) == [0]
    assert client.pttl(q.keys.job("x")) > 0


# -- held: no false findings on a queue busy with every flow-control state ---------------------
def _busy_flow_queue(q: Queue) -> None:
    """Leases of a key with jobs held behind it, a rate window with jobs waiting for it,
    priorities, a child waiting for its parent, a schedule, a kept payload, a retry, a
    cancelled waiting job and a cancelled running one."""
    for jid in ("g", "h", "i"):
        keyed(q, jid, 2)
    for n in range(3):
        q.enqueue("t", n, job_id=f"r{n}", rate_limit="1/1h", rate_key="rk")
    q.enqueue("t", 1, job_id="p9", priority=9)
    parent = q.enqueue("t", 1, job_id="par", delay_ms=HOUR_MS)
    q.enqueue("t", 1, job_id="kid", after=[parent])
    q.schedule("tick", "t", every_ms=60_000)
    q.enqueue("t", 1, job_id="kp", keep_payload=True)
    q.enqueue("t", 1, job_id="cx", delay_ms=HOUR_MS)
    q.cancel("cx")
    q.enqueue("t", 1, job_id="retry", max_attempts=3)
    q.enqueue("t", 1, job_id="lc")
    for j in q.claim("w", limit=20).jobs:
        if j.id == "kp":
            q.complete(j.id, j.token, {"x": 1})
        elif j.id == "retry":
            q.fail(j.id, j.token, ValueError("x"), retryable=True)
        elif j.id == "lc":
            assert q.cancel("lc") == "leased"


def test_a_queue_busy_with_flow_control_has_no_findings_and_fix_changes_nothing(
    q: Queue, client: redis.Redis
) -> None:
    _busy_flow_queue(q)
    assert q.status("i") == JobState.HELD and q.status("r1") == JobState.HELD
    assert check_queue(client, q.name) == []
    before = dump_queue(client, q)
    report = repair_queue(client, q.name)
    assert (report.fixed, report.remaining) == ([], [])
    assert dump_queue(client, q) == before


@pytest.mark.parametrize("what", ["complete", "claim", "release"])
def test_a_lease_change_between_the_key_set_reads_is_no_finding(
    q: Queue, client: redis.Redis, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    """The key-set check reads the members in pages, then each suspect again in one MULTI: a
    lease of the key ending (its held job let go), starting, or given back between the two
    reads is no finding and --fix moves nothing."""
    _busy_flow_queue(q)
    tokens = {j.id: j.token for j in q.claim("w2", limit=20).jobs}
    leases = {str(m) for m in client.zrange(ck(q), 0, -1)}
    real = doctor_flow._reads
    done: list[int] = []

    def meanwhile(c: redis.Redis, k: Any, key: str, ids: Any, transaction: bool) -> Any:
        out = real(c, k, key, ids, transaction)
        if not done and not transaction and key == ck(q):
            done.append(1)
            jid = sorted(leases)[0]
            token = tokens.get(jid) or str(client.hget(q.keys.job(jid), "token"))
            if what == "complete":
                q.complete(jid, token, 1)
            elif what == "release":
                q.release([(jid, token)])
            else:
                q.complete(jid, token, 1)
                q.claim("w3", limit=5)
        return out

    monkeypatch.setattr(doctor_flow, "_reads", meanwhile)
    report = repair_queue(client, q.name)
    assert done == [1]
    assert (report.fixed, report.remaining) == ([], []), [
        (i.code, i.message) for i in report.fixed + report.remaining
    ]


# -- the commands a finding prints --------------------------------------------------------------
def _pasted(cli: Callable[..., Result], line: str) -> Result:
    """Run a printed `scheduler ...` command as an operator pastes it (this server's --url)."""
    args = shlex.split(line)
    assert args[0] == "scheduler", line
    return cli(*args[1:])


def test_stuck_waiting_fix_line_shows_the_job_of_its_own_queue(
    cli: Callable[..., Result], q: Queue, client: redis.Redis
) -> None:
    """A child left waiting for ever (its parent's `kids` mark deleted by hand): the finding's
    fix is 'scheduler jobs show <id>; cancel it ...' with no -q. `jobs show` reads queue
    'default' (or $SCHEDULER_QUEUE), so the pasted command answers "no job ... in queue
    'default'" for the job of any other queue; every other command doctor prints names its
    queue (`dead purge -q`, `doctor --fix --queue`, `dead retention -q`)."""
    parent = q.enqueue("t", 1)
    child = q.enqueue("t", 2, after=[parent])
    client.hdel(q.keys.job(parent), "kids")
    (job,) = q.claim("w", limit=5).jobs
    q.complete(job.id, job.token)
    issue = only(check_queue(client, q.name), "stuck-waiting")
    res = _pasted(cli, issue.fix.split(";")[0])
    assert res.exit_code == 0, res.output
    assert child in res.output


def test_undecodable_fix_of_a_never_claimed_job_names_a_key_that_holds_it(
    q: Queue, client: redis.Redis, redis_url: str
) -> None:
    """A pending job (never claimed: its spec record spec:<id> alone, no hash) whose payload
    bytes are not UTF-8. The finding says "inspect it (redis-cli HGETALL ...job:<id>), then
    rewrite the field": that hash does not exist (HGETALL answers an empty list) and there is
    no field to rewrite; the bytes are in the STRING spec:<id> (redis-cli GET)."""
    jid = q.enqueue("t", {"a": "x"})
    assert client.exists(q.keys.job(jid)) == 0
    raw = redis.Redis.from_url(redis_url)
    try:
        spec = raw.get(q.keys.spec(jid))
        assert isinstance(spec, bytes)
        raw.set(q.keys.spec(jid), spec.replace(b'"x"', b'"\xff"'))
    finally:
        raw.close()
    surrogates = connect(redis_url, encoding_errors="surrogateescape")
    try:
        issue = only(check_queue(surrogates, q.name), "undecodable")
    finally:
        surrogates.close()
    cmd = shlex.split(issue.fix.split("redis-cli ", 1)[1].split(")", 1)[0])
    verb, key = cmd[0].upper(), cmd[1]
    kinds = {"HGETALL": "hash", "GET": "string"}
    assert client.type(key) == kinds.get(verb), (issue.fix, client.type(key))


def test_record_gone_dead_line_purges_the_id(
    cli: Callable[..., Result], q: Queue, client: redis.Redis
) -> None:
    client.zadd(q.keys.dead, {"lost": server_now_ms(client)})
    issue = only(check_queue(client, q.name), "missing-hash")
    line = issue.fix.split("to drop it: ", 1)[1]
    res = _pasted(cli, line + " --yes")
    assert res.exit_code == 0, res.output
    assert q.dead_ids() == [] and check_queue(client, q.name) == []


def test_no_false_findings_while_a_worker_moves_keyed_and_rated_jobs(
    q: Queue, client: redis.Redis
) -> None:
    """A worker thread claims, completes, retries and gives back jobs of a concurrency key
    (limit 2), a rate window, priorities and parent/child pairs while doctor checks: each
    check (jobs and key sets, re-read in one MULTI) finds nothing."""
    worker_q = Queue(redis.Redis(connection_pool=client.connection_pool), q.name)
    assert doctor_under_load(worker_q, client, per_feed=20, checks=20, deadline_s=30) > 0


def doctor_under_load(
    worker_q: Queue, client: Any, *, per_feed: int, checks: int, deadline_s: float
) -> int:
    """A thread claims, completes, retries and gives back keyed (limit 2), rated, prioritised
    and parent/child jobs of worker_q while `check_queue` on `client` must find nothing, at
    least `checks` times and until 50 jobs moved (or deadline_s): how many moved."""
    stop = threading.Event()
    moved = [0]

    def feed() -> None:
        for n in range(per_feed):
            worker_q.enqueue("t", n, concurrency_key="k", concurrency_limit=2, max_attempts=9)
            worker_q.enqueue("t", n, rate_limit="5/1s", rate_key="r", priority=n % 9)
            parent = worker_q.enqueue("t", n)
            worker_q.enqueue("t", n, after=[parent], concurrency_key="k", concurrency_limit=2)

    def work() -> None:
        n = 0
        while not stop.is_set():
            batch = worker_q.claim("busy", limit=4)
            for job in batch.jobs:
                n += 1
                if n % 3 == 0:
                    worker_q.fail(job.id, job.token, ValueError("x"), retryable=True)
                elif n % 5 == 0:
                    worker_q.release([(job.id, job.token)])
                else:
                    worker_q.complete(job.id, job.token, n)
            moved[0] += len(batch.jobs)
            if not batch.jobs:
                feed()

    feed()
    thread = threading.Thread(target=work)
    thread.start()
    try:
        deadline = time.monotonic() + deadline_s
        done = 0
        while done < checks or (moved[0] < 50 and time.monotonic() < deadline):
            found = check_queue(client, worker_q.name)
            assert found == [], [(i.code, i.job_id, i.message) for i in found]
            done += 1
    finally:
        stop.set()
        thread.join(timeout=30)
    return moved[0]
