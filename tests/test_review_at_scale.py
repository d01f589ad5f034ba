"""Operator and client operations on a large queue (a review of their cost at scale).

Redis runs one command or script at a time: a single call that grows with the queue holds every
producer and worker of every queue on that server for its run. Each test builds its own queue
on the module's private server and reads SLOWLOG (threshold 0: every command, the scripts' own
commands too) for the most entries one call touched: a ZRANGE BYSCORE ... LIMIT o n steps over
o entries from the start of its score range and returns n, one by rank returns its range, an
SMEMBERS the whole set. Those counts are structural (no timing), so the tests do not flake on a
loaded machine; the durations measured at 200,000 jobs (a private server on the shared 2-core
machine) are in the docstrings. Client memory is the tracemalloc peak of a command at two sizes,
ten times apart, as tests/test_queue_move_memory.py measures a move (held to the same rule:
a command that can page must not hold the queue in memory)."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result
from starlette.testclient import TestClient

from scheduler import JobSpec, Queue
from scheduler.cli.main import main
from scheduler.core.connection import connect
from scheduler.dashboard import Auth, create_app
from scheduler.operations.dead_letters import scored_pairs
from tests.redis_server import RedisProcess

UNBOUNDED = 1 << 62  # a read with no bound of its own (a whole set, a range with no LIMIT)
PAGE = 1_000  # the page of the CLI's paged reads (job_select._PAGE, scan_dead's page)
# The most entries one call of a paged read may touch, whatever the queue's size: two pages
# and their slack, with room to spare. Each failing case below touches the whole queue.
CALL_BOUND = 5 * PAGE
TIES = 20_000  # jobs of one run time
FAN_OUT = 20_000  # waiting children of one parent
SMALL, LARGE = 2_000, 20_000  # the two sizes of the memory comparisons


@pytest.fixture(scope="module")
def server(module_server: RedisProcess) -> Iterator[RedisProcess]:
    c = redis.Redis.from_url(module_server.url)
    c.flushall()
    c.close()
    yield module_server


@pytest.fixture
def raw(server: RedisProcess) -> Iterator[redis.Redis]:
    """Bytes replies: SLOWLOG entries as Redis wrote them."""
    c = redis.Redis.from_url(server.url)
    yield c
    c.close()


@pytest.fixture
def client(server: RedisProcess) -> Iterator[redis.Redis]:
    c = connect(server.url)
    yield c
    c.close()


Run = Callable[..., Result]


@pytest.fixture
def cli(server: RedisProcess) -> Run:
    runner = CliRunner(env={"COLUMNS": "200"})

    def run(*args: str) -> Result:
        return runner.invoke(main, [*args, "--url", server.url], catch_exceptions=False)

    return run


@dataclass
class Log:
    entries: list[list[str]] = field(default_factory=list)  # every command, scripts' own too
    sent: int = 0  # the commands clients sent (a script's own run as the client '?')


@contextmanager
def slowlog(raw: redis.Redis) -> Iterator[Log]:
    """Every command the server ran inside the block, as argument lists."""
    raw.config_set("slowlog-max-len", 1_000_000)
    raw.config_set("slowlog-log-slower-than", 0)
    raw.slowlog_reset()
    out = Log()
    try:
        yield out
    finally:
        raw.config_set("slowlog-log-slower-than", 10_000)
        log = raw.slowlog_get(1_000_000)
        raw.slowlog_reset()
    for e in log:
        args = e["command"].decode(errors="replace").split(" ")
        if args[0].upper() not in ("SLOWLOG", "CONFIG"):
            out.entries.append(args)
            out.sent += not e["client_address"].startswith(b"?")


def zrange_span(args: list[str]) -> int:
    """How many entries one ZRANGE steps over or returns: a BYSCORE / BYLEX range its LIMIT's
    offset plus count (Redis steps over the offset one entry at a time), a rank range its
    length (reached by rank, in log time)."""
    up = [a.upper() for a in args]
    if "LIMIT" in up:
        i = up.index("LIMIT")
        offset, count = int(args[i + 1]), int(args[i + 2])
        return UNBOUNDED if count < 0 else offset + count
    if "BYSCORE" in up or "BYLEX" in up:
        return UNBOUNDED
    start, stop = int(args[2]), int(args[3])
    return stop - start + 1 if start >= 0 and stop >= 0 else UNBOUNDED


WHOLE = ("SMEMBERS", "HGETALL", "HKEYS", "HVALS", "SINTER", "SUNION", "SDIFF", "LRANGE")


def widest(log: Log, key: str, sizes: dict[str, int] | None = None) -> tuple[int, str]:
    """The most entries of `key` one call touched, and that call: a ZRANGE by its span, a
    whole-collection read by the collection's size before the operation (`sizes`)."""
    most, which = 0, ""
    for args in log.entries:
        if len(args) < 2 or args[1] != key:
            continue
        name, n = args[0].upper(), 0
        if name in ("ZRANGE", "ZREVRANGE"):
            n = zrange_span(args)
        elif name in WHOLE:
            n = (sizes or {}).get(key, UNBOUNDED)
        if n > most:
            most, which = n, " ".join(args)
    return most, which


