"""docs/limits.md audited against the code: each documented bound at its exact edges (the last
value accepted, the first refused, and the wrong types) on every path that takes it: Queue /
JobSpec + enqueue_many / AsyncQueue (its batcher) / TaskHandle / @registry.task / schedule / the
CLI / a hand-made script call. A refusal is the documented error type and writes nothing; an
accepted maximum works end to end (stored as asked, claimed, shown)."""

from __future__ import annotations

import asyncio
import pathlib
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from click.testing import CliRunner
from starlette.testclient import TestClient

from scheduler import (
    AsyncQueue,
    Backoff,
    BadArgument,
    InvalidPayload,
    JobSpec,
    Queue,
    Registry,
)
from scheduler.cli.main import main
from scheduler.core.connection import connect_async
from scheduler.core.limits import MAX_DELAY_MS, MAX_TIME_MS
from scheduler.dashboard import Auth, create_app
from scheduler.operations.ops import Script
from scheduler.schedules.recurring import stable_offset_ms
from scheduler.worker import SettingsError, Worker, WorkerSettings
from tests.conftest import Clock, dump_queue

ROOT = pathlib.Path(__file__).resolve().parent.parent
T0 = 1_800_000_000_000  # the test clock: 2027-01-15
DAY = 86_400_000
TTL_MAX = 366 * DAY
JOB_ID = "i" * 127 + "Z"  # 128 characters
TASK = "t" * 199 + "/"  # 200 characters
MAXED: dict[str, Any] = {  # every documented maximum of enqueue at once
    "job_id": JOB_ID,
    "delay_ms": MAX_DELAY_MS,
    "max_attempts": 1_000_000,
    "timeout_ms": 7 * DAY,
    "result_ttl_ms": TTL_MAX,
    "key": "k" * 512,
    "key_ttl_ms": TTL_MAX,
    "start_within_ms": MAX_DELAY_MS,
    "backoff": Backoff(MAX_DELAY_MS, 1000.0, MAX_DELAY_MS, 1.0),
    "keep_payload": True,
}
# (argument, its first refused value): each beside MAXED's other values.
PAST_THE_EDGE: list[tuple[str, Any]] = [
    ("delay_ms", MAX_DELAY_MS + 1),
    ("delay_ms", -1),
    ("max_attempts", 1_000_001),
    ("max_attempts", 0),
    ("timeout_ms", 7 * DAY + 1),
    ("timeout_ms", -1),
    ("result_ttl_ms", TTL_MAX + 1),
    ("result_ttl_ms", 0),
    ("key_ttl_ms", TTL_MAX + 1),
    ("key_ttl_ms", 0),
    ("key", "k" * 513),
    ("start_within_ms", MAX_DELAY_MS + 1),
    ("start_within_ms", 0),
    ("job_id", "i" * 129),
    ("jitter_ms", 1),  # delay_ms + jitter_ms past 3650 days
    ("max_attempts", True),
    ("max_attempts", 5.0),
    ("max_attempts", "5"),
    ("timeout_ms", None),
    ("result_ttl_ms", True),
    ("key_ttl_ms", 1.0),
    ("start_within_ms", "1"),
    ("keep_payload", 1),
]


PATHS: dict[str, Callable[[Queue, dict[str, Any]], str]] = {
    "enqueue": lambda q, kw: q.enqueue(TASK, {"n": 1}, **kw),
    "enqueue_many": lambda q, kw: q.enqueue_many([JobSpec(TASK, {"n": 1}, **kw)])[0],
    "task_handle": lambda q, kw: (
        Registry().task(TASK)(lambda p, ctx: None).enqueue(q, {"n": 1}, **kw)
    ),
}


