"""Review of pausing and resuming a queue and how a pause composes with the rest (real Redis):
leases held when the pause lands and their retries, delayed jobs and recurring schedules
coming due meanwhile, flow control's held jobs and limits across a pause, a pause value edited
by hand, a partitioned queue where one partition refuses, a pause racing claims, and the
library / asyncio / CLI / dashboard surfaces side by side."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from starlette.testclient import TestClient

from scheduler import AsyncPartitionedQueue, AsyncQueue, BadArgument, JobSpec, Queue
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import connect_async
from scheduler.core.errors import CorruptKey
from scheduler.dashboard import Auth, create_app
from tests.conftest import Clock, delete_queue, dump_queue
from tests.test_dashboard import csrf_of, make_client
from tests.workers.procs import spawn_worker, stop_all, wait_for

EVERY_MS = 10_000
START_MS = 1_000 * EVERY_MS + 1  # just after a slot: the schedule's next run is a slot away


@pytest.fixture
def pq(client: redis.Redis, queue_name: str) -> Iterator[PartitionedQueue]:
    p = PartitionedQueue.create(client, queue_name + "-p", partitions=3)
    yield p
    for part in p.parts:
        delete_queue(client, part)
    client.delete(f"sched:{{{p.name}}}:partitions")


def cli(redis_url: str, queue: str, *args: str) -> Any:
    return CliRunner().invoke(main, [*args, "--url", redis_url, "-q", queue])


def queue_findings(redis_url: str, queue: str) -> list[dict[str, Any]]:
    """`scheduler doctor --json -q queue`'s findings about the queue (not the server's)."""
    r = cli(redis_url, queue, "doctor", "--json")
    assert r.exit_code in (0, 1), r.output
    return [f for f in json.loads(r.stdout)["findings"] if f["queue"] is not None]


def corrupt_config(client: redis.Redis, part: Queue) -> None:
    """A partition's config key edited by hand into a string: its pause / resume refuse."""
    client.delete(part.keys.config)
    client.set(part.keys.config, "junk")


# --- what is already leased, or comes due, while the queue is paused ------------------------


