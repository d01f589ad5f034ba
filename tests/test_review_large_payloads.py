"""Jobs whose payload (or result) is near the size limit, end to end (a review).

`codec.MAX_PAYLOAD_BYTES` lets every payload and result be 512 KiB. Redis runs one script at a
time, so a call whose work grows with the bytes it moves holds every client of the server (the
other queues' workers and their heartbeats too) for as long as it copies them; a client that
reads whole job records for a page that shows none of their payloads holds them all at once.

Each test uses the module's private redis-server. Script calls are read from SLOWLOG (threshold
0: every command, the scripts' own commands too; an argument list past 32 ends with
'... (N more arguments)'), so what a call carried is counted, not timed: the durations measured
on this 2-core shared machine are in the docstrings and the xfail reasons. Client memory is the
tracemalloc peak of one command or page. The documented per-call figures are docs/limits.md
("Fixed limits and costs") and docs/performance.md sections 39-41: a claim of 100 about 4 ms,
of 1,000 about 33 ms; requeue / purge of 500 dead letters at most 22 ms; the asyncio batcher's
calls at most 1,000 jobs and 1 MiB (section 38 of the same file)."""

from __future__ import annotations

import asyncio
import json
import threading
import tracemalloc
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from starlette.testclient import TestClient

import scheduler.worker.dispatch as dispatch
from scheduler import AsyncQueue, JobSpec, Queue, Registry
from scheduler.cli.main import main
from scheduler.client import enqueue_batcher
from scheduler.core import codec
from scheduler.core.connection import connect, connect_async
from scheduler.core.scripts import Scripts
from scheduler.dashboard import Auth, create_app
from scheduler.worker import Worker, WorkerSettings
from tests.embedded_worker import run_until
from tests.redis_server import RedisProcess

KIB, MIB = 1024, 1024 * 1024
LIMIT = codec.MAX_PAYLOAD_BYTES  # 512 KiB: the largest payload and result
# The most payload (or result) text one script call may carry before it is a stall for every
# client: generous on purpose. The asyncio batcher holds an enqueue call to 1 MiB
# (client/enqueue_batcher.py MAX_BYTES); at the measured 8-14 ms a claimed 512 KiB ASCII
# payload (35 ms a UTF-8 one), 4 MiB is already 60-110 ms, over every documented call bound.
CALL_BYTES = 4 * MIB
N_BIG = 16  # jobs of 512 KiB each: 8 MiB, twice CALL_BYTES
# The most payload text a worker decodes on its event loop between two turns of it (no
# heartbeat goes out meanwhile): two payloads. A structured 512 KiB payload is ~25 ms of
# json decode here.
DECODE_TURN_BYTES = 2 * LIMIT
PAGE_JOBS = 50  # a listing's default page (dashboard, jobs list, dead list)
PAGE_MEMORY = 16 * MIB  # a page of 50 rows shows no payload: it needs no 25 MiB of them


def _ascii_payload() -> dict[str, str]:
    """{"d": "aaa..."} whose JSON text is exactly the limit."""
    overhead = len(codec.encode_json({"d": ""}, "payload", LIMIT))
    return {"d": "a" * (LIMIT - overhead)}


def _rows_payload() -> dict[str, list[dict[str, Any]]]:
    """A structured payload (many small objects) just under the limit: the costly kind to
    decode (~25 ms here, against ~0.6 ms for one long string)."""
    row = len(json.dumps({"id": 99999, "name": "item-99999", "qty": 6}, separators=(",", ":")))
    n = (LIMIT - 20) // (row + 1)
    return {"rows": [{"id": i, "name": f"item-{i:05d}", "qty": i % 7} for i in range(n)]}


BIG = _ascii_payload()
ROWS = _rows_payload()
assert len(codec.encode_json(BIG, "payload", LIMIT).encode()) == LIMIT
assert LIMIT - 64 * KIB < len(codec.encode_json(ROWS, "payload", LIMIT).encode()) <= LIMIT
SHA = Scripts().sha  # transition name -> its SHA1, as the clients send it (server clock)


