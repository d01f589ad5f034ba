"""Partitioned queues used as an app developer and an operator would (review): routing,
refusals that write nothing, merged views paged, the calls by id in every partition (sync,
asyncio, CLI) against the plain Queue's documented behaviour."""

from __future__ import annotations

import asyncio
import html
import json
import logging
import re
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from starlette.testclient import TestClient

from scheduler import BadArgument, JobContext, JobNotFound, JobSpec, Queue, Registry
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.core.connection import connect_async
from scheduler.dashboard import Auth, create_app
from scheduler.worker import Worker, WorkerSettings
from tests.embedded_worker import run_until
from tests.test_dashboard import csrf_of


def cli(redis_url: str, *args: str, code: int = 0) -> Any:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        main, [*args, "--url", redis_url, "--json"], catch_exceptions=False
    )
    assert result.exit_code == code, result.output
    return json.loads(result.stdout) if result.stdout.strip() else None


def kill(q: Queue, n: int) -> list[str]:
    """n due jobs of q claimed and failed for good, one by one."""
    died = []
    for _ in range(n):
        job = q.claim("w", limit=1).jobs[0]
        q.fail(job.id, job.token, ValueError("x"), retryable=False)
        died.append(job.id)
    return died


def on_async(redis_url: str, name: str, call: Any) -> Any:
    async def go() -> Any:
        client = connect_async(redis_url)
        try:
            aq = await AsyncPartitionedQueue.open(client, name)
            return await call(aq)
        finally:
            await client.aclose()

    return asyncio.run(go())


# -- routing ----------------------------------------------------------------------------------
def test_round_robin_fills_every_partition_evenly(pq: PartitionedQueue) -> None:
    ids = [pq.enqueue("t", None) for _ in range(6)] + pq.enqueue_many(
        [JobSpec("t", None) for _ in range(6)]
    )
    per = [p.counts().due for p in pq.parts]
    assert per == [4, 4, 4], per
    assert all(pq.part_of(i).status(i) == "due" for i in ids)


def test_a_key_is_unique_across_the_logical_queue(pq: PartitionedQueue) -> None:
    first = pq.enqueue("t", {"n": 1}, key="k1")
    again = [pq.enqueue("t", {"n": i}, key="k1") for i in range(5)]
    assert again == [first] * 5
    assert pq.counts().due == 1
    assert pq.part_of(first) is pq.parts[pq.layout.partition_of_key("k1")]


def test_async_refuses_parents_in_two_partitions_and_writes_nothing(
    pq: PartitionedQueue, redis_url: str
) -> None:
    a, b = pq.enqueue("t", None, job_id="p0.a"), pq.enqueue("t", None, job_id="p1.b")

    async def call(aq: AsyncPartitionedQueue) -> None:
        with pytest.raises(BadArgument, match="share one partition"):
            await aq.enqueue_many(
                [JobSpec("t", None, job_id="p2.x"), JobSpec("t", None, after=[a, b])]
            )
        with pytest.raises(BadArgument, match="share one partition"):
            await aq.enqueue("t", None, after=[a, b])

    on_async(redis_url, pq.name, call)
    assert pq.counts().due == 2


# -- calls by id ------------------------------------------------------------------------------
def test_unknown_id_is_job_not_found_as_a_plain_queue(pq: PartitionedQueue, redis_url: str) -> None:
    for one in (pq.status, pq.get_job, pq.cancel):
        with pytest.raises(JobNotFound):
            one("p1.nope")
        with pytest.raises(JobNotFound):
            one("nope")
    with pytest.raises(JobNotFound):
        pq.reschedule("p2.nope", delay_ms=0)

    async def call(aq: AsyncPartitionedQueue) -> None:
        with pytest.raises(JobNotFound):
            await aq.status("p1.nope")
        with pytest.raises(JobNotFound):
            await aq.cancel("nope")

    on_async(redis_url, pq.name, call)


def test_ids_of_every_partition_answer_sync_and_async(pq: PartitionedQueue, redis_url: str) -> None:
    ids = [pq.enqueue("t", {"i": i}, delay_ms=60_000) for i in range(3)]
    assert {pq.layout.partition_of_id(i) for i in ids} == {0, 1, 2}
    assert [pq.status(i) for i in ids] == ["scheduled"] * 3
    assert [pq.reschedule(i, delay_ms=0) for i in ids] == ["rescheduled"] * 3
    assert [pq.status(i) for i in ids] == ["due"] * 3

    async def call(aq: AsyncPartitionedQueue) -> list[Any]:
        got = [(await aq.get_job(i)).payload() for i in ids]
        return got + [await aq.cancel(i) for i in ids]

    assert on_async(redis_url, pq.name, call) == [{"i": 0}, {"i": 1}, {"i": 2}] + ["due"] * 3
    assert [pq.status(i) for i in ids] == ["cancelled"] * 3
    assert pq.counts().due == 0


