"""Done and cancelled jobs are listed while their record is kept: `list_jobs('finished')`,
`jobs list --state finished`, the dashboard's finished tab. Their ids sit in the `finished`
index (lua/lib/result.lua), scored by the ms their record expires; nothing listed them before
(a finished job was readable by its id alone)."""

from __future__ import annotations

import json
import time

import pytest
import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.admin.doctor import check_queue
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.errors import CorruptKey
from tests.conftest import Clock
from tests.test_dashboard import make_client

FINISHED_MAX = 10_000  # lua/lib/result.lua


def _finish(q: Queue, n: int, **enqueue: object) -> list[str]:
    """n jobs enqueued, claimed and completed one at a time (distinct finish times)."""
    ids = []
    for i in range(n):
        job_id = q.enqueue("t", i, **enqueue)  # type: ignore[arg-type]
        (job,) = q.claim("w1", limit=1).jobs
        assert job.id == job_id
        q.complete(job.id, job.token, {"n": i})
        ids.append(job_id)
        time.sleep(0.002)
    return ids


def test_done_and_cancelled_jobs_are_listed_latest_first(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    done = _finish(q, 3)
    cancelled = q.enqueue("t", "c")
    assert q.cancel(cancelled) == "due"
    waiting = q.enqueue("t", "w", delay_ms=60_000)
    listed = q.list_jobs("finished")
    assert [j.id for j in listed] == [cancelled, *reversed(done)]
    assert [j.state for j in listed] == ["cancelled", "done", "done", "done"]
    assert json.loads(listed[1].result_json or "") == {"n": 2}
    finished = [j.finished_ms or 0 for j in listed]
    assert finished == sorted(finished, reverse=True) and finished[-1] > 0
    assert [j.id for j in q.list_jobs("finished", offset=1, limit=2)] == done[::-1][:2]
    assert [j.id for j in q.list_jobs("scheduled")] == [waiting]
    ttl_ms = client.pttl(q.keys.finished)
    assert 0 < ttl_ms <= 3_600_000  # expires with the last record it lists
    args = ["jobs", "list", "-q", q.name, "--state", "finished", "--url", redis_url]
    out = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    rows = json.loads(out.stdout)["jobs"]
    assert [r["id"] for r in rows] == [cancelled, *reversed(done)]
    assert all(r["finished_ms"] for r in rows)
    table = CliRunner(env={"COLUMNS": "200"}).invoke(main, args, catch_exceptions=False).stdout
    assert all(i in table for i in done) and "cancelled 20" in table
    with make_client(client, q) as web:
        page = web.get(f"/queues/{q.name}?state=finished").text
        assert all(i in page for i in [*done, cancelled]) and "<th>finished</th>" in page
        assert waiting not in page
        assert "?state=finished" in web.get(f"/queues/{q.name}").text  # the tab


def test_a_resent_complete_lists_the_job_once(q: Queue) -> None:
    q.enqueue("t")
    (job,) = q.claim("w1", limit=1).jobs
    assert q.complete_many([(job.id, job.token, 1), (job.id, job.token, 1)]) == ["done", "done"]
    q.complete(job.id, job.token, 1)
    assert [j.id for j in q.list_jobs("finished")] == [job.id]


def test_a_job_is_listed_only_while_its_record_is_kept(client: redis.Redis, q: Queue) -> None:
    short = _finish(q, 1, result_ttl_ms=200)[0]
    kept = _finish(q, 1)[0]
    assert {j.id for j in q.list_jobs("finished")} == {short, kept}
    time.sleep(0.3)  # the short record expired; no job finished since to trim its id
    assert client.zscore(q.keys.finished, short) is not None
    assert [j.id for j in q.list_jobs("finished")] == [kept]
    _finish(q, 1)  # the next finish trims the expired id
    assert client.zscore(q.keys.finished, short) is None


def test_the_index_keeps_the_latest_to_expire_beyond_its_cap(client: redis.Redis, q: Queue) -> None:
    # Filled by hand to the cap, all expiring in an hour; one more job finishes.
    far = int(client.time()[0]) * 1000 + 3_600_000
    client.zadd(q.keys.finished, {f"old-{i}": far - 60_000 + i for i in range(FINISHED_MAX)})
    (new,) = _finish(q, 1)
    assert client.zcard(q.keys.finished) == FINISHED_MAX
    assert client.zscore(q.keys.finished, "old-0") is None  # the soonest to expire left
    assert client.zscore(q.keys.finished, "old-1") is not None
    assert [j.id for j in q.list_jobs("finished", limit=1)] == [new]


def test_an_index_edited_into_another_type_never_fails_a_finish(
    client: redis.Redis, q: Queue
) -> None:
    client.set(q.keys.finished, "hand-written")
    job_id = q.enqueue("t")
    (job,) = q.claim("w1", limit=1).jobs
    q.complete(job.id, job.token, "ok")
    other = q.enqueue("t")
    assert q.cancel(other) == "due"
    assert q.get_job(job_id).state == "done" and q.get_job(other).state == "cancelled"
    assert client.get(q.keys.finished) == "hand-written"  # left as it is
    with pytest.raises(CorruptKey, match="finished"):
        q.list_jobs("finished")
    (issue,) = [i for i in check_queue(client, q.name) if q.keys.finished in i.message]
    assert issue.code == "wrong-type" and "DEL" in issue.fix


def test_a_partitioned_queue_lists_its_partitions_finished_merged(pq: PartitionedQueue) -> None:
    ids = []
    for i in range(6):
        job_id = pq.enqueue("t", i)
        part = pq.part_of(job_id)
        (job,) = part.claim("w1", limit=1).jobs
        part.complete(job.id, job.token, i)
        ids.append(job_id)
        time.sleep(0.002)
    assert len({pq.layout.partition_of_id(i) for i in ids}) > 1
    assert [j.id for j in pq.list_jobs("finished")] == ids[::-1]
    assert [j.id for j in pq.list_jobs("finished", offset=2, limit=2)] == ids[::-1][2:4]


def test_a_run_the_misfire_policy_skipped_is_listed_as_cancelled(
    tq: tuple[Queue, Clock],
) -> None:
    """A schedule's late occurrence dropped at claim (misfire='skip') is marked cancelled:
    it is listed among the finished, as a cancel would list it."""
    q, clock = tq
    minute = 60_000
    base = 10_000 * minute
    clock.set_ms(base + 1)
    q.schedule("m", "t", every_ms=minute, misfire="skip")  # first run at base + 1 min
    clock.set_ms(base + 10 * minute + 30_000)  # an outage: that run is 9.5 min late
    assert q.claim("w", limit=10, lease_ms=1_000).jobs == []
    [skipped] = q.list_jobs("finished")
    assert skipped.id.startswith("schedule:m:")
    assert (skipped.state, skipped.fields.get("skipped")) == ("cancelled", "misfire")
