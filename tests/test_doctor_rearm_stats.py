"""`doctor --fix` re-arms an orphan (a job in none of due, leased, dead: a waiting job's hash or
spec record, a recurring schedule's pending run) by putting it back in due, but its report said
only "N repaired", alike for every repair: an operator could not tell that jobs no worker would
have seen are runnable again. The report now counts them: `Report.rearmed`, `rearms` on each
finding of --json, and "M re-armed" in the printed summary. A dead job put back on the dead
list, or any other repair, is no re-arm."""

from __future__ import annotations

import json

import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.admin.doctor import check_queue, repair_queue
from scheduler.cli.main import main


def _damage(q: Queue, client: redis.Redis) -> tuple[set[str], set[str]]:
    """Three orphans (a hash, a spec record alone, a schedule's pending run) and two other
    repairs (a dead job off the dead list, a lying state). Returns (orphans, the others)."""
    held = q.enqueue("t", 1)
    (job,) = q.claim("w", limit=1).jobs
    assert q.release([(held, job.token)]) == ["released"]  # a due job that has its hash
    client.zrem(q.keys.due, held)
    pending = q.enqueue("t", 2)  # never claimed: its spec record alone
    client.zrem(q.keys.due, pending)
    q.schedule("tick", "t", every_ms=60_000)
    run = str(client.hget(q.keys.schedule("tick"), "pending"))
    client.zrem(q.keys.due, run)
    died = q.enqueue("t", 3, max_attempts=1)
    (job,) = q.claim("w", limit=1).jobs
    assert q.fail(died, job.token, ValueError("x")).status == "dead"
    client.zrem(q.keys.dead, died)  # re-listed by the fix, not re-armed
    lying = q.enqueue("t", 4)
    (job,) = q.claim("w", limit=1).jobs
    assert q.release([(lying, job.token)]) == ["released"]
    client.hset(q.keys.job(lying), "state", "done")  # state-mismatch
    return {held, pending, run}, {died, lying}


def test_the_library_report_counts_the_re_armed_orphans(q: Queue, client: redis.Redis) -> None:
    orphans, others = _damage(q, client)
    found = check_queue(client, q.name)
    assert {i.job_id for i in found if i.rearms} == orphans
    assert {i.job_id for i in found if not i.rearms} == others
    report = repair_queue(client, q.name)
    assert {i.job_id for i in report.fixed} == orphans | others and report.remaining == []
    assert {i.job_id for i in report.rearmed} == orphans
    assert all(client.zscore(q.keys.due, j) is not None for j in orphans)  # really re-armed


def test_the_cli_summary_and_json_count_the_re_armed_orphans(
    q: Queue, client: redis.Redis, redis_url: str
) -> None:
    orphans, others = _damage(q, client)
    runner = CliRunner(env={"COLUMNS": "200"})
    args = ["doctor", "--url", redis_url, "-q", q.name, "--no-server"]
    checked = json.loads(runner.invoke(main, [*args, "--json"]).output)
    assert {f["job_id"] for f in checked["findings"] if f["rearms"]} == orphans
    # The human summary of a check says how many the fix would re-arm.
    assert "3 to re-arm" in runner.invoke(main, args).output
    fixed = runner.invoke(main, [*args, "--fix", "--json"])
    assert fixed.exit_code == 0, fixed.output
    out = json.loads(fixed.output)
    assert {f["job_id"] for f in out["fixed"] if f["rearms"]} == orphans
    assert {f["job_id"] for f in out["fixed"] if not f["rearms"]} == others
    # A second set of the same damage, fixed with the human output.
    q2 = Queue(client, q.name + "-2")
    try:
        _damage(q2, client)
        human = runner.invoke(main, ["doctor", "--url", redis_url, "-q", q2.name, "--no-server",
                                     "--fix"])  # fmt: skip
        assert human.exit_code == 0, human.output
        assert "5 repaired (3 re-armed: back in due), 0 finding(s) remain" in human.output
    finally:
        for key in client.scan_iter(match=q2.keys.pattern()):
            client.delete(key)