# -- merged views -----------------------------------------------------------------------------
@pytest.mark.parametrize("state", ["due", "scheduled", "dead"])
def test_merged_pages_neither_skip_nor_repeat(pq: PartitionedQueue, state: str) -> None:
    delay = 60_000 if state == "scheduled" else 0
    ids = pq.enqueue_many([JobSpec("t", None, delay_ms=delay) for _ in range(10)])
    if state == "dead":
        for p in pq.parts:
            kill(p, p.counts().due)
    whole = [j.id for j in pq.list_jobs(state, limit=100)]
    assert sorted(whole) == sorted(ids)
    for size in (1, 3, 4):
        paged = [
            j.id for off in range(0, 12, size) for j in pq.list_jobs(state, offset=off, limit=size)
        ]
        assert paged == whole, (size, paged, whole)


def test_dead_ids_pages_are_the_list_sliced(pq: PartitionedQueue, redis_url: str) -> None:
    pq.enqueue_many([JobSpec("t", None) for _ in range(9)])
    for p in pq.parts:
        kill(p, p.counts().due)
    whole = pq.dead_ids()
    assert whole == [j.id for j in pq.list_jobs("dead", limit=100)]
    for size in (1, 2, 4):
        paged = [i for off in range(0, 10, size) for i in pq.dead_ids(offset=off, limit=size)]
        assert paged == whole, size
    assert pq.dead_ids(offset=2, limit=3) == whole[2:5]
    assert pq.dead_ids(limit=0) == []

    async def call(aq: AsyncPartitionedQueue) -> list[list[str]]:
        return [
            await aq.dead_ids(offset=2, limit=3),
            [j.id for j in await aq.list_jobs("dead", offset=2, limit=3)],
        ]

    assert on_async(redis_url, pq.name, call) == [whole[2:5], whole[2:5]]


@pytest.mark.pq(suffix="-p")
def test_requeue_and_purge_count_as_a_plain_queue(pq: PartitionedQueue, q: Queue) -> None:
    pq.enqueue_many([JobSpec("t", None) for _ in range(6)])
    q.enqueue_many([JobSpec("t", None) for _ in range(6)])
    pdead = [i for p in pq.parts for i in kill(p, p.counts().due)]
    qdead = kill(q, 6)
    # duplicates and unknown ids, as a caller may pass them
    assert pq.requeue_dead([pdead[0], pdead[0], "p1.nope"]) == q.requeue_dead(
        [qdead[0], qdead[0], "nope"]
    )
    assert pq.purge_dead([pdead[1], pdead[1], pdead[0]]) == q.purge_dead(
        [qdead[1], qdead[1], qdead[0]]
    )
    assert pq.counts().dead == q.counts().dead


def test_pause_and_resume_answer_as_a_plain_queue(pq: PartitionedQueue) -> None:
    assert pq.pause() == "paused"
    assert pq.pause() == "already"
    assert pq.counts().paused_ms is not None
    assert pq.parts[1].claim("w", limit=1).jobs == []
    assert pq.resume() == "resumed"
    assert pq.resume() == "active"
    assert pq.counts().paused_ms is None


def test_claim_is_shared_fairly_when_one_partition_is_busy(pq: PartitionedQueue) -> None:
    pq.enqueue_many([JobSpec("t", None, job_id=f"p0.busy{i}") for i in range(30)])
    pq.enqueue_many([JobSpec("t", None, job_id=f"p{k}.x") for k in (1, 2)])
    got = pq.claim("w", limit=3).jobs
    assert sorted(pq.layout.partition_of_id(j.id) for j in got) == [0, 1, 2]
    # limit 1 (a share of 0 for two partitions): still a job each call, from the busy one
    pq.claim("w", limit=2)
    assert [len(pq.claim("w", limit=1).jobs) for _ in range(5)] == [1] * 5


# -- the CLI ----------------------------------------------------------------------------------
def ids_of(out: Any) -> list[str]:
    return [j["id"] for j in out["jobs"]]