def _check_maxed(q: Queue, client: redis.Redis, job_id: str) -> None:
    """The job MAXED asked for, stored as asked: due at now + 3650 days, its key held that
    long plus 366 days, and claimed at its run time with every field as given."""
    assert job_id == JOB_ID
    assert client.zscore(q.keys.due, JOB_ID) == T0 + MAX_DELAY_MS
    (idem,) = client.scan_iter(match=q.keys.prefix + "idem:*")
    assert MAX_DELAY_MS + TTL_MAX - 60_000 < client.pttl(idem) <= MAX_DELAY_MS + TTL_MAX
    Clock(client, q).set_ms(T0 + MAX_DELAY_MS)
    (job,) = q.claim("w" * 200, limit=1000, lease_ms=DAY, reap_limit=10_000).jobs
    assert (job.id, job.task, job.max_attempts, job.timeout_ms) == (JOB_ID, TASK, 10**6, 7 * DAY)
    assert job.backoff == MAXED["backoff"]
    assert job.start_by_ms == T0 + 2 * MAX_DELAY_MS
    q.complete(JOB_ID, job.token, {"r": 1})
    assert TTL_MAX - 60_000 < client.pttl(q.keys.job(JOB_ID)) <= TTL_MAX
    assert q.get_job(JOB_ID).payload() == {"n": 1}  # keep_payload


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_maximum_of_enqueue_at_once_is_stored_and_runs(
    tq: tuple[Queue, Clock], client: redis.Redis, path: str
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    _check_maxed(q, client, PATHS[path](q, dict(MAXED)))


@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_first_value_past_each_edge_is_bad_argument_writing_nothing(
    tq: tuple[Queue, Clock], client: redis.Redis, path: str
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    q.enqueue("seed", delay_ms=5)
    before = dump_queue(client, q)
    for name, value in PAST_THE_EDGE:
        if path == "task_handle" and value is None:
            continue  # a handle's None is the task's default (TaskHandle.job_spec)
        with pytest.raises(BadArgument, match=name.split("_")[0]):
            PATHS[path](q, {**MAXED, name: value})
            pytest.fail(f"{name}={value!r} accepted")
    assert dump_queue(client, q) == before


def test_the_asyncio_batcher_takes_the_maxima_and_refuses_one_past_alone(
    tq: tuple[Queue, Clock], client: redis.Redis, redis_url: str
) -> None:
    """Concurrent AsyncQueue.enqueue calls share script calls: a value past an edge is
    refused in its caller (BadArgument) and the others' maxed jobs are written as asked."""
    q, clock = tq
    clock.set_ms(T0)

    async def run() -> list[Any]:
        aclient = connect_async(redis_url)
        try:
            aq = AsyncQueue(aclient, q.name, _clock="test")
            calls = []
            for i in range(12):
                kw = {**MAXED, "job_id": f"{'a' * 126}{i:02d}", "key": f"{'k' * 509}{i:03d}"}
                if i == 5:
                    kw["max_attempts"] = 1_000_001
                calls.append(aq.enqueue(TASK, {"n": i}, **kw))
            return await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await aclient.aclose()

    got = asyncio.run(run())
    assert isinstance(got[5], BadArgument)
    written = [g for i, g in enumerate(got) if i != 5]
    assert written == [f"{'a' * 126}{i:02d}" for i in range(12) if i != 5]
    assert {client.zscore(q.keys.due, j) for j in written} == {T0 + MAX_DELAY_MS}
    assert q.counts().scheduled == 11


@pytest.mark.parametrize(
    ("run_at", "ok"),
    [
        (datetime(2200, 1, 1, tzinfo=UTC), True),
        (datetime(2199, 12, 31, 23, tzinfo=UTC) + timedelta(hours=1), True),
        (datetime(2200, 1, 1, tzinfo=UTC) + timedelta(milliseconds=1), False),
        (datetime(1970, 1, 1, tzinfo=UTC), True),
        (datetime(1, 1, 1, tzinfo=UTC), False),
        (datetime(9999, 12, 31, tzinfo=UTC), False),
    ],
)
def test_run_at_edges_and_the_clamped_start_deadline(
    tq: tuple[Queue, Clock], client: redis.Redis, run_at: datetime, ok: bool
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    spec = JobSpec("t", run_at=run_at, start_within_ms=MAX_DELAY_MS)
    calls: list[Callable[[], Any]] = [
        lambda: q.enqueue("t", run_at=run_at, start_within_ms=MAX_DELAY_MS),
        lambda: q.enqueue_many([spec]),
    ]
    for call in calls:
        if not ok:
            with pytest.raises(BadArgument, match="run_at"):
                call()
            continue
        job = call()
        job = job if isinstance(job, str) else job[0]
        at = round(run_at.timestamp() * 1000)
        assert client.zscore(q.keys.due, job) == at
        # The deadline (run time + the window) is clamped to 2200-01-01.
        assert q.get_job(job).start_by_ms == min(at + MAX_DELAY_MS, MAX_TIME_MS)
    if not ok:
        assert q.counts().due + q.counts().scheduled == 0


def test_registration_edges_of_a_task() -> None:
    reg = Registry()
    ok = reg.task(
        "ok",
        max_attempts=1_000_000,
        result_ttl_ms=TTL_MAX,
        start_within_ms=MAX_DELAY_MS,
        timeout_s=604_800,
        backoff=Backoff(MAX_DELAY_MS, 1000.0, MAX_DELAY_MS, 1.0),
        priority=9,
        concurrency_limit=10_000,
        rate_limit="100000/1d",
    )(lambda payload, ctx: None)
    assert ok.job_spec().timeout_ms == 7 * DAY
    assert reg.task("small", timeout_s=0.001)(lambda p, ctx: None).job_spec().timeout_ms == 1
    bads: list[dict[str, Any]] = [
        {"max_attempts": 1_000_001},
        {"max_attempts": True},
        {"result_ttl_ms": TTL_MAX + 1},
        {"start_within_ms": MAX_DELAY_MS + 1},
        {"start_within_ms": 0},
        {"timeout_s": 604_801},
        {"timeout_s": 0.0004},
        {"timeout_s": True},
        {"timeout_s": float("nan")},
        {"priority": 10},
        {"concurrency_limit": 10_001},
        {"rate_limit": "100001/1d"},
        {"keep_payload": 1},
    ]
    for i, bad in enumerate(bads):
        with pytest.raises(BadArgument):
            reg.task(f"bad{i}", **bad)(lambda payload, ctx: None)


@pytest.mark.parametrize("timeout_s", [0.0009, 604_800.0004])
def test_a_task_timeout_s_outside_the_documented_range_is_refused(timeout_s: float) -> None:
    """docs/limits.md: `timeout_s` of @registry.task is `0.001 .. 604_800` seconds (and the
    error says "[0.001, 604800]"). The check rounds to whole ms first, so 0.0009 s (a job
    timeout_ms of 1) and 604800.0004 s are accepted."""
    with pytest.raises(BadArgument, match="timeout_s"):
        Registry().task("t", timeout_s=timeout_s)(lambda payload, ctx: None)


@pytest.mark.parametrize("field", ["factor", "jitter"])
def test_a_backoff_factor_or_jitter_given_as_a_bool_is_refused(q: Queue, field: str) -> None:
    """Backoff(base_ms=True) is refused at enqueue (an int field), and every other number of
    the table refuses a bool (timeout_s=True, result's timeout_s=True); Backoff(factor=True)
    and Backoff(jitter=True) are taken as 1.0 and the job is written."""
    with pytest.raises(BadArgument):
        q.enqueue("t", backoff=Backoff(**{field: True}))
    assert q.counts().due == 0


@pytest.mark.parametrize(
    "worker_id",
    ["w" * 200, "é" * 100, "\u4e00" * 66, "é" * 101, "é" * 200, "\u4e00" * 67],
    ids=["200-ascii", "100-e-acute", "66-cjk", "101-e-acute", "200-e-acute", "67-cjk"],
)
def test_a_worker_id_the_worker_takes_can_claim(q: Queue, worker_id: str) -> None:
    """docs/limits.md said `worker_id` is 1-200 *characters*, and the client
    (claim_reply.check_worker_id) and Worker (settings.check_worker_id) counted characters; but
    lua/claim.lua refuses `#worker > 200`, bytes: 101 'é' (202 bytes) or 70 CJK characters
    (210 bytes) passed every client check, then every claim was 'BadArgument: refused by the
    server: worker=': a worker made with such an id started and claimed nothing, ever. Now
    200 bytes of UTF-8, counted by the client too: refused at the Worker, or it claims."""
    fits = len(worker_id.encode()) <= 200
    job = q.enqueue("t")
    if not fits:
        with pytest.raises(BadArgument, match="200 bytes"):
            Worker(aredis.Redis(), Registry(), WorkerSettings(), worker_id=worker_id)
        with pytest.raises(BadArgument, match="200 bytes"):
            q.claim(worker_id, limit=1)
        assert q.counts().due == 1
        return
    Worker(aredis.Redis(), Registry(), WorkerSettings(), worker_id=worker_id)  # accepted here
    assert [j.id for j in q.claim(worker_id, limit=1).jobs] == [job]


@pytest.mark.parametrize("job_id", [".", ".."])
def test_the_script_refuses_the_job_ids_the_client_refuses(
    q: Queue, client: redis.Redis, job_id: str
) -> None:
    """The client refuses job ids '.' and '..' ("cannot be linked to": the dashboard's job
    URL), a rule docs/limits.md's job_id row does not state; docs/limits.md says the scripts
    check the same ranges again for a hand-written call, but lua/enqueue.lua (job_id_ok)
    writes the job: a due job the dashboard cannot link to."""
    with pytest.raises(BadArgument):
        q.enqueue("t", job_id=job_id)
    fields = [job_id, "t", "{}", "in", "0", "5", "1000,2.0,1000,0.0", "0", "", "1000", "", "", ""]
    before = dump_queue(client, q)
    with pytest.raises(BadArgument, match="id"):
        q._execute(Script("enqueue", ["1", *fields]))
    assert dump_queue(client, q) == before


def test_the_scripts_hold_the_exact_edges_of_a_hand_made_enqueue(
    q: Queue, client: redis.Redis
) -> None:
    good = ["x", "t", "{}", "in", "0", "5", "1000,2.0,1000,0.0", "0", "", "1000", "", "", ""]
    at = {"id": 0, "task": 1, "when": 3, "time": 4, "attempts": 5, "backoff": 6, "timeout": 7}
    at |= {"idem": 8, "ttl": 9, "rttl": 10, "flags": 11}
    d, ttl = MAX_DELAY_MS, TTL_MAX
    edges: list[tuple[dict[str, str], dict[str, str]]] = [  # (last accepted, first refused)
        ({"time": str(d)}, {"time": str(d + 1)}),
        ({"when": "at", "time": str(MAX_TIME_MS)}, {"when": "at", "time": str(MAX_TIME_MS + 1)}),
        ({"when": "at", "time": "0"}, {"when": "at", "time": "-1"}),
        ({"attempts": "1000000"}, {"attempts": "1000001"}),
        ({"attempts": "1"}, {"attempts": "0"}),
        ({"timeout": str(7 * DAY)}, {"timeout": str(7 * DAY + 1)}),
        ({"ttl": str(ttl)}, {"ttl": str(ttl + 1)}),
        ({"rttl": str(ttl)}, {"rttl": str(ttl + 1)}),
        ({"rttl": "1"}, {"rttl": "0"}),
        ({"flags": f"kw{d}"}, {"flags": f"kw{d + 1}"}),
        ({"flags": "w1"}, {"flags": "w0"}),
        ({"id": "i" * 128}, {"id": "i" * 129}),
        ({"task": "t" * 200}, {"task": "t" * 201}),
        ({"backoff": f"{d},1000,{d},1.0"}, {"backoff": f"{d + 1},1000,{d},1.0"}),
        ({"backoff": f"0,1000.0,{d},1.0"}, {"backoff": "0,1000.0001,0,1.0"}),
        ({"idem": "a" * 64}, {"idem": "a" * 129}),
    ]
    for n, (ok, bad) in enumerate(edges):
        for change, accepted in ((bad, False), (ok, True)):
            f = list(good)
            f[0] = f"e{n}"
            for k, v in change.items():
                f[at[k]] = v
            before = dump_queue(client, q)
            if accepted:
                assert q._execute(Script("enqueue", ["1", *f]))[0] == "c", change
            else:
                with pytest.raises(BadArgument, match="refused by the server"):
                    q._execute(Script("enqueue", ["1", *f]))
                assert dump_queue(client, q) == before, change


def test_the_limits_page_lists_the_flow_misfire_and_queue_name_ranges() -> None:
    """docs/limits.md calls itself the valid range of *every* argument, but the ranges these
    refuse with BadArgument (on enqueue, JobSpec, @registry.task, schedule and the CLI) are not
    in its table: core/flow.py FLOW_LIMITS (`priority` 0..9, `concurrency_limit` 1..10,000,
    `rate_limit` 1..100,000 per 1 ms..1 day, `after` at most 100 ids), `concurrency_key` /
    `rate_key` (1-200 of the task alphabet), `misfire` (catch_up:N, N 1..1,000,
    cron_slots.MAX_CATCH_UP) and the queue name (1-64 of A-Z a-z 0-9 _ . -, not '.' / '..';
    a partitioned queue's at most 52)."""
    table = (ROOT / "docs" / "limits.md").read_text().split("## Stored numbers")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    first = " ".join(line.split("|")[1] for line in rows)
    wanted = ["`priority`", "`concurrency_limit`", "`rate_limit`", "`after`"]
    wanted += ["`concurrency_key`", "`rate_key`", "`misfire`", "queue name"]
    assert [w for w in wanted if w not in first] == []


def test_schedule_edges_refuse_writing_nothing_and_the_maxima_run(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    name, d = "n" * 64, MAX_DELAY_MS
    maxed: dict[str, Any] = {
        "every_ms": d,
        "jitter_ms": d - 1,
        "start_within_ms": d,
        "max_attempts": 1_000_000,
        "timeout_ms": 7 * DAY,
        "misfire": "catch_up:1000",
        "backoff": Backoff(d, 1000.0, d, 1.0),
    }
    before = dump_queue(client, q)
    bads: list[dict[str, Any]] = [
        {"every_ms": d + 1},
        {"every_ms": 0},
        {"jitter_ms": d},  # not below the interval
        {"start_within_ms": d + 1},
        {"start_within_ms": 0},
        {"max_attempts": 1_000_001},
        {"timeout_ms": 7 * DAY + 1},
        {"misfire": "catch_up:1001"},
        {"misfire": "catch_up:0"},
        {"every_ms": True},
        {"jitter_ms": 1.0},
    ]
    for bad in bads:
        with pytest.raises(BadArgument):
            q.schedule(name, TASK, **{**maxed, **bad})
            pytest.fail(f"{bad} accepted")
    for args in [("n" * 65, TASK), (name, "t" * 201)]:
        with pytest.raises(BadArgument):
            q.schedule(*args, every_ms=1000)
    with pytest.raises(BadArgument, match="513 characters"):
        q.schedule("c", "t", cron=_cron_of(513))
    assert dump_queue(client, q) == before
    assert q.schedule(name, TASK, **maxed) == "created"
    s = q.get_schedule(name)
    offset = stable_offset_ms(name, d - 1)
    assert (s.every_ms, s.jitter_ms, s.offset_ms) == (d, d - 1, offset)
    assert s.next_run_ms is not None and (s.next_run_ms - offset) % d == 0
    assert T0 - d < s.next_run_ms - offset <= T0 + d
    clock.set_ms(max(T0, s.next_run_ms))
    (run,) = q.claim("w", limit=1).jobs
    assert (run.max_attempts, run.timeout_ms, run.backoff) == (10**6, 7 * DAY, maxed["backoff"])
    assert run.start_by_ms == s.next_run_ms + d
    assert q.get_schedule(name).next_run_ms == s.next_run_ms + d  # the next one, armed


def _cron_of(n: int) -> str:
    """A valid cron expression of exactly n characters (n >= 12): minute 0 listed n times."""
    hour = "00" if n % 2 == 0 else "0"
    k = (n - 8 - len(hour)) // 2
    expr = "0" + ",0" * k + f" {hour} * * *"
    assert len(expr) == n
    return expr


def test_a_cron_of_512_characters_is_stored_and_refilled(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    clock.set_ms(T0)
    assert q.schedule("c512", "t", cron=_cron_of(512)) == "created"
    s = q.get_schedule("c512")
    assert s.next_run_ms is not None and s.next_run_ms % DAY == 0
    for _ in range(3):  # claims run it and refill its slots: each the next midnight
        clock.set_ms(s.next_run_ms)
        (run,) = q.claim("w", limit=1).jobs
        assert run.id == f"schedule:c512:{s.next_run_ms}"
        q.complete(run.id, run.token)
        nxt = q.get_schedule("c512").next_run_ms
        assert nxt == s.next_run_ms + DAY
        s = q.get_schedule("c512")


def test_the_schedule_script_holds_the_edges_of_a_hand_made_call(
    q: Queue, client: redis.Redis
) -> None:
    from scheduler.schedules.recurring import define

    d = define(
        "s", "t", "null", cron=None, every_ms=1000, tz=None, jitter_ms=0, misfire="skip",
        max_attempts=5, backoff=None, timeout_ms=0,
    )  # fmt: skip
    good = d.upsert_args([])
    # argv index (0-based) -> (last accepted, first refused)
    edges = {
        5: (str(MAX_DELAY_MS), str(MAX_DELAY_MS + 1)),  # every_ms
        12: ("1000000", "1000001"),  # max_attempts
        14: (str(7 * DAY), str(7 * DAY + 1)),  # timeout_ms
        16: (str(MAX_DELAY_MS), str(MAX_DELAY_MS + 1)),  # start_within_ms
        0: ("n" * 64, "n" * 65),  # name
        10: ("t" * 200, "t" * 201),  # task
    }
    for i, (ok, bad) in edges.items():
        before = dump_queue(client, q)
        args = list(good)
        args[i], args[1] = bad, f"{i:032d}"
        with pytest.raises(BadArgument, match="refused by the server"):
            q._execute(Script("schedule_upsert", args))
        assert dump_queue(client, q) == before
        args[i] = ok
        assert q._execute(Script("schedule_upsert", args))[0] in ("created", "updated")


URL_Q = ["--url", "{url}", "-q", "{queue}"]
CLI_ENQUEUE: list[tuple[list[str], bool]] = [  # (arguments, accepted)
    (["--in", "3650d"], True),
    (["--in", "3650d1ms"], False),
    (["--in", "3649d", "--jitter", "1d"], True),
    (["--in", "3649d", "--jitter", "1d1ms"], False),
    (["--at", "2200-01-01T00:00:00Z"], True),
    (["--at", "2199-12-31T23:00:00.001-01:00"], False),
    (["--max-attempts", "1000000"], True),
    (["--max-attempts", "1000001"], False),
    (["--timeout", "7d"], True),
    (["--timeout-ms", "604800001"], False),
    (["--key", "k" * 512, "--key-ttl", "366d"], True),
    (["--key", "k" * 513], False),
    (["--key", "x", "--key-ttl", "366d1ms"], False),
    (["--result-ttl", "366d"], True),
    (["--result-ttl", "366d1ms"], False),
    (["--result-ttl", "0s"], False),
    (["--start-within", "3650d"], True),
    (["--start-within", "3650d1ms"], False),
    (["--start-within", "0s"], False),
    (["--job-id", "i" * 129], False),
    (["--job-id", "."], False),
    (["--priority", "10"], False),
    (["--concurrency-key", "k", "--concurrency-limit", "10001"], False),
    (["--rate-limit", "100001/1d"], False),
    (["--payload", '"' + "x" * (512 * 1024 - 2) + '"'], True),
    (["--payload", '"' + "x" * (512 * 1024 - 1) + '"'], False),
]


def test_the_cli_takes_each_edge_and_refuses_one_past_with_exit_2(
    q: Queue, client: redis.Redis, redis_url: str
) -> None:
    runner = CliRunner()
    ids = []
    for args, accepted in CLI_ENQUEUE:
        before = dump_queue(client, q)
        out = runner.invoke(main, ["enqueue", "t", *args, "--url", redis_url, "-q", q.name])
        if accepted:
            assert out.exit_code == 0, (args[:2], out.output[-300:])
            ids.append(out.output.strip().splitlines()[-1])
        else:
            assert out.exit_code == 2, (args[:2], out.output[-300:])
            assert "Traceback" not in out.output
            assert dump_queue(client, q) == before, args[:2]
    assert len(ids) == sum(ok for _, ok in CLI_ENQUEUE)
    j = q.get_job(ids[0])
    now = q.counts().now_ms
    assert j.run_at_ms is not None and 0 <= now + MAX_DELAY_MS - j.run_at_ms < 60_000


def test_the_cli_schedule_edges(q: Queue, redis_url: str) -> None:
    runner = CliRunner()
    cases: list[tuple[list[str], bool]] = [
        (["s1", "t", "--every", "3650d"], True),
        (["s2", "t", "--every", "3650d1ms"], False),
        (["s3", "t", "--every", "1s", "--jitter", "999ms"], True),
        (["s4", "t", "--every", "1s", "--jitter", "1s"], False),
        (["n" * 64, TASK, "--every", "1s", "--max-attempts", "1000000", "--timeout", "7d"], True),
        (["n" * 65, "t", "--every", "1s"], False),
        (["s5", "t", "--every", "1s", "--max-attempts", "1000001"], False),
        (["s6", "t", "--every", "1s", "--start-within", "3650d"], True),
        (["s7", "t", "--every", "1s", "--start-within", "3650d1ms"], False),
        (["s8", "t", "--every", "1s", "--misfire", "catch_up:1000"], True),
        (["s9", "t", "--every", "1s", "--misfire", "catch_up:1001"], False),
        (["s10", "t", "--cron", _cron_of(512)], True),
        (["s11", "t", "--cron", _cron_of(514)], False),
    ]
    for args, accepted in cases:
        out = runner.invoke(main, ["schedules", "add", *args, "--url", redis_url, "-q", q.name])
        assert out.exit_code == (0 if accepted else 2), (args[:3], out.output[-300:])
    names = {s.name for s in q.list_schedules()}
    assert names == {a[0] for a, ok in cases if ok}


def test_a_job_of_every_maximum_is_shown_by_the_cli_and_the_dashboard(
    q: Queue, redis_url: str
) -> None:
    job = q.enqueue(
        TASK, {"n": 1}, **{**MAXED, "delay_ms": None}, priority=9,
        concurrency_key="c" * 200, concurrency_limit=10_000, rate_limit="100000/1d",
        rate_key="r" * 200,
    )  # fmt: skip
    (claimed,) = q.claim("é" * 100, limit=1).jobs  # 200 bytes: the script's own limit
    runner = CliRunner()
    for cmd in (["jobs", "show", job], ["jobs", "list", "--state", "leased"]):
        out = runner.invoke(main, [*cmd, "--url", redis_url, "-q", q.name])
        assert out.exit_code == 0, out.output[-500:]
        assert JOB_ID in out.output.replace("\n", "").replace(" ", "") or JOB_ID[:40] in out.output
    app = create_app(url=redis_url, queues=(q.name,), auth=Auth())
    with TestClient(app) as web:
        page = web.get(f"/queues/{q.name}/jobs/{job}")
        assert page.status_code == 200 and JOB_ID in page.text
        q.fail(job, claimed.token, RuntimeError("x"), retryable=False)
        for path in (f"/queues/{q.name}/jobs/{job}", f"/queues/{q.name}/dead", "/"):
            assert web.get(path).status_code == 200, path


def test_worker_settings_and_the_worker_command_at_their_edges(q: Queue, redis_url: str) -> None:
    oks: list[dict[str, Any]] = [
        {"lease_ms": DAY},
        {"result_ttl_ms": TTL_MAX},
        {"grace_s": 86_400},
        {"reap_limit": 10_000},
    ]
    for ok in oks:
        WorkerSettings(**ok).check()
    bads: list[dict[str, Any]] = [
        {"lease_ms": DAY + 1},
        {"lease_ms": True},
        {"result_ttl_ms": TTL_MAX + 1},
        {"result_ttl_ms": 0},
        {"grace_s": 86_400.001},
        {"grace_s": float("nan")},
        {"reap_limit": 10_001},
    ]
    for bad in bads:
        with pytest.raises(SettingsError):
            WorkerSettings(**bad).check()
    runner = CliRunner()
    base = ["worker", "tests.workers.basic:registry", "--url", redis_url, "-q", q.name, "--burst"]
    for args in (
        ["--lease-ms", str(DAY + 1)],
        ["--result-ttl-ms", str(TTL_MAX + 1)],
        ["--grace", "86400.5"],
        ["--lease-ms", "0"],
    ):
        out = runner.invoke(main, [*base, *args])
        assert out.exit_code == 2, (args, out.output[-300:])


def test_lease_calls_at_their_edges(q: Queue, client: redis.Redis) -> None:
    job = q.enqueue("t")
    (c,) = q.claim("w", limit=1, nonce="A" * 64, lease_ms=DAY).jobs
    before = dump_queue(client, q)
    for call in (
        lambda: q.heartbeat([(job, c.token)], lease_ms=DAY + 1),
        lambda: q.fail(job, c.token, RuntimeError("x"), delay_ms=MAX_DELAY_MS + 1),
        lambda: q.claim("w", limit=1001),
        lambda: q.claim("w", limit=0, reap_limit=10_001),
        lambda: q.claim("w", limit=0, nonce="A" * 65),
        lambda: q.claim("w" * 201, limit=0),
    ):
        with pytest.raises(BadArgument):
            call()
    assert dump_queue(client, q) == before
    with pytest.raises(InvalidPayload, match="4097 bytes"):
        q.set_progress(job, c.token, "é" * 2047 + "a")
    assert q.set_progress(job, c.token, "é" * 2047) == "held"  # 4,096 bytes of JSON
    assert q.get_job(job).progress == "é" * 2047
    lease_until, _ = q.heartbeat([(job, c.token)], lease_ms=DAY)
    assert lease_until == q.get_job(job).lease_until_ms
    now = q.counts().now_ms
    assert q.fail(job, c.token, RuntimeError("x"), delay_ms=MAX_DELAY_MS).status == "retry"
    run_at = q.get_job(job).run_at_ms
    assert run_at is not None and 0 <= run_at - now - MAX_DELAY_MS < 60_000


def test_a_key_of_a_past_run_at_is_held_from_now(q: Queue, client: redis.Redis) -> None:
    """key_ttl_ms counts past the first job's run time; one in the past (due now) holds the
    key for key_ttl_ms from now, not from 1970."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    first = q.enqueue("t", run_at=epoch, key="x", key_ttl_ms=60_000)
    assert q.enqueue("t", run_at=epoch, key="x") == first
    (idem,) = client.scan_iter(match=q.keys.prefix + "idem:*")
    assert 50_000 < client.pttl(idem) <= 60_000


def test_the_smallest_start_window_and_the_largest_chain(tq: tuple[Queue, Clock]) -> None:
    from scheduler.client.chain import chain

    q, clock = tq
    clock.set_ms(T0)
    on_time = q.enqueue("t", delay_ms=10, start_within_ms=1)
    late = q.enqueue("t", delay_ms=10, start_within_ms=1)
    clock.set_ms(T0 + 11)  # the last ms of its window
    assert [j.id for j in q.claim("w", limit=1).jobs] == [on_time]
    clock.set_ms(T0 + 12)
    assert q.claim("w", limit=1).jobs == []
    assert q.get_job(late).dead_reason == "start deadline passed"
    with pytest.raises(BadArgument, match="batch_size"):
        q.enqueue_many([JobSpec("t")], batch_size=10_001)
    assert len(q.enqueue_many([JobSpec("t")] * 2500, batch_size=10_000)) == 2500
    with pytest.raises(BadArgument, match="1000 steps"):
        chain(q, [("t", i) for i in range(1001)])
    assert q.counts().held_waiting == 0 and q.counts().due == 2500
    ids = chain(q, [("t", i) for i in range(1000)], max_attempts=1_000_000)
    assert len(ids) == 1000 and q.counts().held_waiting == 999


@pytest.mark.parametrize("name", [".", ".."])
def test_a_new_schedule_named_dot_is_refused_and_one_there_can_be_removed(
    q: Queue, client: redis.Redis, name: str
) -> None:
    """A schedule named '.' or '..' was accepted, and its dashboard page drew no buttons
    (schedule_view.py: it cannot be linked to): refused at definition, as a queue name or job id;
    one already there (an older version's) can still be removed."""
    before = dump_queue(client, q)
    with pytest.raises(BadArgument, match=re.escape("not '.' or '..'")):
        q.schedule(name, "t", every_ms=60_000)
    assert dump_queue(client, q) == before
    assert q.remove_schedule(name) == "missing"  # the name is still one to manage