@pytest.fixture(scope="module")
def server(module_server: RedisProcess) -> RedisProcess:
    return module_server


@pytest.fixture
def raw(server: RedisProcess) -> Iterator[redis.Redis]:
    """Bytes replies (SLOWLOG entries as Redis wrote them), on a flushed server."""
    c = redis.Redis.from_url(server.url)
    c.flushall()
    c.config_set("slowlog-log-slower-than", 10_000)
    yield c
    c.flushall()
    c.close()


@pytest.fixture
def client(server: RedisProcess, raw: redis.Redis) -> Iterator[redis.Redis]:
    """The scripts loaded first: a call's NOSCRIPT would be logged as one more call."""
    c = connect(server.url)
    Queue(c, "preload").preload()
    yield c
    c.close()


@pytest.fixture
def q(client: redis.Redis) -> Queue:
    return Queue(client, "lp-" + uuid.uuid4().hex[:10])


@dataclass
class Entry:
    args: list[bytes]  # as logged: at most 32, an argument past 128 bytes cut
    total: int  # how many arguments the command had
    inner: bool  # run by a script (client '?'), not sent by a client


@contextmanager
def logged(raw: redis.Redis) -> Iterator[list[Entry]]:
    """Every command the server ran inside the block, oldest first."""
    raw.config_set("slowlog-max-len", 1_000_000)
    raw.config_set("slowlog-log-slower-than", 0)
    raw.slowlog_reset()
    out: list[Entry] = []
    try:
        yield out
    finally:
        raw.config_set("slowlog-log-slower-than", 10_000)
        got = raw.execute_command("SLOWLOG", "GET", 1_000_000)  # type: ignore[no-untyped-call]
        raw.slowlog_reset()
    for e in reversed(got):
        args, total = list(e[3]), len(e[3])
        last = args[-1]
        if last.startswith(b"... (") and last.endswith(b" more arguments)"):
            total = len(args) - 1 + int(last[5:].split(b" ")[0])
        if args[0].upper() not in (b"SLOWLOG", b"CONFIG"):
            out.append(Entry(args, total, e[4].startswith(b"?")))


def calls(log: list[Entry], script: str) -> list[Entry]:
    """The client-sent calls of one transition."""
    sha = SHA[script].encode()
    return [e for e in log if not e.inner and e.args[0] == b"EVALSHA" and e.args[1] == sha]


def enqueue_big(q: Queue, n: int, payload: Any = BIG, **options: Any) -> list[str]:
    """n jobs of `payload`, two per call (the calls are not what these tests look at)."""
    return q.enqueue_many([JobSpec("lp.big", payload, **options) for _ in range(n)], batch_size=2)


def claim_all(q: Queue, n: int, **options: Any) -> list[Any]:
    jobs: list[Any] = []
    for _ in range(n):
        if len(jobs) >= n:
            break
        jobs += q.claim("lp-w", limit=min(2, n - len(jobs)), **options).jobs
    assert len(jobs) == n
    return jobs


def dead_big(q: Queue, n: int) -> list[str]:
    """n dead letters of 512 KiB payloads: one attempt each, failed for good."""
    ids = enqueue_big(q, n, max_attempts=1)
    for job in claim_all(q, n, lease_ms=600_000):
        q.fail(job.id, job.token, ("ValueError", "no", ""), retryable=False)
    assert q.counts().dead == n
    return ids


# --- script calls ------------------------------------------------------------------------------