@pytest.mark.parametrize("state", ["due", "dead"])
def test_cli_jobs_list_pages_the_merged_queue(
    pq: PartitionedQueue, redis_url: str, state: str
) -> None:
    pq.enqueue_many([JobSpec("t" if i % 2 else "u", None) for i in range(11)])
    if state == "dead":
        for p in pq.parts:
            kill(p, p.counts().due)
    whole = [j.id for j in pq.list_jobs(state, limit=100)]
    base = ("jobs", "list", "-q", pq.name, "--state", state)
    assert ids_of(cli(redis_url, *base, "--limit", "100")) == whole
    paged = [
        i
        for off in range(0, 12, 4)
        for i in ids_of(cli(redis_url, *base, "--offset", str(off), "--limit", "4"))
    ]
    assert paged == whole
    only_t = [j.id for j in pq.list_jobs(state, limit=100) if j.task == "t"]
    tpaged = [
        i
        for off in range(0, 6, 2)
        for i in ids_of(cli(redis_url, *base, "--task", "t", "--offset", str(off), "--limit", "2"))
    ]
    assert tpaged == only_t


def test_cli_dead_list_pages_and_filters_the_merged_queue(
    pq: PartitionedQueue, redis_url: str
) -> None:
    pq.enqueue_many([JobSpec("t" if i % 3 else "u", None) for i in range(9)])
    for p in pq.parts:
        kill(p, p.counts().due)

    def pages(size: int, *more: str) -> list[str]:
        base = ("dead", "list", "-q", pq.name, *more, "--limit", str(size), "--offset")
        return [i for off in range(0, 10, size) for i in ids_of(cli(redis_url, *base, str(off)))]

    whole, only_u = pq.dead_ids(), pq.dead_ids(task="u")
    assert pages(100) == pages(4) == whole and len(only_u) == 3
    assert pages(2, "--task", "u") == only_u
    assert [i for off in (0, 2) for i in pq.dead_ids(task="u", offset=off, limit=2)] == only_u


def test_cli_dead_requeue_and_purge_by_task_on_every_partition(
    pq: PartitionedQueue, redis_url: str
) -> None:
    pq.enqueue_many([JobSpec("t" if i % 2 else "u", None) for i in range(8)])
    for p in pq.parts:
        kill(p, p.counts().due)
    us = set(pq.dead_ids(task="u"))
    cli(redis_url, "dead", "requeue", "-q", pq.name, "--task", "u", "--yes")
    assert pq.counts().due == 4 and set(pq.dead_ids()) & us == set()
    cli(redis_url, "dead", "purge", "-q", pq.name, "--task", "t", "--yes")
    assert pq.counts().dead == 0 and pq.counts().due == 4


def test_cli_jobs_cancel_by_state_on_every_partition(pq: PartitionedQueue, redis_url: str) -> None:
    ids = pq.enqueue_many([JobSpec("t", None, delay_ms=60_000) for _ in range(6)])
    pq.enqueue_many([JobSpec("t", None) for _ in range(3)])
    cli(redis_url, "jobs", "cancel", "-q", pq.name, "--state", "scheduled", "--yes")
    assert [pq.status(i) for i in ids] == ["cancelled"] * 6
    assert pq.counts().due == 3
    pq.enqueue("t", None, job_id="p2.live")
    out = cli(redis_url, "jobs", "cancel", "-q", pq.name, ids[0], "p2.live", "p1.nope", code=1)
    assert out["jobs"] == {ids[0]: "cancelled", "p2.live": "due", "p1.nope": "missing"}


def test_cli_stats_and_doctor_on_a_partitioned_name(pq: PartitionedQueue, redis_url: str) -> None:
    pq.enqueue_many([JobSpec("t", None) for _ in range(5)])
    pq.enqueue_many([JobSpec("t", None, delay_ms=60_000) for _ in range(4)])
    kill(pq.parts[2], 1)
    (row,) = cli(redis_url, "stats", "-q", pq.name)["queues"]
    assert (row["due"], row["scheduled"], row["dead"]) == (4, 4, 1)
    doc = cli(redis_url, "doctor", "-q", pq.name, code=1)  # the test server keeps no AOF
    assert [f["code"] for f in doc["findings"]] == ["persistence-off"]
    assert doc["queues"] == [p.name for p in pq.parts]
    client = pq.parts[1].client  # a due entry without its record, in one partition
    client.zadd(pq.parts[1].keys.due, {"p1.ghost": 1})
    doc = cli(redis_url, "doctor", "-q", pq.name, code=1)
    assert ("missing-hash", pq.parts[1].name, "p1.ghost") in [
        (f["code"], f["queue"], f["job_id"]) for f in doc["findings"]
    ]
    fixed = cli(redis_url, "doctor", "-q", pq.name, "--fix", code=1)["fixed"]
    assert [(f["code"], f["queue"]) for f in fixed] == [("missing-hash", pq.parts[1].name)]
    assert pq.status("p1.ghost") == "dead"
    assert cli(redis_url, "pause", "-q", pq.name)["status"] == "paused"
    assert all(p.counts().paused_ms is not None for p in pq.parts)
    assert cli(redis_url, "resume", "-q", pq.name)["status"] == "resumed"
    assert all(p.counts().paused_ms is None for p in pq.parts)