def test_a_lease_held_when_the_pause_lands_fails_and_its_retry_waits_for_the_resume(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(1_000_000)
    job = q.enqueue("x", None, max_attempts=3)
    (held,) = q.claim("w").jobs
    assert q.pause() == "paused"
    out = q.fail(held.id, held.token, ValueError("flaky"))
    assert out.status == "retry" and q.status(job) == "scheduled"  # settled as usual
    clock.set_ms(1_000_000 + 3_600_000)  # the backoff long over: due, and still not claimed
    batch = q.claim("w", limit=10)
    assert (batch.jobs, batch.next_ms, q.status(job)) == ([], -1, "due")
    assert q.resume() == "resumed"
    (again,) = q.claim("w").jobs
    assert (again.id, again.attempts) == (job, 2)  # the paused span used no attempt


def test_a_delayed_job_due_during_a_pause_waits_and_a_start_deadline_still_holds(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(1_000_000)
    later = q.enqueue("x", None, delay_ms=5_000)
    bounded = q.enqueue("x", None, delay_ms=5_000, start_within_ms=2_000)
    q.pause()
    clock.set_ms(1_000_000 + 60_000)
    c = q.counts()
    assert (c.due, c.scheduled, c.paused) == (2, 0, True)  # counted due, as the queue's truth
    assert q.claim("w", limit=10).jobs == []
    q.resume()
    # A start deadline passed during the pause: parked, as documented for any late start.
    assert [j.id for j in q.claim("w", limit=10).jobs] == [later]
    assert q.status(bounded) == "dead"
    assert q.get_job(bounded).dead_reason == "start deadline passed"


@pytest.mark.parametrize(
    ("misfire", "slots"),
    [("run_once", [5]), ("catch_up:3", [3, 4, 5]), ("skip", [])],
)
def test_a_schedule_whose_slots_pass_during_a_pause_meets_its_misfire_policy(
    tq: tuple[Queue, Clock], misfire: str, slots: list[int]
) -> None:
    q, clock = tq
    clock.set_ms(START_MS)
    q.schedule("tick", "t", every_ms=EVERY_MS, misfire=misfire)
    q.pause()
    now = START_MS + 5 * EVERY_MS + 500  # five slots pass while the queue is paused
    clock.set_ms(now)
    for _ in range(3):
        assert q.claim("w", limit=10).jobs == []
    assert q.counts().due == 1  # the one pending run, not one per slot
    q.resume()
    ran: list[str] = []
    for _ in range(10):
        ran += [j.id for j in q.claim("w", limit=10).jobs]
    want = [f"schedule:tick:{START_MS - 1 + k * EVERY_MS}" for k in slots]
    assert ran == want
    nxt = q.get_schedule("tick").next_run_ms
    assert nxt is not None and now < nxt <= now + EVERY_MS  # armed at the next future slot


def test_flow_control_keeps_its_limits_across_a_pause(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    clock.set_ms(1_000_000)
    keyed = [q.enqueue("k", {"i": i}, concurrency_key="ck", concurrency_limit=1) for i in range(3)]
    rated = [q.enqueue("r", {"i": i}, rate_limit="2/10s") for i in range(6)]
    first = q.claim("w", limit=20).jobs
    assert sorted(j.id for j in first) == sorted([keyed[0], *rated[:2]])
    q.pause()
    for j in first:
        q.complete(j.id, j.token, "ok")  # frees the key's slot while paused
    clock.set_ms(1_000_000 + 25_000)  # the rate windows pass while paused
    assert q.claim("w", limit=20).jobs == []
    c = q.counts()
    assert c.paused and c.leased == 0 and c.due + sum(c.held.values()) >= 6
    q.resume()
    after = {j.id for j in q.claim("w", limit=20).jobs}
    # One of the key (its limit), two of the rate key (its window): no burst of the backlog.
    assert len(after & set(keyed)) == 1 and len(after & set(rated)) == 2


def test_a_job_running_when_the_pause_lands_finishes_and_nothing_else_starts(
    redis_url: str, q: Queue, tmp_path: Path
) -> None:
    gates = [tmp_path / "g1", tmp_path / "g2"]
    running = [q.enqueue("sync_sleep", {"s": 60, "until": str(g)}) for g in gates]
    ledger = f"test:ledger:{q.name}"
    w = spawn_worker(redis_url, q.name, "-c", "2", log=str(tmp_path / "w.log"))
    try:

        def started() -> list[str]:
            entries = [str(e) for e in q.client.lrange(ledger, 0, -1)]
            return [e.split("|")[0] for e in entries if "|start|" in e]

        wait_for(lambda: sorted(started()) == sorted(running), 20, "both gated jobs started")
        assert q.pause() == "paused"
        waiting = q.enqueue_many([JobSpec("echo", {"i": i}) for i in range(3)])
        gates[0].touch()  # the first ends: its slot frees and the worker claims (nothing)
        wait_for(lambda: q.status(running[0]) == "done", 20, "the first gated job done")
        gates[1].touch()
        wait_for(lambda: q.status(running[1]) == "done", 20, "the second gated job done")
        assert {q.status(j) for j in waiting} == {"due"}
        assert sorted(started()) == sorted(running)  # no other job started while paused
        assert q.resume() == "resumed"
        wait_for(lambda: {q.status(j) for j in waiting} == {"done"}, 20, "all done after resume")
    finally:
        stop_all([w])
        q.client.delete(ledger)


def test_a_pause_racing_claims_takes_effect_once_it_returns(client: redis.Redis, q: Queue) -> None:
    q.enqueue_many([JobSpec("x", {"i": i}) for i in range(400)])
    stop = threading.Event()
    rounds = [0, 0]
    errors: list[BaseException] = []

    def claimer(k: int) -> None:
        own = Queue(client, q.name)
        try:
            while not stop.is_set():
                own.claim(f"w{k}", limit=1)
                rounds[k] += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: min(rounds) >= 5, 20, "both claimers running")
        assert q.pause() == "paused"
        leased = set(client.zrange(q.keys.leased, 0, -1))
        seen = list(rounds)
        wait_for(lambda: all(r >= s + 20 for r, s in zip(rounds, seen, strict=True)), 20,
                 "20 more claims each")  # fmt: skip
        assert set(client.zrange(q.keys.leased, 0, -1)) == leased  # none leased since
        assert q.resume() == "resumed"
        wait_for(lambda: client.zcard(q.keys.leased) > len(leased), 20, "claims lease again")
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert errors == []
    assert len(leased) < 400


# --- a pause value edited by hand ----------------------------------------------------------


def test_a_hand_edited_pause_value_pauses_and_shows_as_paused_at_an_unknown_time(
    client: redis.Redis, redis_url: str, q: Queue
) -> None:
    job = q.enqueue("x", None)
    client.hset(q.keys.config, "paused_ms", "soon")
    c = q.counts()
    assert (c.paused, c.paused_ms) == (True, 0)
    assert q.claim("w").jobs == []
    r = cli(redis_url, q.name, "stats")
    assert r.exit_code == 0 and f"{q.name} (paused)" in r.output
    with make_client(client, q) as web:
        page = web.get(f"/queues/{q.name}").text
        assert "Paused since <span data-paused-since>an unknown time</span>" in page
        assert "1970" not in page
    assert q.pause() == "already"  # kept: the pause is there
    r = cli(redis_url, q.name, "resume")
    assert (r.exit_code, r.output) == (0, f"{q.name}: resumed\n")
    assert [j.id for j in q.claim("w").jobs] == [job]


def test_the_doctor_names_a_pause_value_edited_by_hand(
    client: redis.Redis, redis_url: str, q: Queue
) -> None:
    """Was: claims stopped for good and doctor said nothing (paused_ms skipped on purpose)."""
    q.enqueue("x", None)
    assert q.pause() == "paused"
    assert queue_findings(redis_url, q.name) == []  # a pause the product wrote is no finding
    for raw in ("soon", "-1", "1e12", str(2**60)):
        client.hset(q.keys.config, "paused_ms", raw)
        assert q.claim("w").jobs == []  # nothing is claimed, for as long as the field is there
        (found,) = queue_findings(redis_url, q.name)
        assert (found["code"], found["severity"]) == ("paused-unreadable", "warning")
        assert f"paused_ms {raw!r}" in found["message"], found
        assert "claims are stopped" in found["message"], found
        assert found["fix"].startswith(f"scheduler resume -q {q.name}"), found
    assert cli(redis_url, q.name, "resume").exit_code == 0  # the fix it names
    assert queue_findings(redis_url, q.name) == []
    assert len(q.claim("w").jobs) == 1


# --- a partitioned queue ---------------------------------------------------------------------


def test_sync_and_async_refuse_a_partitioned_queues_own_name_and_write_nothing(
    client: redis.Redis, redis_url: str, pq: PartitionedQueue
) -> None:
    pq.enqueue_many([JobSpec("x", None) for _ in range(3)])
    logical = Queue(client, pq.name)
    before = [dump_queue(client, p) for p in (logical, *pq.parts)]
    for call in (logical.pause, logical.resume):
        with pytest.raises(BadArgument):
            call()

    async def run() -> list[str]:
        aclient = connect_async(redis_url)
        try:
            aq = AsyncQueue(aclient, pq.name)
            refused = []
            for acall in (aq.pause, aq.resume):
                try:
                    await acall()
                except BadArgument:
                    refused.append(acall.__name__)
            return refused
        finally:
            await aclient.aclose()

    assert asyncio.run(run()) == ["pause", "resume"]
    assert [dump_queue(client, p) for p in (logical, *pq.parts)] == before


def test_async_partitioned_pause_and_resume_match_the_sync_ones(
    client: redis.Redis, redis_url: str, pq: PartitionedQueue
) -> None:
    async def run() -> list[Any]:
        aclient = connect_async(redis_url)
        try:
            apq = await AsyncPartitionedQueue.open(aclient, pq.name)
            out: list[Any] = [await apq.pause(), await apq.pause()]
            out.append([(await p.counts()).paused for p in apq.parts])
            out += [await apq.resume(), await apq.resume()]
            return out
        finally:
            await aclient.aclose()

    assert asyncio.run(run()) == ["paused", "already", [True, True, True], "resumed", "active"]
    assert [p.counts().paused for p in pq.parts] == [False, False, False]


def test_a_partitioned_pause_one_partition_refuses_is_refused_whole_naming_it(
    client: redis.Redis, redis_url: str, pq: PartitionedQueue
) -> None:
    """Was: the others paused, then that partition's bare CorruptKey 'config is not a hash
    (nothing written)', naming no partition. Every partition is checked first now: one
    refusing refuses the change whole, nothing written, and the error names it."""
    corrupt_config(client, pq.parts[1])
    assert pq.parts[2].pause() == "paused"  # a resume refused must leave this one paused
    before = [dump_queue(client, p) for p in pq.parts]
    errors: list[BaseException] = []
    for call in (pq.pause, pq.resume):
        with pytest.raises(CorruptKey) as sync_err:
            call()
        errors.append(sync_err.value)

    async def run() -> list[BaseException]:
        aclient = connect_async(redis_url)
        try:
            apq = await AsyncPartitionedQueue.open(aclient, pq.name)
            out: list[BaseException] = []
            for acall in (apq.pause, apq.resume):
                try:
                    await acall()
                except CorruptKey as exc:
                    out.append(exc)
            return out
        finally:
            await aclient.aclose()

    errors += asyncio.run(run())
    assert len(errors) == 4
    assert [dump_queue(client, p) for p in pq.parts] == before  # nothing written
    for err in errors:
        assert pq.parts[1].keys.config in str(err), str(err)  # which partition refused


def test_cli_and_dashboard_say_which_partition_refused_a_partitioned_pause(
    client: redis.Redis, redis_url: str, pq: PartitionedQueue
) -> None:
    corrupt_config(client, pq.parts[1])
    r = cli(redis_url, pq.name, "pause")
    assert r.exit_code != 0
    cli_text = r.output
    assert [p.counts().paused for p in pq.parts] == [False, False, False]
    with TestClient(create_app(client=client, queues=[pq.name], auth=Auth())) as web:
        token = csrf_of(web.get(f"/queues/{pq.name}").text)
        page = web.post(f"/queues/{pq.name}/pause", data={"csrf": token}).text
    assert [p.counts().paused for p in pq.parts] == [False, False, False]
    for text in (cli_text, page):
        assert "nothing written" in text, text
        assert pq.parts[1].name in text, text


def test_stats_tells_a_partly_paused_queue_from_a_paused_one(
    redis_url: str, pq: PartitionedQueue
) -> None:
    pq.enqueue_many([JobSpec("x", None) for _ in range(6)])

    def pause_fields() -> dict[str, Any]:
        r = cli(redis_url, pq.name, "stats", "--json")
        assert r.exit_code == 0, r.output
        (row,) = json.loads(r.stdout)["queues"]
        return {k: v for k, v in row.items() if "paus" in k}

    def table_name() -> str:
        r = cli(redis_url, pq.name, "stats")
        assert r.exit_code == 0, r.output
        lines: list[str] = [x for x in r.output.splitlines() if pq.name in x]
        (line,) = lines
        return line

    assert pause_fields() == {"paused_ms": None, "paused_partitions": []}
    assert "paus" not in table_name()
    assert pq.parts[1].pause() == "paused"
    partly = pause_fields()
    assert partly["paused_ms"] is not None and partly["paused_partitions"] == [pq.parts[1].name]
    assert "(paused: 1 of 3 partitions)" in table_name()
    assert sum(len(p.claim("w", limit=10).jobs) for p in pq.parts) > 0  # others still claim
    assert pq.pause() == "paused"
    whole = pause_fields()
    assert whole["paused_partitions"] == [p.name for p in pq.parts]
    assert "(paused)" in table_name()


def test_a_worker_on_a_partitioned_queue_paused_whole_runs_everything_after_resume(
    redis_url: str, pq: PartitionedQueue, tmp_path: Path
) -> None:
    assert pq.pause() == "paused"
    ids = pq.enqueue_many([JobSpec("echo", {"i": i}) for i in range(6)])
    log = tmp_path / "w.log"
    w = spawn_worker(redis_url, pq.name, log=str(log))
    try:

        def warned() -> list[str]:
            lines = log.read_text().splitlines() if log.exists() else []
            return [json.loads(x)["msg"] for x in lines if '"paused' in x]

        wait_for(lambda: bool(warned()), 20, "the worker's paused warning")
        (msg,) = warned()
        assert all(p.name in msg for p in pq.parts), msg
        assert {pq.status(j) for j in ids} == {"due"}
        assert pq.resume() == "resumed"
        wait_for(lambda: {pq.status(j) for j in ids} == {"done"}, 20, "all done after resume")
    finally:
        stop_all([w])


# --- the CLI beside the dashboard ------------------------------------------------------------


def test_cli_run_now_and_reschedule_now_say_the_queue_is_paused(redis_url: str, q: Queue) -> None:
    """Was: neither said a word of the pause (the dashboard does). The note goes to stderr
    (stdout stays the id / status scripts read); --json says `queue_paused`."""
    job = q.enqueue("x", None, delay_ms=3_600_000)
    q.schedule("nightly", "report", every_ms=24 * 3_600_000)
    fresh = cli(redis_url, q.name, "schedules", "run", "nightly", "--json")
    assert "queue_paused" not in json.loads(fresh.stdout)  # not paused: as before
    q.pause()
    ran = cli(redis_url, q.name, "schedules", "run", "nightly")
    moved = cli(redis_url, q.name, "jobs", "reschedule", job, "--now")
    assert (ran.exit_code, moved.exit_code) == (0, 0)
    assert q.claim("w", limit=10).jobs == []  # neither runs now
    assert q.status(ran.stdout.strip()) == "due"  # stdout: the new id alone
    assert moved.stdout == f"{job}: rescheduled\n"
    for r in (ran, moved):
        assert "the queue is paused: it runs once the queue is resumed" in r.stderr, r.output
    again = cli(redis_url, q.name, "jobs", "reschedule", job, "--now", "--json")  # due already
    made = cli(redis_url, q.name, "schedules", "run", "nightly", "--json")
    assert json.loads(again.stdout) == {
        "queue": q.name, "job": job, "status": "due", "queue_paused": True,
    }  # fmt: skip
    assert json.loads(made.stdout)["queue_paused"] is True
    q.resume()
    assert "paus" not in cli(redis_url, q.name, "jobs", "reschedule", job, "--now").output


def test_cli_run_now_names_the_paused_partition_of_a_partitioned_queue(
    redis_url: str, pq: PartitionedQueue
) -> None:
    pq.schedule("nightly", "report", every_ms=24 * 3_600_000)
    part = pq._sched("nightly")
    assert part.pause() == "paused"  # that partition alone
    ran = cli(redis_url, pq.name, "schedules", "run", "nightly")
    assert ran.exit_code == 0, ran.output
    assert f"its partition {part.name} is paused" in ran.stderr, ran.output
    assert f"scheduler resume -q {pq.name})" in ran.stderr
    assert pq.status(ran.stdout.strip()) == "due"


def test_a_paused_queue_name_typo_is_refused_by_cli_and_library_writes_on_demand(
    client: redis.Redis, redis_url: str, q: Queue
) -> None:
    q.enqueue("x", None)
    typo = q.name + "-typo"
    for verb in ("pause", "resume"):
        r = cli(redis_url, typo, verb)
        assert r.exit_code == 1 and "no queue named" in r.output
    assert dump_queue(client, Queue(client, typo)) == {}
    other = Queue(client, "t-" + uuid.uuid4().hex[:12])
    try:  # the library pauses a queue before its first job (a deploy's first step)
        assert other.pause() == "paused"
        assert cli(redis_url, other.name, "resume").output == f"{other.name}: resumed\n"
    finally:
        delete_queue(client, other)