def test_a_claim_hands_big_payloads_out_in_replies_bounded_by_bytes(q: Queue) -> None:
    """A worker's default batch_size is 100: at 512 KiB each, one claim call is a 50 MiB reply.
    Measured here (SLOWLOG): the claim of 100 ASCII payloads ran 944 ms in one call, of 100
    UTF-8 ones 4,231 ms, against the documented ~4 ms of a claim of 100. Two costs per job
    grow with its bytes: the copy into the reply, and lua/lib/utf8.lua `is_utf8`, whose "one
    C-level scan" is a Lua pattern match (`string.find(s, '[\\128-\\255]')`, ~15 ns a byte:
    ~8 ms per 512 KiB) and, for non-ASCII text, seven `gsub` passes (~34 ms per 512 KiB).
    Every other client of the server (other workers' heartbeats included) waits for it."""
    ids = enqueue_big(q, N_BIG)
    first = q.claim("lp-w", limit=N_BIG, lease_ms=600_000)
    sizes = [len(j.payload_json.encode()) for j in first.jobs]
    got = {j.id for j in first.jobs}
    for _ in range(N_BIG):  # a bounded reply still hands every job out, over the next claims
        if len(got) == N_BIG:
            break
        got |= {j.id for j in q.claim("lp-w", limit=N_BIG, lease_ms=600_000).jobs}
    assert got == set(ids)
    assert sum(sizes) <= CALL_BYTES, (
        f"one claim returned {len(sizes)} jobs, {sum(sizes):,} bytes of payload"
    )


def test_enqueue_many_sends_big_payloads_in_calls_bounded_by_bytes(
    q: Queue, raw: redis.Redis
) -> None:
    """operations/producing.py enqueue_many cuts `specs` into calls of batch_size (at most
    ENQUEUE_PER_CALL = 1,000 jobs), whatever their size: 1,000 payloads of 512 KiB would be a
    512 MiB call. Measured: 100 of them, one call of 195 ms (the documented enqueue bound is
    ~20 ms for 1,000 jobs). The asyncio batcher (client/enqueue_batcher.py) already closes a
    call at MAX_BYTES = 1 MiB."""
    with logged(raw) as log:
        ids = q.enqueue_many([JobSpec("lp.big", BIG) for _ in range(N_BIG)])
    assert len(set(ids)) == N_BIG and q.counts().due == N_BIG
    jobs_per_call = [int(e.args[8]) for e in calls(log, "enqueue")]
    assert sum(jobs_per_call) == N_BIG
    assert max(jobs_per_call) * LIMIT <= CALL_BYTES, f"jobs per enqueue call: {jobs_per_call}"