# -- the dashboard ----------------------------------------------------------------------------
def walk(client: redis.Redis, pq: PartitionedQueue, start: str) -> list[str]:
    """Every job id a page lists, following its "more" links from `start`."""
    seen: list[str] = []
    path: str | None = start
    with TestClient(create_app(client=client, queues=[pq.name], auth=Auth())) as web:
        for _ in range(30):
            if path is None:
                break
            got = web.get(path)
            if got.status_code != 200:  # an error page ends the walk, named in its place
                seen.append(f"<{got.status_code}: {path}>")
                break
            seen += re.findall(r'/jobs/([A-Za-z0-9_.:-]+)"', got.text)
            more = re.search(r'href="([^"]*)">more', got.text)
            path = html.unescape(more.group(1)) if more else None
    return seen


def dashboard_jobs(pq: PartitionedQueue, state: str) -> None:
    """13 jobs of tasks u, t, u, t, ... spread round robin; `state` dead: every one dead."""
    pq.enqueue_many([JobSpec("t" if i % 2 else "u", None) for i in range(13)])
    if state == "dead":
        for p in pq.parts:
            kill(p, p.counts().due)


@pytest.mark.parametrize("state", ["due", "dead"])
def test_dashboard_pages_the_merged_queue(
    client: redis.Redis, pq: PartitionedQueue, state: str
) -> None:
    dashboard_jobs(pq, state)
    whole = [j.id for j in pq.list_jobs(state, limit=100)]
    assert walk(client, pq, f"/queues/{pq.name}?state={state}&limit=4") == whole
    if state == "dead":
        assert walk(client, pq, f"/queues/{pq.name}/dead?limit=4") == whole


@pytest.mark.parametrize(
    "state, page", [("due", "?state=due&"), ("dead", "?state=dead&"), ("dead", "/dead?")]
)
def test_dashboard_task_filtered_pages_reach_every_match(
    client: redis.Redis, pq: PartitionedQueue, state: str, page: str
) -> None:
    """6 jobs of task t, 2 in each partition, shown 2 a page: the second page's "more" link
    is missing (each partition, asked for its first 4 matches, had only its 2 and said "no
    more"), so the last 2 matches are never shown: the queue page and /dead alike."""
    dashboard_jobs(pq, state)
    only_t = [j.id for j in pq.list_jobs(state, limit=100) if j.task == "t"]
    assert len(only_t) == 6
    assert walk(client, pq, f"/queues/{pq.name}{page}limit=2&task=t") == only_t


def finish_all(pq: PartitionedQueue) -> None:
    """Every due job of pq claimed and completed, partition by partition, one at a time."""
    for p in pq.parts:
        while jobs := p.claim("w", limit=1).jobs:
            p.complete(jobs[0].id, jobs[0].token, None)


@pytest.mark.parametrize("state", ["leased", "finished", "held"])
def test_other_states_page_the_merged_queue(
    client: redis.Redis, pq: PartitionedQueue, state: str
) -> None:
    if state == "held":  # one leased per partition, the rest held by its key's limit
        specs = [JobSpec("t", None, concurrency_key="k", concurrency_limit=1) for _ in range(12)]
        pq.enqueue_many(specs)
        for p in pq.parts:
            p.claim("w", limit=4)
    else:
        pq.enqueue_many([JobSpec("t", None) for _ in range(11)])
        if state == "finished":
            finish_all(pq)
        else:
            for p in pq.parts:
                p.claim("w", limit=10)
    whole = [j.id for j in pq.list_jobs(state, limit=100)]
    assert len(whole) == (9 if state == "held" else 11)
    paged = [j.id for off in range(0, 12, 4) for j in pq.list_jobs(state, offset=off, limit=4)]
    assert paged == whole
    assert walk(client, pq, f"/queues/{pq.name}?state={state}&limit=4") == whole


