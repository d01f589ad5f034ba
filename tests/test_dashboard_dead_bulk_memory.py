"""The dashboard's "requeue / purge all matching" of dead letters works a page at a time
(operations/dead_bulk.py, as `scheduler dead requeue | purge` by filter): its memory does not
grow with the dead set, and it keeps what docs/dashboard.md promises of it: the count and the
cutoff (`upto_ms`) the confirmation page stated, a job dying after that cutoff left alone,
nothing done when more match at apply time, each parent requeued before its parked children.

Client memory is the tracemalloc peak of the confirmation and of the apply at two sizes, ten
times apart (tests/test_review_at_scale.py's rule: under 3x for a dead set 10x larger). Before,
both read every matching id (the apply also each one's `parents` when requeueing). Measured on
the 2-core development machine, at 2,000 / 20,000 dead letters (task filter and none alike):

    before: requeue 0.96 / 7.0 MB (336 B a dead letter), purge 0.44-0.51 / 3.26 MB (155 B),
            the confirmation with a task filter 0.52 / 3.25 MB (152 B), without one 59 KB
    after:  requeue 0.63 / 0.85 MB (0.85 MB at 80,000 too), purge 0.55 / 0.72 MB, the
            confirmation with a task filter 0.54 / 0.62 MB, without one 70 KB"""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from scheduler import JobSpec, Queue
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import connect
from scheduler.dashboard import Auth, create_app
from scheduler.operations.dead_letters import scored_pairs
from tests.redis_server import RedisProcess
from tests.test_dashboard import csrf_of
from tests.test_dashboard_actions_review import error, hidden_inputs

SMALL, LARGE = 2_000, 20_000
TASK = "mail.send"


@pytest.fixture(scope="module")
def server(module_server: RedisProcess) -> Iterator[RedisProcess]:
    c = redis.Redis.from_url(module_server.url)
    c.flushall()
    c.close()
    yield module_server


@pytest.fixture
def big(server: RedisProcess) -> Iterator[redis.Redis]:
    """A client of the module's private server (the sizes measured stay off the shared one)."""
    c = connect(server.url)
    yield c
    c.close()


def dead_jobs(q: Queue, n: int, task: str = TASK) -> None:
    """`n` dead letters the quick way: one attempt each, leases of 1 ms lapsed and reaped."""
    for i in range(0, n, 10_000):
        q.enqueue_many([JobSpec(task, j, max_attempts=1) for j in range(i, min(n, i + 10_000))])
    while q.claim("w1", limit=1_000, lease_ms=1, reap_limit=0).jobs:
        pass
    while q.counts().leased:
        q.claim("w1", limit=0, reap_limit=500)