def enqueue(q: Queue, n: int, **options: Any) -> list[str]:
    ids: list[str] = []
    for i in range(0, n, 10_000):
        specs = [JobSpec("mail.send", {"n": j}, **options) for j in range(i, min(n, i + 10_000))]
        ids += q.enqueue_many(specs)
    return ids


def due_at_one_time(q: Queue, n: int) -> list[str]:
    """`n` jobs due now that share one run time (a campaign enqueued for 09:00, now past)."""
    return enqueue(q, n, run_at=datetime.now(UTC) - timedelta(minutes=1))


def dead_jobs(q: Queue, n: int) -> None:
    """`n` dead letters the quick way: one attempt each, leases of 1 ms lapsed and reaped."""
    enqueue(q, n, max_attempts=1)
    while q.claim("w1", limit=1_000, lease_ms=1, reap_limit=0).jobs:
        pass
    while q.counts().leased:
        q.claim("w1", limit=0, reap_limit=500)
    assert q.counts().dead == n


def peak_bytes(run: Callable[[], Result]) -> int:
    """The client's peak of traced memory while `run` runs, above what was traced before."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        done = run()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert done.exit_code == 0, done.output
    return peak


def grows_with_the_queue(make: Callable[[int], str], run: Callable[[str], Result]) -> str:
    """Run the command on a queue of SMALL and of LARGE jobs (after a warm-up on an empty one:
    imports done) and say how its memory peaks compare; '' when it stays flat (under 3x for
    a queue 10x larger)."""
    names = {n: make(n) for n in (0, SMALL, LARGE)}
    run(names[0])
    small = peak_bytes(lambda: run(names[SMALL]))
    large = peak_bytes(lambda: run(names[LARGE]))
    if large < 3 * small:
        return ""
    per_job = (large - small) / (LARGE - SMALL)
    return f"peak {small:,} B at {SMALL:,} jobs, {large:,} B at {LARGE:,}: {per_job:.0f} B a job"


# -- defects: one server call that grows with the queue ----------------------------------------
def test_cancel_by_state_steps_over_a_bounded_part_of_jobs_that_share_a_run_time(
    client: redis.Redis, raw: redis.Redis, cli: Run
) -> None:
    """A campaign enqueued for one instant has one score in the due set. `waiting()` resumes
    each page at the cursor's score with an offset of the ids of that score already read, so
    page k steps over k * 1,000 entries: one call grows with the queue and the pages with its
    square. At 200,000 jobs of one run time, nothing running: the longest ZRANGE 20-24 ms
    (LIMIT 119936 1064), 201 of them holding Redis 1.5 s in all before a job is cancelled."""
    q = Queue(client, "ties-idle")
    due_at_one_time(q, TIES)
    with slowlog(raw) as log:  # --task: every id read, none cancelled (a lighter log)
        done = cli("jobs", "cancel", "-q", q.name, "--state", "due", "--task", "x", "--yes")
    assert done.exit_code == 0, done.output
    most, call = widest(log, q.keys.due)
    assert most <= CALL_BOUND, call


def test_cancel_by_state_beside_a_claiming_worker_reads_no_call_of_the_whole_run_time(
    client: redis.Redis, raw: redis.Redis, cli: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker claiming the same jobs (the lowest ids of the score first) takes more than the
    64-id slack between two pages, and the fallback reads `ties + 1,000` entries in one call.
    At 200,000 jobs of one run time, 100 claimed between pages: single ZRANGEs of 82,000 to
    141,000 entries at 96-103 ms each (`LIMIT 0 141000 WITHSCORES`), 7.2 s of Redis in all,
    31 s for the read."""
    q = Queue(client, "ties-busy")
    due_at_one_time(q, TIES)

    def claimed_meanwhile(reply: Any) -> Any:
        got = scored_pairs(reply)
        q.claim("w1", limit=100, lease_ms=600_000)  # a worker's claim between two pages
        return got

    monkeypatch.setattr("scheduler.cli.job_select.scored_pairs", claimed_meanwhile)
    with slowlog(raw) as log:
        done = cli("jobs", "cancel", "-q", q.name, "--state", "due", "--task", "x", "--yes")
    assert done.exit_code == 0, done.output
    most, call = widest(log, q.keys.due)
    assert most <= CALL_BOUND, call