def test_dashboard_actions_reach_every_partition(client: redis.Redis, pq: PartitionedQueue) -> None:
    dashboard_jobs(pq, "dead")  # 13 dead: 6 of task t, 7 of u, in every partition
    only_u = set(pq.dead_ids(task="u"))
    with TestClient(create_app(client=client, queues=[pq.name], auth=Auth())) as web:
        token = csrf_of(web.get(f"/queues/{pq.name}/dead").text)
        form = {"csrf": token, "do": "requeue:matching", "task": "u"}
        confirm = web.post(f"/queues/{pq.name}/dead/confirm", data=form)
        assert confirm.status_code == 200
        fields = dict(
            re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', confirm.text)
        )
        assert fields.get("count") == "7", fields
        done = web.post(f"/queues/{pq.name}/dead/apply", data=fields)
        assert done.status_code == 200
        assert set(pq.dead_ids()) & only_u == set() and pq.counts().due == 7
        for i in pq.dead_ids()[:3] + [j.id for j in pq.list_jobs("due", limit=3)]:
            verb = "requeue" if pq.status(i) == "dead" else "cancel"
            r = web.post(f"/queues/{pq.name}/jobs/{i}/{verb}", data={"csrf": token})
            assert r.status_code == 200, r.text[:300]
            assert pq.status(i) == ("due" if verb == "requeue" else "cancelled")
        assert web.get(f"/queues/{pq.name}/jobs/p1.nope").status_code == 404
        r = web.post(f"/queues/{pq.name}/pause", data={"csrf": token})
        assert r.status_code == 200
        assert all(p.counts().paused_ms is not None for p in pq.parts)


def test_cli_enqueue_routes_by_key_and_parents(pq: PartitionedQueue, redis_url: str) -> None:
    parent = pq.enqueue("t", None, job_id="p2.parent")
    out = cli(redis_url, "enqueue", "t", "-q", pq.name, "--after", parent)
    child = out["id"]
    assert pq.layout.partition_of_id(child) == 2 and pq.status(child) == "held"
    keyed = [cli(redis_url, "enqueue", "t", "-q", pq.name, "--key", "kk") for _ in range(2)]
    assert keyed[0]["id"] == keyed[1]["id"]
    assert pq.layout.partition_of_id(keyed[0]["id"]) == pq.layout.partition_of_key("kk")
    assert pq.counts().due == 3  # the parent, its child (held: counted in due), the keyed one
    far = next(k for k in range(50) if pq.layout.partition_of_key(f"x{k}") != 2)
    cli(redis_url, "enqueue", "t", "-q", pq.name, "--after", parent, "--key", f"x{far}", code=2)
    assert pq.counts().due == 3


@pytest.mark.pq(suffix="-p")
def test_enqueue_many_quirks_as_a_plain_queue(pq: PartitionedQueue, q: Queue) -> None:
    """The same key or id twice in one call, a parent that does not exist: as a plain queue."""
    for target in (pq, q):
        a, b = target.enqueue_many([JobSpec("t", None, key="same"), JobSpec("t", None, key="same")])
        assert a == b
        c, d = target.enqueue_many(
            [JobSpec("t", None, job_id="p1.x"), JobSpec("t", None, job_id="p1.x")]
        )
        assert c == d == "p1.x"
        with pytest.raises(BadArgument):
            target.enqueue("t", None, after=["p1.missing"])
        assert target.counts().due == 2


def test_debounce_after_a_claim_makes_a_new_job_in_the_keys_partition(pq: PartitionedQueue) -> None:
    first = pq.enqueue("t", {"n": 0}, key="deb", debounce=True)
    assert pq.enqueue("t", {"n": 1}, key="deb", debounce=True) == first  # replaced
    assert pq.get_job(first).payload() == {"n": 1}
    part = pq.part_of(first)
    assert [j.id for j in part.claim("w", limit=1).jobs] == [first]
    second = pq.enqueue("t", {"n": 2}, key="deb", debounce=True)
    assert second != first and pq.part_of(second) is part  # once claimed: a new job
    assert pq.enqueue("t", {"n": 3}, key="deb", debounce=True) == second
    assert pq.get_job(second).payload() == {"n": 3}