def peak_bytes(run: Callable[[], Any]) -> tuple[int, Any]:
    """The peak of traced memory (every thread: the app's and its thread pool's) while `run`
    runs, above what was traced before, and what it returned (cyclic garbage of earlier runs
    collected first: its collection would fall at a different point of each run)."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = run()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return peak, out


def confirm_then_apply(web: TestClient, name: str, action: str, task: str) -> tuple[int, int, str]:
    """(the confirmation's peak, the apply's peak, where the apply sent the browser)."""
    form = {"csrf": csrf_of(web.get(f"/queues/{name}/dead").text), "do": f"{action}:matching"}
    form["task"] = task
    confirm_peak, confirm = peak_bytes(lambda: web.post(f"/queues/{name}/dead/confirm", data=form))
    assert confirm.status_code == 200, confirm.text[:300]
    fields = hidden_inputs(confirm.text)

    def apply() -> Any:
        return web.post(f"/queues/{name}/dead/apply", data=fields, follow_redirects=False)

    apply_peak, r = peak_bytes(apply)
    assert r.status_code == 303, (r.status_code, error(r.text))
    return confirm_peak, apply_peak, r.headers["location"]


@pytest.mark.parametrize("task", [TASK, ""])
@pytest.mark.parametrize("action", ["requeue", "purge"])
def test_all_matching_memory_does_not_grow_with_the_dead_set(
    big: redis.Redis, action: str, task: str
) -> None:
    """Defect: the confirmation (with a task filter) and the apply read every matching dead id
    (dead.py _matching_ids; the requeue then each one's `parents`): 150-340 B a dead job, tens
    of MB a click at 100,000 dead letters, GBs at 10 million."""
    queues = {n: Queue(big, f"mem-{action}-{task or 'all'}-{n}") for n in (5, SMALL, LARGE)}
    for n, q in queues.items():
        dead_jobs(q, n)
    app = create_app(client=big, queues=[q.name for q in queues.values()], auth=Auth())
    peaks: dict[int, tuple[int, int]] = {}
    with TestClient(app) as web:
        for n, q in queues.items():  # the first, small: imports, templates and scripts loaded
            confirm_peak, apply_peak, location = confirm_then_apply(web, q.name, action, task)
            assert f"n={n}" in location, location
            assert q.counts().dead == 0
            peaks[n] = confirm_peak, apply_peak
    said = [
        f"{what}: peak {peaks[SMALL][k]:,} B at {SMALL:,} dead, {peaks[LARGE][k]:,} B at "
        f"{LARGE:,}: {(peaks[LARGE][k] - peaks[SMALL][k]) / (LARGE - SMALL):.0f} B a dead job"
        for k, what in enumerate(("confirm", "apply"))
    ]
    print(action, task or "-", *said, sep="\n  ")  # pytest -s: the measures
    grows = [s for k, s in enumerate(said) if peaks[LARGE][k] >= 3 * peaks[SMALL][k]]
    assert not grows, said


# -- what "all matching" means, kept --------------------------------------------------------


def settle() -> None:
    """Let the server's millisecond pass: a job dying in the ms the confirmation reads the
    clock at is after its cutoff (the ms before it)."""
    time.sleep(0.005)


def dead_set(client: redis.Redis, q: Queue) -> list[tuple[float, str]]:
    """(dead_ms, id) of every dead letter, oldest first."""
    return scored_pairs(client.zrange(q.keys.dead, 0, -1, withscores=True))


@pytest.fixture
def web(client: redis.Redis, q: Queue) -> Iterator[TestClient]:
    with TestClient(create_app(client=client, queues=[q.name], auth=Auth())) as t:
        yield t


@pytest.mark.parametrize("task", [TASK, ""])
@pytest.mark.parametrize("action", ["requeue", "purge"])
def test_jobs_dying_after_the_confirmations_cutoff_are_not_touched(
    client: redis.Redis, q: Queue, web: TestClient, action: str, task: str
) -> None:
    dead_jobs(q, 3)
    before = set(q.dead_ids())
    settle()
    token = csrf_of(web.get(f"/queues/{q.name}/dead").text)
    form = {"csrf": token, "do": f"{action}:matching", "task": task}
    confirm = web.post(f"/queues/{q.name}/dead/confirm", data=form)
    fields = hidden_inputs(confirm.text)
    assert fields["count"] == ["3"], fields
    upto_ms = int(fields["upto_ms"][0])
    settle()
    dead_jobs(q, 2)  # they die while the operator reads the confirmation
    later = set(q.dead_ids()) - before
    assert len(later) == 2
    assert all(s > upto_ms for s, _ in dead_set(client, q)[3:])
    r = web.post(f"/queues/{q.name}/dead/apply", data=fields, follow_redirects=False)
    assert r.status_code == 303 and "n=3" in r.headers["location"], r.headers.get("location")
    assert set(q.dead_ids()) == later
    if action == "requeue":
        assert {q.status(i) for i in before} == {"due"}
    else:
        assert not any(client.exists(q.keys.job(i), q.keys.spec(i)) for i in before)


@pytest.mark.parametrize("task", [TASK, ""])
def test_more_matching_than_confirmed_does_nothing_and_says_so(
    client: redis.Redis, q: Queue, web: TestClient, task: str
) -> None:
    """A score written by hand below the cutoff after the count: refused before any change."""
    dead_jobs(q, 2)
    settle()
    token = csrf_of(web.get(f"/queues/{q.name}/dead").text)
    form = {"csrf": token, "do": "purge:matching", "task": task}
    fields = hidden_inputs(web.post(f"/queues/{q.name}/dead/confirm", data=form).text)
    assert fields["count"] == ["2"], fields
    settle()
    counted = set(q.dead_ids())
    dead_jobs(q, 1)
    (late,) = set(q.dead_ids()) - counted
    client.zadd(q.keys.dead, {late: int(fields["upto_ms"][0]) - 1_000})  # by hand
    before = dead_set(client, q), q.counts().due
    r = web.post(f"/queues/{q.name}/dead/apply", data=fields)
    assert r.status_code == 400
    assert error(r.text) == (
        "3 dead letters match now, the confirmation stated 2: nothing was done; "
        "confirm again from the dead letters page"
    )
    assert (dead_set(client, q), q.counts().due) == before
    assert all(client.exists(q.keys.job(i)) for _, i in before[0])


def test_a_form_without_the_confirmations_fields_takes_every_match_of_the_filter(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    """A script's post (no upto_ms, no count): up to the time of the post, the filter held."""
    dead_jobs(q, 4)
    dead_jobs(q, 3, task="report.build")
    token = csrf_of(web.get(f"/queues/{q.name}/dead").text)
    form = {"csrf": token, "action": "purge", "scope": "matching", "task": "report.build"}
    r = web.post(f"/queues/{q.name}/dead/apply", data=form, follow_redirects=False)
    assert r.status_code == 303 and "n=3" in r.headers["location"]
    assert len(q.dead_ids(task=TASK)) == 4 and q.dead_ids(task="report.build") == []


def park_flow(q: Queue, children: int) -> str:
    """A parent and `children` waiting for it, parked dead with it (their ids after its own:
    the newest-first scan meets them before it, in an earlier call of 100)."""
    p = q.enqueue("parent", None, max_attempts=1, job_id="a-parent")
    q.enqueue_many([JobSpec("child", n, after=[p], job_id=f"b-{n:03}") for n in range(children)])
    [job] = q.claim("w", limit=1, lease_ms=10_000).jobs
    assert job.id == p
    assert q.fail(p, job.token, ("E", "boom", ""), delay_ms=0).status == "dead"
    return p


def test_requeue_all_matching_puts_each_parent_before_its_parked_children(
    q: Queue, web: TestClient
) -> None:
    p = park_flow(q, 250)
    assert q.counts().dead == 251
    token = csrf_of(web.get(f"/queues/{q.name}/dead").text)
    fields = hidden_inputs(
        web.post(
            f"/queues/{q.name}/dead/confirm", data={"csrf": token, "do": "requeue:matching"}
        ).text
    )
    r = web.post(f"/queues/{q.name}/dead/apply", data=fields, follow_redirects=False)
    assert "n=251" in r.headers["location"], r.headers["location"]
    assert [j.id for j in q.claim("w", limit=300, lease_ms=10_000).jobs] == [p]
    assert q.counts().dead == 0


def test_a_partitioned_queue_is_counted_and_acted_on_in_every_partition(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    for part in pq.parts:
        dead_jobs(part, 3)
    dead_jobs(pq.parts[0], 2, task="report.build")  # the last partition: none left to requeue
    home = pq.parts[1]
    p = park_flow(home, 120)
    settle()
    with TestClient(create_app(client=client, queues=[pq.name], auth=Auth())) as web:
        token = csrf_of(web.get(f"/queues/{pq.name}/dead").text)
        form = {"csrf": token, "do": "requeue:matching", "task": TASK}
        fields = hidden_inputs(web.post(f"/queues/{pq.name}/dead/confirm", data=form).text)
        assert fields["count"] == ["9"], fields
        r = web.post(f"/queues/{pq.name}/dead/apply", data=fields, follow_redirects=False)
        assert "n=9" in r.headers["location"], r.headers["location"]
        assert pq.dead_ids(task=TASK) == [] and len(pq.dead_ids(task="report.build")) == 2
        form = {"csrf": token, "do": "requeue:matching"}
        fields = hidden_inputs(web.post(f"/queues/{pq.name}/dead/confirm", data=form).text)
        assert fields["count"] == ["123"], fields
        r = web.post(f"/queues/{pq.name}/dead/apply", data=fields, follow_redirects=False)
        assert "n=123" in r.headers["location"], r.headers["location"]
    assert pq.counts().dead == 0
    claimed = [j.id for j in home.claim("w", limit=300, lease_ms=10_000).jobs]
    assert p in claimed and not any(i.startswith("b-") for i in claimed)