def test_cancelling_one_parent_reads_neither_its_whole_fan_out_nor_each_child(
    client: redis.Redis, raw: redis.Redis, cli: Run
) -> None:
    """A parent with many waiting children (enqueue(after=[p]): a fan-out, whose end the
    scripts work off 300 children a call) is cancelled by id. `children_first` reads its
    children SET whole and then every child's own, only to put a child given with it first.
    At 200,000 children: one SMEMBERS of 55 ms, about 200,000 commands sent, 12 s and 50 MB of
    client memory to cancel one id (the cancel script itself: 16 ms)."""
    q = Queue(client, "fan-out")
    parent = q.enqueue("report.build", None, delay_ms=3_600_000)
    enqueue(q, FAN_OUT, after=[parent])
    children = f"{q.keys.prefix}flow:children:{parent}"
    sizes = {children: int(client.scard(children))}
    assert sizes[children] == FAN_OUT
    with slowlog(raw) as log:
        done = cli("jobs", "cancel", "-q", q.name, parent, "--yes", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["jobs"] == {parent: "scheduled"}
    assert q.get_job(parent).state == "cancelled"
    most, call = widest(log, children, sizes)
    assert most <= PAGE, f"{call} ({most} members)"
    assert log.sent <= 100, f"{log.sent} commands sent to cancel one id"


# -- defects: client memory that grows with the queue -----------------------------------------
def test_doctor_memory_does_not_grow_with_the_queue(client: redis.Redis, cli: Run) -> None:
    """Each check could read a page at a time (a SCAN page of job keys against ZMSCORE of the
    places; a ZSCAN page of a place against EXISTS of the records). Measured: 350-400 B a job
    (1.6 MB peak at 4,000 due jobs, 14.3 MB at 40,000), so a 10-million-job queue needs about
    4 GB; 200,000 due + 200,000 scheduled + 100,000 dead: 162 MB peak (76 s under
    tracemalloc)."""

    def make(n: int) -> str:
        enqueue(Queue(client, f"doctor-{n}"), n)
        return f"doctor-{n}"

    why = grows_with_the_queue(make, lambda name: cli("doctor", "-q", name, "--no-server"))
    assert not why, why


def test_cancel_by_state_memory_does_not_grow_with_the_jobs_it_cancels(
    client: redis.Redis, cli: Run
) -> None:
    """Due and scheduled jobs could be cancelled a page at a time as they are read (the
    cursor already resumes past the ids read). About 130-210 B a job; at 200,000 scheduled
    jobs with a --task that matches none: 24.5 MB peak and 65 s, none cancelled."""

    def make(n: int) -> str:
        enqueue(Queue(client, f"cancel-{n}"), n)
        return f"cancel-{n}"

    why = grows_with_the_queue(
        make, lambda name: cli("jobs", "cancel", "-q", name, "--state", "due", "--yes")
    )
    assert not why, why


def test_dead_purge_memory_does_not_grow_with_the_dead_list(client: redis.Redis, cli: Run) -> None:
    """The confirmation's count is one ZCOUNT without a task / error filter (a counting scan
    with one) and the purge could go a page at a time below a cutoff (as the dashboard's
    `upto_ms`). Measured: 160-170 B a dead job (0.9 MB peak at 4,000, 6.9 MB at 40,000)."""

    def make(n: int) -> str:
        dead_jobs(Queue(client, f"purge-{n}"), n)
        return f"purge-{n}"

    why = grows_with_the_queue(make, lambda name: cli("dead", "purge", "-q", name, "--yes"))
    assert not why, why


def test_dead_requeue_memory_does_not_grow_with_the_dead_list(
    client: redis.Redis, cli: Run
) -> None:
    """450-530 B a dead job (6.5 MB peak at 5,000, 26.6 MB at 50,000; 55 MB at 100,000):
    the selection and the whole pipeline of `parents` reads are in memory at once. The
    parents-first order could be kept on disk as `queue move` keeps its ledger."""

    def make(n: int) -> str:
        dead_jobs(Queue(client, f"requeue-{n}"), n)
        return f"requeue-{n}"

    why = grows_with_the_queue(make, lambda name: cli("dead", "requeue", "-q", name, "--yes"))
    assert not why, why


# -- checked and found bounded ----------------------------------------------------------------
def test_read_only_commands_and_pages_touch_a_bounded_part_of_a_large_queue(
    client: redis.Redis, raw: redis.Redis, cli: Run
) -> None:
    """Every listing, count and filtered scan an operator runs on a queue of 15,000 due,
    15,000 scheduled and 15,000 dead jobs reads its pages: no call touches more than a few
    pages of the due or dead set, whatever their size (a filter that matches nothing scans
    the whole dead list in pages). At 200,000 of each the longest call was under 5 ms
    (a SCAN or dead_match page), for stats, keys, jobs list, dead list, requeue / purge with
    --task, pause, resume and the dashboard's queue and dead pages."""
    q = Queue(client, "bounded")
    n = 15_000
    dead_jobs(q, n)
    enqueue(q, n)
    enqueue(q, n, delay_ms=3_600_000)
    runs = [
        ("stats", "-q", q.name, "--json"),
        ("keys", "-q", q.name, "--json"),
        ("jobs", "list", "-q", q.name, "--limit", "1000"),
        ("jobs", "list", "-q", q.name, "--state", "scheduled", "--limit", "1000"),
        ("jobs", "list", "-q", q.name, "--state", "dead", "--limit", "1000"),
        ("dead", "list", "-q", q.name, "--limit", "1000"),
        ("dead", "list", "-q", q.name, "--task", "x", "--json"),
        ("dead", "list", "-q", q.name, "--older-than", "1h", "--json"),
        ("dead", "requeue", "-q", q.name, "--task", "x", "--yes"),
        ("dead", "purge", "-q", q.name, "--error-type", "x", "--yes"),
        ("pause", "-q", q.name),
        ("resume", "-q", q.name),
    ]
    with slowlog(raw) as log:
        for args in runs:
            done = cli(*args)
            assert done.exit_code == 0, (args, done.output)
        web = TestClient(create_app(client=client, auth=Auth()), raise_server_exceptions=False)
        for path in ("", "?state=scheduled", "?state=dead", "?task=x", "/dead", "/dead?task=x"):
            page = web.get(f"/queues/{q.name}{path}")
            assert page.status_code == 200, (path, page.text[:300])
    for key in (q.keys.due, q.keys.dead):
        most, call = widest(log, key)
        assert 0 < most <= CALL_BOUND, call
    c = q.counts()
    assert (c.due, c.scheduled, c.dead) == (n, n, n)  # nothing matched: nothing changed