@pytest.mark.pq(suffix="-p")
@pytest.mark.parametrize("after", ["p1.a", [], ["p1.a", "p1.a"], ("p1.a",), ["p1.a", 5]], ids=repr)
def test_odd_after_values_answer_as_a_plain_queue(
    pq: PartitionedQueue, q: Queue, after: Any
) -> None:
    """after= as a str, empty, a duplicate, a tuple, a non-str entry: the partitioned queue
    accepts or refuses (BadArgument, nothing written) exactly as a plain queue does."""
    outcomes: list[tuple[str, Any]] = []
    for target in (pq, q):
        target.enqueue("t", None, job_id="p1.a")
        try:
            job = target.enqueue("t", None, after=after)
            outcomes.append(("ok", target.status(job)))
        except BadArgument:
            outcomes.append(("refused", None))
        outcomes.append(("count", target.counts().due))
    assert outcomes[:2] == outcomes[2:]


def test_an_id_tagged_past_the_count_routes_and_answers(pq: PartitionedQueue) -> None:
    job = pq.enqueue("t", None, job_id="p7.x")  # 3 partitions: routed by its hash
    assert pq.status(job) == "due" and pq.cancel(job) == "due"
    assert pq.part_of(job).status(job) == "cancelled"


# -- a worker on the logical name -------------------------------------------------------------
def test_a_worker_runs_flows_limits_and_results_in_every_partition(
    pq: PartitionedQueue, redis_url: str
) -> None:
    """A busy key-limited partition, a chain in another and plain jobs: every job runs, the
    chain in order, the key never above its limit (per partition), results read from each."""
    registry = Registry()
    ran: list[str] = []
    leased_now: dict[str, int] = {"k": 0, "max": 0}

    @registry.task("step")
    def step(payload: dict[str, Any], ctx: JobContext) -> str:
        ran.append(payload["name"])
        return str(payload["name"])

    @registry.task("limited")
    async def limited(payload: dict[str, Any], ctx: JobContext) -> int:
        leased_now["k"] += 1
        leased_now["max"] = max(leased_now["max"], leased_now["k"])
        await asyncio.sleep(0)
        leased_now["k"] -= 1
        return int(payload["n"])

    busy = [
        pq.enqueue("limited", {"n": i}, job_id=f"p0.l{i}", concurrency_key="k", concurrency_limit=1)
        for i in range(20)
    ]
    a = pq.enqueue("step", {"name": "a"}, job_id="p1.a")
    b = pq.enqueue("step", {"name": "b"}, after=[a])
    c = pq.enqueue("step", {"name": "c"}, after=[b])
    plain = [pq.enqueue("step", {"name": f"x{i}"}) for i in range(6)]
    every = [*busy, a, b, c, *plain]
    names = tuple(p.name for p in pq.parts)  # as `scheduler worker --queue <name>` expands it
    settings = WorkerSettings(queues=names, heartbeat_ms=5_000, lease_ms=30_000, grace_s=0)
    assert run_until(
        redis_url, registry, settings, lambda: all(pq.status(i) == "done" for i in every)
    )
    assert [n for n in ran if n in "abc"] == ["a", "b", "c"]
    assert leased_now["max"] == 1
    assert [pq.result(i, timeout_s=1) for i in busy] == list(range(20))
    assert pq.result(c, timeout_s=1) == "c"

    async def call(aq: AsyncPartitionedQueue) -> list[Any]:
        return [await aq.result(i, timeout_s=1) for i in plain]

    assert on_async(redis_url, pq.name, call) == [f"x{i}" for i in range(6)]
    assert {pq.layout.partition_of_id(i) for i in plain} == {0, 1, 2}


def test_an_embedded_worker_given_the_logical_name_runs_its_jobs(
    pq: PartitionedQueue, redis_url: str
) -> None:
    """README: "A worker given the logical name claims every partition"; the embedded
    `Worker(client, registry, WorkerSettings(queues=("emails",)))` (docs/guide/workers.md)
    instead claims the logical name's own (always empty) queue: a burst run returns at once
    with every job still due, and a long-running one serves nothing, silently. Only
    `scheduler worker` expands the name (cli/worker_start.py serve: expand_labelled_async)."""
    registry = Registry()

    @registry.task("t")
    def t(payload: Any, ctx: JobContext) -> None:
        return None

    ids = pq.enqueue_many([JobSpec("t", None) for _ in range(3)])

    async def run() -> int:
        client = connect_async(redis_url)
        try:
            settings = WorkerSettings(queues=(pq.name,), burst=True, grace_s=0)
            return await Worker(client, registry, settings).run(install_signals=False)
        finally:
            await client.aclose()

    assert asyncio.run(run()) == 0
    assert [pq.status(i) for i in ids] == ["done"] * 3, [pq.status(i).value for i in ids]