def test_complete_many_sends_big_results_in_calls_bounded_by_bytes(
    q: Queue, raw: redis.Redis
) -> None:
    """operations/leasing.py `_chunked` sends SETTLE_CHUNK = 250 leases a call, chosen for
    the work per lease ("500 held the server up to 87 ms"); a result may be 512 KiB, so one
    call may carry 125 MiB. The worker coalesces the completes of a round into one
    complete_many (worker/reporting.py), so a batch of handlers returning big results is
    such a call. Measured: 250 results of 512 KiB, one call of 225 ms."""
    q.enqueue_many([JobSpec("lp.small", {"n": i}) for i in range(N_BIG)])
    jobs = q.claim("lp-w", limit=N_BIG, lease_ms=600_000).jobs
    assert len(jobs) == N_BIG
    result = {"d": BIG["d"][:-40]}
    with logged(raw) as log:
        statuses = q.complete_many([(j.id, j.token, result) for j in jobs])
    assert list(statuses) == ["done"] * N_BIG
    # EVALSHA sha 5 <5 keys> result_ttl_ms, then (id, token, result) per lease
    per_call = [(e.total - 9) // 3 for e in calls(log, "complete")]
    assert sum(per_call) == N_BIG
    assert max(per_call) * LIMIT <= CALL_BYTES, f"leases per complete call: {per_call}"


def _requeue(q: Queue) -> Callable[[], None]:
    ids = dead_big(q, N_BIG)

    def act() -> None:
        assert q.requeue_dead(ids) == N_BIG
        assert q.counts().due == N_BIG

    return act


def _reap(q: Queue) -> Callable[[], None]:
    tq = Queue(q.client, q.keys.queue, _clock="test")
    tq.client.set(tq.keys.test_clock, 1_000_000)
    enqueue_big(tq, N_BIG)  # max_attempts 5, the default: kept in the spec record only
    claim_all(tq, N_BIG, lease_ms=1_000)
    tq.client.set(tq.keys.test_clock, 1_010_000)  # every lease lapsed

    def act() -> None:
        tq.claim("lp-w", limit=0, reap_limit=500)
        counts = tq.counts()
        assert (counts.due, counts.leased) == (N_BIG, 0)

    return act


@pytest.mark.parametrize("step", [_requeue, _reap], ids=["requeue_dead", "reap"])
def test_requeue_and_reap_of_big_jobs_read_no_payload(
    q: Queue, raw: redis.Redis, step: Callable[[Queue], Callable[[], None]]
) -> None:
    """Neither step needs the payload: requeue looks for a start deadline in the record's
    flags, the reaper for a max_attempts other than 5; both sit before the payload in
    `2|task|max_attempts|backoff|timeout_ms|enqueued_ms|result_ttl_ms|flags|payload`. Each
    GET copies the whole record into the script, to read a few bytes of its head.
    Measured, one call each: requeue of 200 big dead jobs 176 ms, of 500 798 ms; a claim
    reaping 300 lapsed leases of big jobs 60 ms (~100 ms for its 500 cap; the documented reap
    of 500 is 30-60 ms). A GETRANGE of the record's head (or the flags kept in the hash) is
    enough for both."""
    act = step(q)
    with logged(raw) as log:
        act()
    spec_prefix = q.keys.spec("").encode()
    whole = [e.args[1] for e in log if e.inner and e.args[0] == b"GET"
             and e.args[1].startswith(spec_prefix)]  # fmt: skip
    assert whole == [], f"{len(whole)} whole spec records read, e.g. {whole[0]!r}"


def test_queue_move_takes_big_jobs_in_steps_bounded_by_bytes(
    q: Queue, raw: redis.Redis, server: RedisProcess
) -> None:
    """`scheduler queue move` says each step is "three short scripts". move_out.lua returns
    every taken job's whole record, after `is_utf8` of each (the Lua pattern scans of the
    claim test), and move_in.lua writes them all in one call. Measured with the default batch:
    200 ASCII jobs of 512 KiB, move_out 2,235 ms and move_in 529 ms, one call each; 50 UTF-8
    ones, move_out 2,121 ms. A batch of 500 would be ~5.5 s (ASCII) or ~21 s (UTF-8) in one
    call, with 256 MiB held by the moving client in each step."""
    enqueue_big(q, N_BIG)
    dest = q.keys.queue + "-to"
    runner = CliRunner()
    with logged(raw) as log:
        done = runner.invoke(
            main,
            ["queue", "move", "--from", q.keys.queue, "--to", dest, "--url", server.url],
            catch_exceptions=False,
        )
    assert done.exit_code == 0, done.output
    assert Queue(q.client, dest).counts().due == N_BIG
    # EVALSHA sha 5 <5 keys> mode destination token, then the ids
    per_call = [e.total - 11 for e in calls(log, "move_out")]
    assert sum(per_call) >= N_BIG
    assert max(per_call) * LIMIT <= CALL_BYTES, f"ids per move_out call: {per_call}"


# --- the worker --------------------------------------------------------------------------------


def test_a_worker_decodes_a_bounded_amount_of_payload_per_turn_of_its_loop(
    q: Queue, server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claiming._take starts each job of the reply in one call, and Dispatch._prepare decodes
    its payload there (`load_stored`), for a sync handler too, whose result is encoded in its
    own thread so that "an outsized one holds no other job's beat". A structured 512 KB
    payload is ~25 ms of decode here. Measured: a worker with lease_ms 3,000, heartbeat_ms
    1,000 (valid: lease >= 3 heartbeats), concurrency 101 and batch_size 100, another worker
    claiming beside it: each claim of 100 such jobs (1.4 s in Redis) was followed by a 2.8 s
    stall of the loop, so every lease of the batch had lapsed and been reaped before its run
    ended: 100 `stale` outcomes, healthy jobs run again (and parked once their attempts,
    counted at each claim, are used up). Decoding a sync handler's payload in its thread, and
    an async one's as it starts, bounds the stall to one payload."""
    enqueue_big(q, N_BIG, payload=ROWS)
    loop_thread: list[int] = []
    turn = [0]
    decoded: Counter[int] = Counter()  # loop turn -> payload bytes decoded on the loop in it
    real = dispatch.load_stored  # type: ignore[attr-defined]

    def counting(text: str) -> Any:
        if loop_thread and threading.get_ident() == loop_thread[0]:
            decoded[turn[0]] += len(text.encode())
        return real(text)

    monkeypatch.setattr(dispatch, "load_stored", counting)
    registry = Registry()
    ran: list[str] = []
    lock = threading.Lock()

    @registry.task("lp.big")
    def handle(payload: Any, ctx: Any) -> None:
        assert len(payload["rows"]) == len(ROWS["rows"])
        with lock:
            ran.append(ctx.job_id)

    def setup(worker: Worker) -> None:
        loop = asyncio.get_running_loop()
        loop_thread.append(threading.get_ident())

        def tick() -> None:  # once per turn of the loop: what runs between two ticks is a step
            turn[0] += 1
            loop.call_soon(tick)

        loop.call_soon(tick)

    settings = WorkerSettings(queues=(q.keys.queue,), concurrency=N_BIG, batch_size=N_BIG)
    assert run_until(server.url, registry, settings, lambda: len(ran) == N_BIG, setup=setup)
    worst_turn, worst = max(decoded.items(), key=lambda kv: kv[1], default=(0, 0))
    assert worst <= DECODE_TURN_BYTES, (
        f"{worst:,} bytes of payload decoded in one step of the loop (turn {worst_turn})"
    )


# --- readers -----------------------------------------------------------------------------------


def _peak(run: Callable[[], Any]) -> tuple[int, Any]:
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = run()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return peak, out


def _cli(q: Queue, url: str, *args: str, codes: tuple[int, ...] = (0,)) -> Callable[[], str]:
    runner = CliRunner(env={"COLUMNS": "200"})

    def run() -> str:
        done = runner.invoke(main, [*args, "-q", q.keys.queue, "--url", url],
                             catch_exceptions=False)  # fmt: skip
        assert done.exit_code in codes, done.output
        return done.output

    return run


def _web(q: Queue, warm: str, path: str) -> tuple[Callable[[], str], Callable[[], str]]:
    """Two pages of one dashboard app: the warm-up compiles its templates."""
    web = TestClient(create_app(client=q.client, auth=Auth()))

    def get(at: str) -> Callable[[], str]:
        def run() -> str:
            page = web.get(f"/queues/{q.keys.queue}{at}")
            assert page.status_code == 200, page.text[:300]
            return page.text

        return run

    return get(warm), get(path)


Reads = tuple[Callable[[], str], Callable[[], str]]  # a warm-up, then the measured read
READERS: dict[str, tuple[bool, Callable[[Queue, str], Reads]]] = {
    # name: (of dead jobs?, (q, url) -> its reads)
    "dashboard queue page": (False, lambda q, u: _web(q, "?limit=1", "")),
    "dashboard dead page": (True, lambda q, u: _web(q, "/dead?limit=1", "/dead")),
    "jobs list": (
        False,
        lambda q, u: (_cli(q, u, "jobs", "list", "--limit", "1"), _cli(q, u, "jobs", "list")),
    ),
    "jobs list --task": (
        False,
        lambda q, u: (
            _cli(q, u, "jobs", "list", "--limit", "1"),
            _cli(q, u, "jobs", "list", "--task", "lp.other"),
        ),
    ),
    "dead list": (
        True,
        lambda q, u: (_cli(q, u, "dead", "list", "--limit", "1"), _cli(q, u, "dead", "list")),
    ),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_a_listing_of_big_jobs_does_not_hold_their_payloads(
    q: Queue, server: RedisProcess, reader: str
) -> None:
    """A page of jobs (50 by default, 500 at most on the dashboard, 1,000 for `jobs list`)
    shows ids, tasks, times and errors; get_jobs reads the spec record of each, so the page's
    client holds every payload twice (the reply's bytes, then the text). Measured peaks:
    dashboard queue page 51 MB (50 rows, a 16 KB page), 501 MB at limit=500; `jobs list`
    50 MB, 503 MB at --limit 500; `jobs list --task` 501 MB (it reads pages of 500 whole jobs
    to filter by task); dead list and the dead page 50 MB. The dashboard serves several
    viewers at once, and the server buffers each reply too."""
    dead, make = READERS[reader]
    if dead:
        dead_big(q, PAGE_JOBS)
    else:
        enqueue_big(q, PAGE_JOBS)
    warm, read = make(q, server.url)
    warm()  # imports, templates, the first connection
    peak, shown = _peak(read)
    assert len(shown) < MIB  # the page itself is small: no payload is shown
    assert peak <= PAGE_MEMORY, f"peak {peak:,} B listing {PAGE_JOBS} jobs of {LIMIT:,} B"


def test_doctor_reads_big_pending_records_in_pages_bounded_by_bytes(
    q: Queue, server: RedisProcess
) -> None:
    """The page was sized for 300-byte records (docs/performance.md: doctor under 1 MB of
    heap at 200k jobs); with 512 KiB payloads one page of 500 is 256 MiB in the doctor's
    process, and as much again in the server's reply buffer for it. With the largest
    `max_payload_bytes` a queue accepts (512 MiB) one page could not be held at all. Paging
    the GETs by the records' sizes (STRLEN first) bounds it."""
    enqueue_big(q, 64)  # 32 MiB of records
    # Exit 1: the test server's own finding (persistence off); the queue has none.
    doctor = _cli(q, server.url, "doctor", codes=(0, 1))
    doctor()
    peak, out = _peak(doctor)
    assert q.keys.queue not in out, out
    assert peak <= 24 * MIB, f"peak {peak:,} B checking 64 pending jobs of {LIMIT:,} B"


# --- the asyncio batcher -----------------------------------------------------------------------


def test_the_asyncio_batcher_bounds_a_call_by_bytes_not_characters(
    q: Queue, raw: redis.Redis, server: RedisProcess
) -> None:
    """docs/performance.md: concurrent AsyncQueue.enqueue callers share "one enqueue.lua call
    (at most 1,000 jobs and 1 MiB)". `_Waiting.size` is `sum(len(f) for f in fields)`: Python
    characters, so a payload of emoji or CJK text counts a quarter or a third of its bytes and
    a call carries up to 4 MiB. Counting a payload's UTF-8 bytes (its encoded length is known:
    encode_json checked it) keeps the documented bound."""
    wide = {"d": "\U0001f600" * ((LIMIT - 8) // 4)}
    assert len(codec.encode_json(wide, "payload", LIMIT).encode()) == LIMIT

    async def enqueue_at_once() -> list[str]:
        aclient = connect_async(server.url)
        try:
            aq = AsyncQueue(aclient, q.keys.queue)
            return list(await asyncio.gather(*(aq.enqueue("lp.wide", wide) for _ in range(10))))
        finally:
            await aclient.aclose()

    with logged(raw) as log:
        ids = asyncio.run(enqueue_at_once())
    assert len(set(ids)) == 10 and q.counts().due == 10
    jobs_per_call = [int(e.args[8]) for e in calls(log, "enqueue")]
    assert sum(jobs_per_call) == 10
    over = [n for n in jobs_per_call if n > 1 and n * LIMIT > enqueue_batcher.MAX_BYTES]
    assert not over, f"jobs per enqueue call: {jobs_per_call} ({LIMIT:,} bytes each)"
