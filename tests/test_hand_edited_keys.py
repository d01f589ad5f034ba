"""One job's key edited by hand into another type (found by a fuzzing audit): doctor names the
key that is wrong, and the other jobs of the queue stay listable."""

from __future__ import annotations

import pytest
import redis

from scheduler import CorruptKey, Queue
from scheduler.admin.doctor import check_queue, repair_queue


def spec_into_list(client: redis.Redis, q: Queue, job_id: str) -> str:
    key = f"{q.keys.prefix}spec:{job_id}"
    client.delete(key)
    client.rpush(key, "x")
    return key


def test_doctor_names_a_spec_record_of_another_type(client: redis.Redis, q: Queue) -> None:
    """It said 'its hash is gone (task and payload lost): fix removes the id', and --fix then
    repaired nothing, run after run."""
    bad, ok = q.enqueue("t", 1), q.enqueue("t", 2)
    key = spec_into_list(client, q, bad)
    (issue,) = check_queue(client, q.name)
    assert issue.code == "wrong-type" and issue.job_id == bad and key in issue.message
    assert issue.repair == ()  # nothing --fix could run safely: the operator looks
    report = repair_queue(client, q.name)
    assert report.fixed == [] and [i.code for i in report.remaining] == ["wrong-type"]
    assert client.zscore(q.keys.due, ok) is not None


def test_one_key_of_another_type_leaves_the_rest_of_a_page(client: redis.Redis, q: Queue) -> None:
    """`list_jobs` (and so `jobs list`, `dead list`, the dashboard's pages) failed for every
    job of the state: CorruptKey for the whole page."""
    bad, *ok = (q.enqueue("t", i) for i in range(3))
    spec_into_list(client, q, bad)
    assert [j.id for j in q.list_jobs("due")] == ok  # the bad one left out (doctor names it)
    hashed = q.enqueue("t", 4)
    client.delete(q.keys.job(hashed), q.keys.spec(hashed))
    client.set(q.keys.job(hashed), "x")  # its hash key edited into a STRING
    assert [j.id for j in q.list_jobs("due")] == ok


def test_leased_of_another_type_still_raises(client: redis.Redis, q: Queue) -> None:
    """Every job's read fails then: the typed error, not an empty page."""
    ids = [q.enqueue("t", i) for i in range(2)]
    client.set(q.keys.leased, "x")
    with pytest.raises(CorruptKey):
        q._run(q.ops.get_jobs(ids))


@pytest.mark.parametrize("edit", ["kids", "record"])
def test_doctor_names_a_child_no_parent_can_release(
    client: redis.Redis, q: Queue, edit: str
) -> None:
    """A parent's `kids` mark (or whole record) deleted by hand: the parent ended and its child
    waited forever, and doctor said nothing."""
    parent = q.enqueue("t", 1)
    child = q.enqueue("t", 2, after=[parent])
    other = q.enqueue("t", 3, after=[parent])
    assert check_queue(client, q.name) == []  # waiting, as it should
    if edit == "kids":
        client.hdel(q.keys.job(parent), "kids")
    (job,) = q.claim("w", limit=5).jobs
    if edit == "record":
        client.delete(q.keys.job(parent), q.keys.spec(parent))
        client.zrem(q.keys.leased, parent)
    else:
        q.complete(job.id, job.token)
    stuck = [i for i in check_queue(client, q.name) if i.code == "stuck-waiting"]
    assert sorted(i.job_id or "" for i in stuck) == sorted([child, other])


def test_a_child_half_released_is_not_reported(client: redis.Redis, q: Queue) -> None:
    first, second = q.enqueue("t", 1), q.enqueue("t", 2, delay_ms=60_000)
    q.enqueue("t", 3, after=[first, second])
    (job,) = q.claim("w", limit=5).jobs
    q.complete(job.id, job.token)  # one parent done: the child waits for the other
    assert [i.code for i in check_queue(client, q.name)] == []


def test_doctor_checks_a_queue_whose_workers_index_is_of_another_type(
    client: redis.Redis, q: Queue
) -> None:
    """doctor stopped at 'Redis refused the command: WRONGTYPE' and checked nothing."""
    q.enqueue("t", 1)
    client.set(q.keys.workers, "x")
    (issue,) = check_queue(client, q.name)
    assert issue.code == "wrong-type" and q.keys.workers in issue.message


def test_dead_list_of_a_job_without_counts_prints_no_none(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    """A job whose spec record was deleted is parked at its claim with no attempt counts:
    `dead list` and `jobs list --state dead` printed 'attempts None/None'."""
    from click.testing import CliRunner

    from scheduler.cli.main import main

    job_id = q.enqueue("t", 1)
    client.delete(q.keys.spec(job_id))
    assert q.claim("w", limit=5).jobs == []
    for args in (["dead", "list"], ["jobs", "list", "--state", "dead"]):
        out = CliRunner().invoke(main, [*args, "-q", q.name, "--url", redis_url])
        assert out.exit_code == 0 and job_id in out.output, out.output
        assert "None" not in out.output and "-/-" in out.output


def test_workers_command_points_to_doctor(redis_url: str, client: redis.Redis, q: Queue) -> None:
    """`scheduler workers` on a workers index of another type said only 'WRONGTYPE ...'."""
    from click.testing import CliRunner

    from scheduler.cli.main import main

    q.enqueue("t", 1)
    client.set(q.keys.workers, "x")
    out = CliRunner().invoke(main, ["workers", "-q", q.name, "--url", redis_url])
    assert out.exit_code == 1 and "scheduler doctor" in out.output, out.output
    assert "Traceback" not in out.output


def test_stuck_check_reads_around_a_waiting_child_of_another_type(
    client: redis.Redis, q: Queue
) -> None:
    """A waiting child's own key edited into a STRING: the check leaves it to the job checks
    (it stopped the whole doctor run with WRONGTYPE)."""
    parent = q.enqueue("t", 1, delay_ms=60_000)
    child = q.enqueue("t", 2, after=[parent])
    client.delete(q.keys.job(child))
    client.set(q.keys.job(child), "x")
    codes = {i.code for i in check_queue(client, q.name)}
    assert "stuck-waiting" not in codes and "wrong-type" in codes