def test_dashboard_task_filter_names_a_partition_whose_scan_stopped_short(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    """A partition whose first 1,000 scheduled jobs are of another task: the filtered page
    looks through those (docs/dashboard.md), finds nothing and offered "more" ("'more' resumes
    the search", the page said); each "more" scanned the same first 1,000 again, so the one
    matching job behind them was never shown (a plain queue's "more" resumes at 1,000). Now no
    "more" is offered for it: the page names the partition, whose own page resumes."""
    pq.enqueue_many(
        [JobSpec("u", None, job_id=f"p0.u{i:04}", delay_ms=60_000) for i in range(1000)]
    )
    pq.enqueue("t", None, job_id="p0.t", delay_ms=120_000)
    start = f"/queues/{pq.name}?state=scheduled&task=t"
    assert walk(client, pq, start) == []  # not reached, and no "more" that loops
    with TestClient(create_app(client=client, queues=[pq.name], auth=Auth())) as web:
        page = web.get(start).text
    cut = re.search(r'id="scan-cut">[^<]*<a class="mono" href="([^"]*)">([^<]*)<', page)
    assert cut is not None and cut.group(2) == pq.parts[0].name, page[-2000:]
    assert walk(client, pq, html.unescape(cut.group(1))) == ["p0.t"]


@pytest.mark.parametrize("page", ["", "/dead"])
def test_dashboard_task_filtered_pages_reach_the_documented_2000(
    client: redis.Redis, pq: PartitionedQueue, page: str
) -> None:
    """docs/dashboard.md: merged paging stops at offset + limit 2,000. A task-filtered page
    past offset + limit 500 answers 400 "limit must be <= 500, got 510" (a limit the
    operator never gave: pages.py / dead.py pass offset + limit as each partition's
    filtered_page limit, which browsing._page_args caps at MAX_PAGE); unfiltered it is 200."""
    pq.enqueue_many([JobSpec("t", None) for _ in range(3)])
    with TestClient(create_app(client=client, queues=[pq.name], auth=Auth())) as web:
        assert web.get(f"/queues/{pq.name}{page}?offset=460&limit=50").status_code == 200
        got = web.get(f"/queues/{pq.name}{page}?offset=460&limit=50&task=t")
        assert got.status_code == 200, re.findall(r'class="error">([^<]*)', got.text)


def test_a_schedules_occurrences_answer_by_id_on_the_logical_queue(
    pq: PartitionedQueue, redis_url: str
) -> None:
    names = [f"s{i}" for i in range(6)]
    for n in names:
        pq.schedule(n, "t", None, every_ms=3_600_000)
    ids = sorted(j.id for st in ("due", "scheduled") for j in pq.list_jobs(st, limit=50))
    assert len(ids) == 6 and all(i.startswith("schedule:") for i in ids)
    assert {pq.layout.partition_of_id(i) for i in ids} == {
        pq.layout.partition_of_schedule(n) for n in names
    }
    assert all(pq.get_job(i).id == i for i in ids)
    assert {pq.reschedule(i, delay_ms=0) for i in ids} == {"schedule"}
    out = cli(redis_url, "jobs", "show", "-q", pq.name, ids[0])
    assert out["id"] == ids[0]
    assert [s.name for s in pq.list_schedules()] == names


@pytest.mark.pq(suffix="-p")
def test_requeue_of_a_dead_flow_answers_as_a_plain_queue(pq: PartitionedQueue, q: Queue) -> None:
    """A parent dead, its child parked for it: requeue_dead([child, parent]) in one call."""
    seen = []
    for target, part in ((pq, pq.parts[2]), (q, q)):
        parent = target.enqueue("t", None, job_id="p2.parent")
        child = target.enqueue("t", None, after=[parent])
        kill(part, 1)
        before = (target.status(parent), target.status(child))
        n = target.requeue_dead([child, parent])
        seen.append((before, n, target.status(parent), target.status(child)))
    assert seen[0] == seen[1]
    assert seen[0][0] == ("dead", "dead")


def test_async_enqueues_at_once_keep_keys_unique(pq: PartitionedQueue, redis_url: str) -> None:
    async def call(aq: AsyncPartitionedQueue) -> list[str]:
        return list(
            await asyncio.gather(*(aq.enqueue("t", {"i": i}, key=f"k{i % 5}") for i in range(30)))
        )

    ids = on_async(redis_url, pq.name, call)
    assert len(set(ids)) == 5 and pq.counts().due == 5
    assert all(ids[i] == ids[i % 5] for i in range(30))


@pytest.mark.parametrize("state", ["due", "dead"])
def test_cli_task_scan_resumes_over_the_merged_queue(
    pq: PartitionedQueue, redis_url: str, monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    """`jobs list --task` cut at its scan bound goes on with --scan-from: neither skipping nor
    repeating a match across the partitions (the bound made small here)."""
    monkeypatch.setattr("scheduler.cli.jobs._TASK_SCAN_MAX", 4)
    dashboard_jobs(pq, state)
    only_t = [j.id for j in pq.list_jobs(state, limit=100) if j.task == "t"]
    got: list[str] = []
    scan: str | None = "0"
    for _ in range(10):
        if scan is None:
            break
        out = cli(redis_url, "jobs", "list", "-q", pq.name, "--state", state, "--task", "t",
                  "--scan-from", scan, "--limit", "100")  # fmt: skip
        got += ids_of(out)
        scan = None if out["next_scan_from"] is None else str(out["next_scan_from"])
    assert got == only_t


def test_dashboard_api_sums_the_partitions(client: redis.Redis, pq: PartitionedQueue) -> None:
    pq.enqueue_many([JobSpec("t", None) for _ in range(5)])
    pq.enqueue_many([JobSpec("t", None, delay_ms=60_000) for _ in range(4)])
    kill(pq.parts[1], 1)
    pq.parts[2].pause()  # one partition paused: the queue shows paused (docs: any partition)
    with TestClient(create_app(client=client, queues=[pq.name], auth=Auth())) as web:
        row = web.get(f"/queues/{pq.name}/api").json()
    assert (row["due"], row["scheduled"], row["dead"]) == (4, 4, 1)
    assert row["paused_ms"] is not None


def test_an_embedded_worker_whose_queues_partition_record_is_unreadable_stops_with_one_line(
    client: redis.Redis, redis_url: str, q: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """The embedded worker reads its queues' partitions records at run(): one edited by hand
    stops it with exit 1 and one line naming the record (as `scheduler worker` refuses it at
    start), not a traceback logged as a bug."""
    import asyncio

    from scheduler.core.connection import connect_async
    from scheduler.core.partitions import meta_key
    from scheduler.worker import Worker, WorkerSettings
    from scheduler.worker.registry import Registry

    client.set(meta_key(q.name), "not a layout")

    async def main() -> int:
        aclient = connect_async(redis_url)
        try:
            w = Worker(aclient, Registry(), WorkerSettings(queues=(q.name,), burst=True))
            return await w.run(install_signals=False)
        finally:
            await aclient.aclose()

    try:
        with caplog.at_level(logging.ERROR, logger="scheduler"):
            code = asyncio.run(main())
    finally:
        client.delete(meta_key(q.name))
    assert code == 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("cannot start" in r.getMessage() for r in errors), [r.getMessage() for r in errors]
    assert all(r.exc_info is None for r in errors)


def test_an_embedded_worker_started_while_redis_is_away_claims_the_partitions(
    pq: PartitionedQueue, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The partitions record is read before the first claim, retried while Redis does not
    answer: a worker started during an outage claimed the logical name as given (a queue no
    job is ever in), so it served nothing once Redis came back. The outage is the read's first
    two calls failing as a connection refused does."""
    from scheduler.worker import partitioned_start

    registry = Registry()

    @registry.task("t")
    def t(payload: Any, ctx: JobContext) -> None:
        return None

    ids = pq.enqueue_many([JobSpec("t", None) for _ in range(3)])
    from scheduler.client.partitioned_merge import expand_labelled_async as real

    calls = []

    async def away_twice(client: Any, queues: Any) -> Any:
        calls.append(queues)
        if len(calls) <= 2:
            raise redis.exceptions.ConnectionError("Connection refused")
        return await real(client, queues)

    monkeypatch.setattr(partitioned_start, "expand_labelled_async", away_twice)

    async def run() -> int:
        client = connect_async(redis_url)
        try:
            settings = WorkerSettings(queues=(pq.name,), burst=True, grace_s=0)
            return await Worker(client, registry, settings).run(install_signals=False)
        finally:
            await client.aclose()

    assert asyncio.run(run()) == 0
    assert len(calls) == 3
    assert [pq.status(i) for i in ids] == ["done"] * 3, [pq.status(i).value for i in ids]
