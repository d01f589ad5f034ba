"""Review: the input boundary, by property-based fuzzing with state diffing. Each example runs
on a private, flushed Redis holding accepted work; a public entry point gets generated arguments
mixing valid and invalid values, and either succeeds (a worker claims exactly the payload given,
as JSON gives it back) or raises a documented scheduler error with every key of the database
(type, value, TTL presence) as before. BOUNDARY_FUZZ_EXAMPLES / _RANDOM=1: more, or other."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import threading
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, TypedDict
from zoneinfo import ZoneInfo

import pytest
import redis
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from scheduler import AsyncQueue, Backoff, JobSpec, Queue, Registry, SchedulerError
from scheduler.cli.main import main
from scheduler.core.connection import connect, connect_async
from scheduler.worker.payloads import decode_payload
from tests.redis_server import RedisProcess

FUZZ = settings(
    max_examples=int(os.environ.get("BOUNDARY_FUZZ_EXAMPLES", "100")),
    deadline=None,
    derandomize=not os.environ.get("BOUNDARY_FUZZ_RANDOM"),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
T0 = 1_900_000_000_000  # the test clock: 2030-03-17
QNAME = "bfz"
BASE = ("base-1", "base-2", "base-p")
DAY = 86_400_000
MAX_DELAY = 3650 * DAY


# --- the database, whole ------------------------------------------------------------------
def snapshot(c: redis.Redis) -> dict[str, Any]:
    """Every key of the database: type, value, whether it has a TTL."""
    out: dict[str, Any] = {}
    for key in sorted(map(str, c.scan_iter(count=1000))):
        if key.endswith(":test:now_ms") or key == "sched:queues":
            continue  # the test clock; the queue index (advisory: the queue has keys already)
        t = str(c.type(key))
        out[key] = (t, READ[t](c, key), c.pttl(key) > 0)
    return out


READ: dict[str, Any] = {
    "hash": lambda c, k: sorted(c.hgetall(k).items()),
    "zset": lambda c, k: c.zrange(k, 0, -1, withscores=True),
    "list": lambda c, k: c.lrange(k, 0, -1),
    "set": lambda c, k: sorted(c.smembers(k)),
    "string": lambda c, k: c.get(k),
}


def _diff(a: dict[str, Any], b: dict[str, Any]) -> str:
    lines = [f"+ {k}: {b[k]!r:.200}" for k in b.keys() - a.keys()]
    lines += [f"- {k}" for k in a.keys() - b.keys()]
    lines += [f"~ {k}: {a[k]!r:.200} -> {b[k]!r:.200}" for k in a.keys() & b.keys() if a[k] != b[k]]
    return "the database changed:\n" + "\n".join(lines)


@pytest.fixture(scope="module")
def url(module_server: RedisProcess) -> str:
    return module_server.url


@pytest.fixture(scope="module")
def c(url: str) -> Any:
    client = connect(url)
    yield client
    client.close()


def fresh(c: redis.Redis) -> Queue:
    """A flushed database holding accepted work, on a queue whose scripts read a test clock."""
    c.flushall()
    q = Queue(c, QNAME, _clock="test")
    c.set(q.keys.test_clock, T0)
    q.enqueue("base", {"n": 1}, job_id="base-1")
    q.enqueue("base", {"n": 2}, job_id="base-2", key="k-base", delay_ms=60_000)
    q.enqueue("base", {"n": 3}, job_id="base-p")
    q.schedule("s-base", "base", {"n": 4}, every_ms=60_000)
    return q


def json_form(payload: Any) -> Any:
    return json.loads(json.dumps(payload))


def base_intact(q: Queue) -> None:
    for jid in BASE:
        assert q.get_job(jid).state in ("due", "scheduled"), jid


def existed(before: dict[str, Any], q: Queue, job_id: str) -> bool:
    return q.keys.spec(job_id) in before or q.keys.job(job_id) in before


def claim_payloads(q: Queue, c: redis.Redis, job_ids: list[str]) -> dict[str, Any]:
    """The test clock moved to the jobs' latest run time, claims until every one came out:
    {id: the payload the worker got}."""
    runs = [q.get_job(j).run_at_ms for j in job_ids]
    c.set(q.keys.test_clock, max([T0, *(r for r in runs if r is not None)]))
    got: dict[str, Any] = {}
    for _ in range(20):
        batch = q.claim("fuzz-w", limit=1000)
        assert not batch.unreadable, batch.unreadable
        got.update((j.id, j.payload()) for j in batch.jobs)
        if not batch.jobs:
            break
    missing = [j for j in job_ids if j not in got]
    assert not missing, [(j, q.get_job(j).fields) for j in missing]
    return got


def check_refusal(exc: BaseException, before: Any, c: redis.Redis, q: Queue | None) -> None:
    """A typed refusal that changed nothing (q: and the accepted work is still there)."""
    event(f"refused: {type(exc).__name__}")
    assert isinstance(exc, SchedulerError), f"untyped refusal: {type(exc).__name__}: {exc!r:.300}"
    after = snapshot(c)
    assert after == before, _diff(before, after)
    if q is not None:
        base_intact(q)


def check_accepted(
    q: Queue, c: redis.Redis, job_id: Any, payload: Any, opts: dict[str, Any], before: Any
) -> None:
    assert type(job_id) is str and job_id
    base_intact(q)
    if existed(before, q, job_id) and opts.get("debounce") is not True:
        event("answered with a job already there")  # its id, or its key's: nothing written
        after = snapshot(c)
        assert after == before, _diff(before, after)
    elif opts.get("debounce") is True and job_id == "base-2":  # the latest call's payload wins
        assert json.loads(q.get_job(job_id).payload_json) == json_form(payload)
    elif not opts.get("after") and opts.get("start_within_ms") is None:
        # (a child waits for its parent; a past run_at + a start window is parked at claim)
        event("accepted and claimed")
        assert claim_payloads(q, c, [job_id])[job_id] == json_form(payload)


# --- generated values: valid and invalid, mixed ----------------------------------------------
# fmt: off
ID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-"
odd = st.sampled_from([object(), {1, 2}, b"bytes", bytearray(b"x"), Decimal("1.5"), 1j,
                       date(2030, 1, 1)])
floats = st.floats() | st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324])
huge_ints = st.sampled_from([53, 54, 63, 64, 332, 13290, 14620]).map(lambda e: (-1) ** e * 2**e)
scalars = (st.none() | st.booleans() | st.integers() | huge_ints | floats | st.text(max_size=20)
           | st.sampled_from(["\ud800", "a\udfffb", "\x00", "é", "\U0001f600"]))
dict_keys = st.text(max_size=5) | st.integers(-3, 3) | st.sampled_from(
    [True, False, None, 1.5, -0.0, math.nan, (1, 2), b"k", "1", "true", "null"])
payloads = st.recursive(
    scalars | odd,
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(dict_keys, inner, max_size=4),
    max_leaves=12,
)


def nested(n: int, kind: str) -> Any:
    v: Any = 1
    for _ in range(n):
        v = [v] if kind == "list" else {"k": v}
    return v


payload_all = payloads | st.builds(nested, st.sampled_from([50, 900, 5000]),
                                   st.sampled_from(["list", "dict"]))


def ints_around(lo: int, hi: int) -> st.SearchStrategy[Any]:
    return (st.integers(lo, min(hi, lo + 1000))
            | st.sampled_from([lo, hi, lo - 1, hi + 1, -1, 0, 2**53, -(2**70)])
            | st.sampled_from([True, False, 1.0, 1.5, "10", Decimal(5), math.nan, None]))


tzs = st.sampled_from([UTC, timezone(timedelta(hours=23, minutes=59)), ZoneInfo("Europe/Berlin"),
                       timezone(timedelta(hours=-23, minutes=-59)), ZoneInfo("America/Sao_Paulo"),
                       timezone(timedelta(seconds=1, microseconds=1))])
run_ats = (
    st.builds(lambda d, tz: d.replace(tzinfo=tz),
              st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)), tzs)
    | st.builds(lambda ms, tz: datetime.fromtimestamp(ms / 1000, tz),
                st.integers(T0 - DAY, T0 + 10 * DAY), tzs)
    | st.datetimes()  # naive
    | st.sampled_from([date(2030, 1, 1), T0, "2030-01-01T00:00:00Z", 0.0])
)
backoffs = st.none() | st.sampled_from([
    Backoff(), Backoff(0, 1.0, 0, 0.0), Backoff(10**15, 2.0, 1, 0.5), Backoff(1, 1000.5, 1, 1.0),
    {"base_ms": 1}, (1, 2.0, 3, 0.0), "1000,2,3600000,0.25"])
job_ids = st.sampled_from(BASE) | st.none() | st.text(ID_CHARS, min_size=1, max_size=10) | (
    st.sampled_from(["schedule:x", ".", "..", "a b", "x" * 129, "é", "", 7, "a{b}"]))
tasks = st.text(ID_CHARS + "/", min_size=1, max_size=12) | st.sampled_from(
    ["", "a b", "x" * 201, "é", None, 5, b"t", "t\n"])
rate_limits = st.none() | st.sampled_from(
    ["10/1s", "100/m", "0/1s", "1/0s", "10/2d", "x", (5, 1000), (0, 1), [5, 1000], 5, "5/ 1 s"])
OPTIONS: dict[str, st.SearchStrategy[Any]] = {
    "delay_ms": st.none() | ints_around(0, MAX_DELAY),
    "run_at": run_ats,
    "max_attempts": ints_around(1, 1_000_000),
    "backoff": backoffs,
    "key": st.just("k-base") | st.none() | st.text(max_size=6) | st.sampled_from(
        ["k-new", "x" * 512, "x" * 513, "\ud800", "", "é" * 300, 5, b"k"]),
    "jitter_ms": ints_around(0, MAX_DELAY),
    "timeout_ms": ints_around(0, 7 * DAY),
    "job_id": job_ids,
    "result_ttl_ms": st.none() | ints_around(1, 366 * DAY),
    "keep_payload": st.sampled_from([False, True, 1, None, "yes"]),
    "priority": ints_around(0, 9),
    "concurrency_key": st.none() | st.sampled_from(["ck", "a b", "", 5]),
    "concurrency_limit": st.none() | ints_around(1, 10_000),
    "rate_limit": rate_limits,
    "rate_key": st.none() | st.sampled_from(["rk", "a b", ""]),
    "after": st.none() | st.lists(st.sampled_from(
        ["base-p", "base-1", "missing", "a b", "schedule:s-base", 3]), max_size=3)
        | st.sampled_from(["base-p", b"base-p", ("base-p",), ["base-p"] * 101, {"base-p": 1}]),
    "start_within_ms": st.none() | ints_around(1, MAX_DELAY),
    "key_ttl_ms": st.none() | ints_around(1, 366 * DAY),
    "debounce": st.sampled_from([False, False, True, 1, None]),
}
# fmt: on


def some_of(table: dict[str, st.SearchStrategy[Any]], n: int) -> st.SearchStrategy[Any]:
    names = st.lists(st.sampled_from(sorted(table)), max_size=n, unique=True)
    return names.flatmap(lambda ns: st.fixed_dictionaries({k: table[k] for k in ns}))


enqueue_calls = st.tuples(
    st.just("t") | tasks, st.just({"ok": 1}) | payload_all, some_of(OPTIONS, 5)
)


# --- Queue.enqueue, TaskHandle.enqueue, AsyncQueue.enqueue (concurrent) ------------------------
TASK_DEFAULTS: dict[str, st.SearchStrategy[Any]] = {
    "timeout_s": st.none() | st.sampled_from([0.001, 604_800, 604_801, 0, -1, math.nan, "1"]),
    "keep_payload": st.sampled_from([False, True, 1, None]),
    **{k: OPTIONS[k] for k in ("max_attempts", "backoff", "result_ttl_ms", "priority",
                               "concurrency_limit", "rate_limit", "start_within_ms")},
}  # fmt: skip


@FUZZ
@given(call=enqueue_calls, handle_defaults=st.none() | some_of(TASK_DEFAULTS, 3))
def test_enqueue_accepts_exactly_or_refuses_typed_and_changes_nothing(
    c: redis.Redis, call: tuple[Any, Any, dict[str, Any]], handle_defaults: Any
) -> None:
    """Queue.enqueue, or (with handle_defaults) the handle of a task registered with them."""
    task, payload, opts = call
    if handle_defaults is not None:
        try:
            handle = Registry().task("fuzz.task", **handle_defaults)(lambda p, ctx: None)
        except Exception as exc:
            assert isinstance(exc, SchedulerError), f"untyped: {type(exc).__name__}: {exc!r}"
            return
        opts = {**handle_defaults, **opts}  # for check_accepted: what the job got
    q = fresh(c)
    before = snapshot(c)
    try:
        if handle_defaults is None:
            job_id = q.enqueue(task, payload, **opts)
        else:
            job_id = handle.enqueue(q, payload, **call[2])
    except Exception as exc:
        check_refusal(exc, before, c, q)
        return
    check_accepted(q, c, job_id, payload, opts, before)


@FUZZ
@given(calls=st.lists(enqueue_calls, min_size=1, max_size=8))
def test_async_callers_get_their_own_answer_and_bad_ones_write_nothing(
    url: str, c: redis.Redis, calls: list[tuple[Any, Any, dict[str, Any]]]
) -> None:
    """Concurrent AsyncQueue.enqueue calls share script calls (client/enqueue_batcher.py)."""
    q = fresh(c)
    before = snapshot(c)

    async def run() -> list[Any]:
        ac = connect_async(url)
        aq = AsyncQueue(ac, QNAME, _clock="test")
        try:
            jobs = (aq.enqueue(t, p, **o) for t, p, o in calls)
            return await asyncio.gather(*jobs, return_exceptions=True)
        finally:
            await ac.aclose()

    by_id: dict[str, list[Any]] = {}
    for (_, payload, _), r in zip(calls, asyncio.run(run()), strict=True):
        if isinstance(r, BaseException):
            assert isinstance(r, SchedulerError), f"untyped: {type(r).__name__}: {r!r:.300}"
        else:
            by_id.setdefault(r, []).append(payload)
    base_intact(q)
    if not by_id:
        assert snapshot(c) == before
    # Every job stored now is one that was there, or one a caller was told about.
    spec = q.keys.prefix + "spec:"
    now_ids = {k.removeprefix(spec) for k in c.scan_iter(spec + "*")}
    was = {k.removeprefix(spec) for k in before if k.startswith(spec)}
    assert now_ids <= was | set(by_id), now_ids - was - set(by_id)
    for job_id, given_ in by_id.items():
        if not existed(before, q, job_id) and len(given_) == 1:
            assert json.loads(q.get_job(job_id).payload_json) == json_form(given_[0])


# --- Queue.enqueue_many: one bad spec refuses the whole call -------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(-1e300, 1e300) | st.text(max_size=8),
    lambda i: st.lists(i, max_size=3) | st.dictionaries(st.text(max_size=4), i, max_size=3),
    max_leaves=8,
)
good_specs = st.builds(
    JobSpec,
    st.just("t"),
    json_values,
    delay_ms=st.none() | st.integers(0, 10_000),
    job_id=st.none() | st.text(ID_CHARS[:26], min_size=8, max_size=8),
)
any_specs = enqueue_calls.map(
    lambda c: JobSpec(**{"task": c[0], "payload": c[1], **c[2]})
) | st.sampled_from([None, {"task": "t"}, ("t", 1), "t"])


@FUZZ
@given(
    items=st.lists(good_specs, max_size=4),
    bad=st.lists(any_specs, max_size=2),
    where=st.integers(0, 6),
    batch_size=st.sampled_from([1000, 1000, 3, 0, 10_001, True, 2.0, "5"]),
)
def test_enqueue_many_refuses_as_a_whole_or_accepts_every_job(
    c: redis.Redis, items: list[Any], bad: list[Any], where: int, batch_size: Any
) -> None:
    batch = list(items)
    for b in bad:
        batch.insert(min(where, len(batch)), b)
    if batch_size == 3 and any(isinstance(s, JobSpec) and s.after for s in batch):
        batch_size = 1000  # a server refusal across calls is documented as partial
    q = fresh(c)
    before = snapshot(c)
    try:
        ids = q.enqueue_many(batch, batch_size=batch_size)
    except Exception as exc:
        check_refusal(exc, before, c, q)
        return
    assert len(ids) == len(batch)
    base_intact(q)
    want = {
        job_id: json_form(spec.payload)
        for spec, job_id in zip(batch, ids, strict=True)
        if ids.count(job_id) == 1 and not existed(before, q, job_id)
        and not spec.after and spec.start_within_ms is None
    }  # fmt: skip
    got = claim_payloads(q, c, list(want))
    assert {k: got[k] for k in want} == want


# --- Queue.schedule: cron / interval / time zone ----------------------------------------------
# fmt: off
cron_atoms = st.sampled_from(
    ["*", "?", "L", "W", "0", "1", "5", "7", "13", "23", "29", "31", "59", "60", "-1", "jan", "dec",
     "mon", "sun", "fri", "15W", "5L", "1#2", "0#6", "1-5", "5-1", "*/0", "*/15", "1-30/7", "/", "",
     "99999999999999999999", "1.5", "x"])
crons = st.sampled_from(["0 9 * * *", "*/5 * * * * *", "0 0 29 2 *", "30 2 * * sun"]) | st.lists(
    st.lists(cron_atoms, min_size=1, max_size=2).map(",".join), min_size=4, max_size=7
).map(" ".join) | st.text(max_size=20)
zones = st.none() | st.sampled_from(["Europe/Berlin", "America/New_York"]) | st.sampled_from(
    ["UTC", "Australia/Lord_Howe", "localtime", "Etc/GMT+14", "Nope/Zone", "", "../etc/passwd",
     "posix/Europe/Berlin", "EST5EDT", 5, "\x00"])
SCHEDULE_OPTS: dict[str, st.SearchStrategy[Any]] = {
    "jitter_ms": ints_around(0, MAX_DELAY),
    "misfire": st.sampled_from(["skip", "run_once", "catch_up:3", "catch_up:0", "catch_up:1001",
                                "catch_up:", "RUN_ONCE", 1, None]),
    **{k: OPTIONS[k] for k in ("max_attempts", "backoff", "timeout_ms", "priority", "rate_limit",
                               "concurrency_key", "concurrency_limit", "start_within_ms")},
}
whens = st.one_of(
    st.fixed_dictionaries({"cron": st.sampled_from(["0 9 * * *", "*/5 * * * * *", "30 2 * * sun"]),
                           "tz": st.sampled_from([None, "Europe/Berlin", "Australia/Lord_Howe"])}),
    st.fixed_dictionaries({"every_ms": st.integers(1, MAX_DELAY)}),
    st.fixed_dictionaries({"cron": crons, "tz": zones}),
    st.fixed_dictionaries({"every_ms": st.none() | ints_around(1, MAX_DELAY)}),
    st.fixed_dictionaries({"every_ms": ints_around(1, MAX_DELAY), "cron": crons}),
    st.fixed_dictionaries({"every_ms": ints_around(1, MAX_DELAY), "tz": zones}),
)
# fmt: on


@FUZZ
@given(
    name=st.sampled_from(["s-base", "s-new"]) | st.sampled_from(["", ".", "a b", "x" * 65, 5]),
    task=st.just("t") | tasks,
    payload=st.just({"ok": 1}) | st.just([1.5, "é", None]) | payloads,
    when=whens,
    opts=some_of(SCHEDULE_OPTS, 3),
)
def test_schedule_defines_exactly_or_refuses_typed_and_changes_nothing(
    c: redis.Redis, name: Any, task: Any, payload: Any, when: dict[str, Any], opts: dict[str, Any]
) -> None:
    q = fresh(c)
    before = snapshot(c)
    try:
        answer = q.schedule(name, task, payload, **when, **opts)
    except Exception as exc:
        check_refusal(exc, before, c, q)
        return
    event(f"schedule {answer}")
    assert answer in ("created", "updated", "unchanged")
    base_intact(q)
    sch = q.get_schedule(name)
    assert (sch.task, sch.payload()) == (task, json_form(payload))
    if sch.pending:
        assert claim_payloads(q, c, [sch.pending])[sch.pending] == json_form(payload)


# --- the CLI: `scheduler enqueue` ------------------------------------------------------------
# fmt: off
CLI_OPTS: dict[str, st.SearchStrategy[str]] = {
    "--in": st.sampled_from(["30s", "0s", "-5s", "1x", "9999999999d", "", "1h30m", "\uff11s"]),
    "--at": st.sampled_from(["2030-01-01T00:00:00Z", "2030-01-01T00:00:00", "garbage",
                             "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00",
                             "2200-01-01T00:00:00.001Z", "2030-01-01T00:00:00+23:59"]),
    "--start-within": st.sampled_from(["1ms", "0s", "1h", "4000d"]),
    "--jitter": st.sampled_from(["0s", "1s", "3651d", "-1s"]),
    "--key": st.sampled_from(["k-base", "k-new", "", "x" * 513]),
    "--job-id": st.sampled_from(["base-1", "cli-1", "schedule:x", "..", "a b", ""]),
    "--after": st.sampled_from(["base-p", "missing", "a b"]),
    "--max-attempts": st.sampled_from(["1", "0", "1000001", "x", "1e3"]),
    "--timeout-ms": st.sampled_from(["0", "604800001", "-1", "1.5"]),
    "--backoff": st.sampled_from(["1000,2,3600000,0.25", "1,0.5,1,0", "a,b,c,d", "1,2,3,2"]),
    "--priority": st.sampled_from(["0", "9", "10", "-1", "x"]),
    "--concurrency-key": st.sampled_from(["ck", "a b"]),
    "--concurrency-limit": st.sampled_from(["1", "0", "10001"]),
    "--rate-limit": st.sampled_from(["10/1s", "0/1s", "x", "1/0s"]),
}
cli_payloads = st.sampled_from(
    ['{"ok": 1}', "null", '[1, 2.5, "é"]', "NaN", "1e400", '"\\ud800"', "{", "", "9" * 5000,
     "[" * 2000 + "]" * 2000, "-0.0", "1E+2", '{"a": {"b": [true, false, null]}}'])
# fmt: on


@FUZZ
@given(
    task=st.sampled_from(["t", "t", "a b", "", "x" * 201]),
    payload=cli_payloads,
    opts=some_of(CLI_OPTS, 3),
    flags=st.lists(st.sampled_from(["--debounce", "--keep-payload"]), max_size=2, unique=True),
)
def test_cli_enqueue_accepts_exactly_or_exits_with_one_line_and_changes_nothing(
    url: str, c: redis.Redis, task: str, payload: str, opts: Any, flags: list[str]
) -> None:
    q = fresh(c)
    before = snapshot(c)
    args = ["enqueue", "--url", url, "-q", QNAME, "--json", task, "--payload", payload]
    args += [x for kv in opts.items() for x in kv] + flags
    result = CliRunner().invoke(main, args)
    if result.exit_code != 0:
        event(f"cli exit {result.exit_code}")
        assert isinstance(result.exception, SystemExit), (result.exception, result.output)
        assert result.exit_code in (1, 2), result.output
        after = snapshot(c)
        assert after == before, _diff(before, after)
        return
    job_id = json.loads(result.stdout)["id"]
    api = {"after": opts.get("--after"), "key": opts.get("--key"),
           "debounce": "--debounce" in flags or None,
           "start_within_ms": opts.get("--start-within")}  # fmt: skip
    check_accepted(q, c, job_id, json.loads(payload), api, before)


# --- a key edited by hand in redis-cli, then a producer's call ---------------------------------
# dead:migrating is left out here: see the findings below.
EDITABLE = ["due", "leased", "dead", "wake", "config", "flow:held", "flow:waiting", "flow:rheld",
            "flow:levels", "flow:pdue:3", "flow:children:base-p", "job:base-p", "job:base-1",
            "spec:base-p", "spec:base-2", "idem:K", "schedule:s-base", "schedules", "flow:ck:ck",
            "flow:rate:rk"]  # fmt: skip
EDITS = {
    "string": lambda c, k: c.set(k, "edited"), "list": lambda c, k: c.rpush(k, "a", "b"),
    "set": lambda c, k: c.sadd(k, "a"), "hash": lambda c, k: c.hset(k, "f", "v"),
    "hash-state": lambda c, k: c.hset(k, mapping={"state": "bogus", "task": "t"}),
    "hash-kids": lambda c, k: c.hset(k, mapping={"state": "due", "kids": "x", "task": "t"}),
    "zset": lambda c, k: c.zadd(k, {"a": 1.0, "inf": math.inf}),
}  # fmt: skip
producer_calls = st.sampled_from(
    [("enqueue", {}), ("enqueue", {"after": ["base-p"]}), ("enqueue", {"key": "k-base"}),
     ("enqueue", {"key": "k-base", "debounce": True}), ("enqueue", {"priority": 3}),
     ("enqueue", {"concurrency_key": "ck", "concurrency_limit": 1}),
     ("enqueue", {"rate_limit": "1/s", "rate_key": "rk"}), ("enqueue", {"job_id": "base-p"}),
     ("enqueue", {"start_within_ms": 1_000}), ("many", {}), ("many", {"after": ["base-p"]}),
     ("schedule", {"every_ms": 30_000}), ("schedule", {"cron": "0 9 * * *"})]
)  # fmt: skip


@FUZZ
@given(
    edits=st.lists(
        st.tuples(st.sampled_from(EDITABLE), st.sampled_from(sorted(EDITS))), max_size=2
    ),
    call=producer_calls,
)
def test_a_producer_call_after_a_hand_edit_refuses_typed_and_loses_nothing(
    c: redis.Redis, edits: list[tuple[str, str]], call: tuple[str, dict[str, Any]]
) -> None:
    q = fresh(c)
    idem = "idem:" + hashlib.sha256(b"k-base").hexdigest()
    edited = {q.keys.prefix + (idem if n == "idem:K" else n): kind for n, kind in edits}
    for key, kind in edited.items():
        c.delete(key)
        EDITS[kind](c, key)
    before = snapshot(c)
    what, opts = call
    try:
        if what == "enqueue":
            q.enqueue("t", {"new": 1}, **opts)
        elif what == "many":
            q.enqueue_many([JobSpec("t", {"a": 1}), JobSpec("t", {"b": 2}, **opts)])
        else:
            q.schedule("s-base", "t", {"redefined": 1}, **opts)
    except Exception as exc:
        check_refusal(exc, before, c, None)  # (an edited job is doctor's to read)
        return
    # Nothing accepted before is lost: each base job's record and its place are still there.
    for jid in BASE:
        for key in (q.keys.spec(jid), q.keys.job(jid)):
            assert key not in before or key in edited or c.exists(key), key
        if q.keys.due not in edited and before.get(q.keys.spec(jid)):
            placed = c.zscore(q.keys.due, jid) is not None or c.zscore(q.keys.flow_held, jid)
            assert placed is not None, jid


# --- findings ---------------------------------------------------------------------------------
# A queue that never had a dead job has no `dead` key. A stray `dead:migrating` of another type
# (the ZSET an old dead LIST is converted through, lua/lib/job.lua dead_migrate) is then RENAMEd
# onto `dead` by the first script that touches the dead key ("LLEN dead" of a missing key is 0),
# which then fails on WRONGTYPE: half a transition written, then CorruptKey. (The wrong-type
# matrix, tests/test_wrong_type_matrix.py, edits it in a world whose `dead` ZSET exists.)
def test_a_park_beside_a_stray_dead_migrating_key_loses_no_job(c: redis.Redis) -> None:
    q = fresh(c)
    assert not c.exists(q.keys.dead)
    c.set(q.keys.dead_migrating, "edited by hand")
    (job,) = q.claim("w", limit=1).jobs
    before = snapshot(c)
    try:
        q.fail(job.id, job.token, ("E", "boom", ""), retryable=False)
    except SchedulerError:
        after = snapshot(c)
        assert after == before, _diff(before, after)  # "nothing written", as CorruptKey says
    else:
        assert c.zscore(q.keys.dead, job.id) is not None


def test_reading_counts_beside_a_stray_dead_migrating_key_leaves_the_queue_working(
    c: redis.Redis,
) -> None:
    q = fresh(c)
    c.set(q.keys.dead_migrating, "edited by hand")
    assert len(q.claim("w", limit=1).jobs) == 1  # the stray key is no obstacle to a claim
    before = snapshot(c)
    with contextlib.suppress(SchedulerError):
        q.counts()  # `scheduler status`, the dashboard's overview
    after = snapshot(c)
    assert after == before, _diff(before, after)
    assert len(q.claim("w", limit=1).jobs) == 1


@pytest.mark.parametrize("old_list", [False, True], ids=["no-dead", "old-dead-list"])
def test_doctor_names_a_stray_dead_migrating_key(c: redis.Redis, old_list: bool) -> None:
    """Doctor names the stray key (an error: an old dead LIST is not converted through it),
    and its conversion step is not run beside it (check_queue raised CorruptKey there)."""
    from scheduler.admin.doctor import check_queue

    q = fresh(c)
    if old_list:
        c.rpush(q.keys.dead, "j-old")
    c.set(q.keys.dead_migrating, "edited by hand")
    found = [i for i in check_queue(c, q.name) if i.code == "wrong-type"]
    assert any("dead:migrating" in i.message for i in found), found
    assert c.type(q.keys.dead) == ("list" if old_list else "none")  # left for the operator
    c.delete(q.keys.dead_migrating)  # the finding's fix: then the old LIST converts
    check_queue(c, q.name)
    assert c.type(q.keys.dead) == ("zset" if old_list else "none")


def test_cli_payload_with_a_repeated_key_is_refused_not_half_stored(
    url: str, c: redis.Redis
) -> None:
    q = fresh(c)
    before = snapshot(c)
    args = ["enqueue", "--url", url, "-q", QNAME, "t", "--payload", '{"n": 1, "n": 2}']
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert snapshot(c) == before
    base_intact(q)


# Typed tasks (payload_type): "checked at enqueue (BadArgument, nothing enqueued)" (README).
@dataclasses.dataclass
class WithAny:
    user: int
    extra: Any = None


class TypedWithAny(TypedDict):
    user: int
    extra: Any


@pytest.mark.parametrize("kind", ["dataclass", "typeddict"])
def test_a_payload_type_with_an_any_field_takes_its_payloads(c: redis.Redis, kind: str) -> None:
    tp: Any = WithAny if kind == "dataclass" else TypedWithAny
    handle = Registry().task("typed.any", payload_type=tp)(lambda p, ctx: None)
    q = fresh(c)
    value = WithAny(7, {"a": [1]}) if kind == "dataclass" else {"user": 7, "extra": {"a": [1]}}
    job_id = handle.enqueue(q, value)
    assert claim_payloads(q, c, [job_id])[job_id] == {"user": 7, "extra": {"a": [1]}}
    decode_payload(tp, {"user": 7, "extra": None})  # the worker's decode, before the handler


def test_a_typeddict_payload_with_mixed_unknown_keys_is_refused_typed(c: redis.Redis) -> None:
    class Reminder(TypedDict):
        user: int

    handle = Registry().task("typed.td", payload_type=Reminder)(lambda p, ctx: None)
    q = fresh(c)
    before = snapshot(c)
    with pytest.raises(SchedulerError):
        handle.enqueue(q, {"user": 1, 2: "b", "note": "x"})
    assert snapshot(c) == before


class Model(BaseModel):
    user: int
    extra: Any = None


@dataclasses.dataclass
class Plain:
    user: int
    extra: object = None


@pytest.mark.parametrize("tp", [Plain, Model], ids=["dataclass", "pydantic"])
def test_a_typed_payload_holding_no_json_value_is_refused_typed(c: redis.Redis, tp: Any) -> None:
    handle = Registry().task("typed.lock", payload_type=tp)(lambda p, ctx: None)
    q = fresh(c)
    with pytest.raises(SchedulerError):  # a plain task's: InvalidPayload
        q.enqueue("plain", {"user": 1, "extra": threading.Lock()})
    before = snapshot(c)
    with pytest.raises(SchedulerError):
        handle.enqueue(q, tp(user=1, extra=threading.Lock()))
    assert snapshot(c) == before
