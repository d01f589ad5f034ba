"""Review of the session's changes since 44401ed, read afresh: listings that read spec record
heads (client/job_listing.py, InspectingOps.heads, spec_record.spec_head), the blocking client's
result-wait slots (client/result_waiting.py `_Slots`), large payloads decoded off the worker's
loop (worker/payload_decode.py), the head reads of fail / cancel (lua/lib/job.lua) and the
`scheduler queue priority-aging` command (cli/queue_config.py).

Defects are strict xfails naming the line at fault; the rest guard what holds. Private servers
only (module_server): never the shared one."""

from __future__ import annotations

import json
import os
import shlex
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

import scheduler.worker.payload_decode as payload_decode
from scheduler import JobCancelled, JobContext, Queue, Registry
from scheduler._spawn import RedisProcess
from scheduler.admin.redis_cli import connection_flags
from scheduler.cli.main import main
from scheduler.client import job_listing, result_slots, result_waiting
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import connect
from scheduler.core.keys import QueueKeys
from scheduler.core.spec_record import HEAD_BYTES
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.payload_decode import OFF_LOOP_CHARS
from scheduler.worker.payloads import load_stored
from tests.embedded_worker import run_until
from tests.redis_server import is_cluster_run
from tests.workers.procs import wait_for

pytestmark = pytest.mark.skipif(is_cluster_run(), reason="private single servers")

registry = Registry()
called: list[str] = []  # job ids whose handler was called


@registry.task("rsd5.sync")
def sync_handler(payload: Any, ctx: JobContext) -> None:
    called.append(ctx.job_id)


@registry.task("rsd5.async")
async def async_handler(payload: Any, ctx: JobContext) -> None:
    called.append(ctx.job_id)


@pytest.fixture(autouse=True)
def _clear() -> None:
    called.clear()


@pytest.fixture
def url(module_server: RedisProcess) -> str:
    return module_server.url


@pytest.fixture
def admin(url: str) -> Iterator[redis.Redis]:
    c = connect(url)  # the CLI's kind: text replies, 'backslashreplace'
    yield c
    c.close()


def _name() -> str:
    return "rsd5-" + uuid.uuid4().hex[:10]


def _outcome(call: Any) -> Any:
    try:
        return call()
    except Exception as exc:
        return exc


# -- worker: a large payload decoded as its run starts (worker/payload_decode.py) ------------


class Gate:
    """Holds every off-loop decode (a payload of OFF_LOOP_CHARS or more) until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        real = load_stored

        def gated(text: str) -> Any:
            if len(text) >= OFF_LOOP_CHARS:
                self.entered.set()
                self.release.wait(30)  # a liveness bound: the test releases it
            return real(text)

        monkeypatch.setattr(payload_decode, "load_stored", gated)


def _stopped_while_decoding(url: str, task: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A job of `task` with a large payload whose run times out (its timer fires, it is failed
    as JobTimeout and parked: max_attempts 1) while its payload is still being decoded; the
    decode is then let finish and the worker run until the stopped run is gone."""
    q = Queue.from_url(url, _name())
    gate = Gate(monkeypatch)
    job = q.enqueue(task, {"pad": "x" * OFF_LOOP_CHARS}, timeout_ms=300, max_attempts=1)
    workers: list[Worker] = []

    def done() -> bool:
        if gate.entered.is_set() and not gate.release.is_set() and q.status(job) == "dead":
            gate.release.set()  # its outcome stored: now the decode ends
        return gate.release.is_set() and not workers[0]._abandoned

    settings = WorkerSettings(queues=(q.name,), grace_s=0)
    try:
        assert run_until(url, registry, settings, done, setup=workers.append, timeout_s=30)
        fields = q.get_job(job).fields
        assert (fields["state"], fields["last_error_type"]) == ("dead", "JobTimeout")
    finally:
        gate.release.set()
        q.close()
    return job


def test_a_sync_handler_stopped_while_its_payload_decodes_is_never_called(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _stopped_while_decoding(url, "rsd5.sync", monkeypatch)
    assert job not in called


def test_an_async_handler_stopped_while_its_payload_decodes_is_never_called(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its task, awaiting the executor's decode, is cancelled with the run."""
    job = _stopped_while_decoding(url, "rsd5.async", monkeypatch)
    assert job not in called


@pytest.mark.parametrize("task", ["rsd5.sync", "rsd5.async"])
@pytest.mark.parametrize("extra", [-1, 0])
def test_payloads_either_side_of_the_off_loop_bound_reach_their_handler_whole(
    url: str, task: str, extra: int
) -> None:
    """A payload of OFF_LOOP_CHARS - 1 characters is decoded at claim, one of OFF_LOOP_CHARS
    off the loop (multibyte text: the bound counts characters)."""
    got: list[Any] = []
    name = f"rsd5.whole.{task}.{extra}"
    if task == "rsd5.sync":

        @registry.task(name)
        def whole(payload: Any, ctx: JobContext) -> None:
            got.append(payload)
    else:

        @registry.task(name)
        async def whole_async(payload: Any, ctx: JobContext) -> None:
            got.append(payload)

    q = Queue.from_url(url, _name())
    text = "é" * (OFF_LOOP_CHARS + extra - len('{"p":""}'))
    try:
        job = q.enqueue(name, {"p": text})
        assert len(q.get_job(job).payload_json) == OFF_LOOP_CHARS + extra
        settings = WorkerSettings(queues=(q.name,), grace_s=0)
        assert run_until(url, registry, settings, lambda: bool(got))
    finally:
        q.close()
    assert got == [{"p": text}]


# -- the blocking client's result-wait slots (client/result_waiting.py) ---------------------


def _blocked(admin: redis.Redis) -> int:
    return sum("b" in str(c.get("flags", "")) for c in admin.client_list())


def test_waits_of_clients_sharing_one_pool_leave_a_connection_for_an_enqueue(
    url: str, admin: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(result_waiting, "RESULT_BLOCK_SLICE_S", 30.0)  # each BLMOVE: held long
    name = _name()
    pool = redis.ConnectionPool.from_url(url, max_connections=2)
    side = Queue(admin, name)
    waited = [side.enqueue("t", {}, delay_ms=600_000) for _ in range(2)]
    out: list[Any] = [None, None]

    def wait(k: int) -> None:  # each thread its own client on the shared pool
        out[k] = _outcome(lambda: Queue(redis.Redis(connection_pool=pool), name).result(
            waited[k], timeout_s=60))  # fmt: skip

    threads = [threading.Thread(target=wait, args=(k,)) for k in range(2)]
    for th in threads:
        th.start()
    try:
        # Both waits in place: each blocked on its BLMOVE, or one waiting for a slot.
        wait_for(
            lambda: (
                _blocked(admin) == 2
                or any(s.turns for s in list(result_slots._SYNC_SLOTS.values()))
            ),
            20,
            "both waits in place",
        )
        enqueued = _outcome(lambda: Queue(redis.Redis(connection_pool=pool), name).enqueue("t"))
    finally:
        for j in waited:
            side.cancel(j)
        for th in threads:
            th.join(60)
        pool.disconnect()
    assert [type(o) for o in out] == [JobCancelled, JobCancelled], out
    assert isinstance(enqueued, str), enqueued


def test_a_child_forked_while_a_parent_thread_holds_the_only_slot_waits_in_its_own(
    url: str, admin: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slot a parent's thread held at the fork is not the child's: its own wait reads at
    once (ResultTimeout after its timeout plus a 30 s slice if it inherited the held slot)."""
    monkeypatch.setattr(result_waiting, "RESULT_BLOCK_SLICE_S", 30.0)
    name = _name()
    q = Queue.from_url(f"{url}?max_connections=2", name)  # one wait slot
    side = Queue(admin, name)
    pending = side.enqueue("t", {}, delay_ms=600_000)
    ended = side.enqueue("t", {}, delay_ms=600_000)
    side.cancel(ended)
    out: list[Any] = []
    th = threading.Thread(
        target=lambda: out.append(_outcome(lambda: q.result(pending, timeout_s=60)))
    )
    th.start()
    try:
        slots = result_waiting._sync_slots(q.client)
        wait_for(lambda: slots.free == 0 and _blocked(admin) == 1, 20, "the parent's wait")
        pid = os.fork()
        if pid == 0:  # the child: never back into pytest
            code = 3
            try:
                try:
                    q.result(ended, timeout_s=1)
                except JobCancelled:
                    code = 0
                except BaseException:
                    code = 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    finally:
        side.cancel(pending)
        th.join(60)
        q.close()
    assert os.waitstatus_to_exitcode(status) == 0
    assert [type(o) for o in out] == [JobCancelled]


def test_ctrl_c_in_a_slot_wait_takes_the_waiter_out_and_keeps_the_slots_count(
    url: str, admin: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C lands while the wait, announced, waits for a slot another waiter holds (that one
    gives it back meanwhile): KeyboardInterrupt is raised, the waiter leaves result_wait, and
    the client's slot count is whole (later waits are not short of one)."""
    name = _name()
    q = Queue.from_url(f"{url}?max_connections=2", name)
    job = Queue(admin, name).enqueue("t", {}, delay_ms=600_000)
    key = q.keys.result_wait(job)
    slots = result_waiting._sync_slots(q.client)
    real_take = slots.take
    fired: list[bool] = []

    def interrupted(_: float | None = None) -> bool:
        slots.free += 1  # the other waiter's slot back (the lock is held here)
        raise KeyboardInterrupt

    def take(until_s: float) -> bool:
        if not fired and admin.scard(key) == 1:  # announced: the next take meets Ctrl-C
            fired.append(True)
            assert real_take(0)  # another waiter holds the only slot
            monkeypatch.setattr(slots.cond, "wait", interrupted)
            try:
                return real_take(until_s)
            finally:
                monkeypatch.undo()
        return real_take(until_s)

    monkeypatch.setattr(slots, "take", take)
    try:
        with pytest.raises(KeyboardInterrupt):
            q.result(job, timeout_s=30)
        assert fired
        assert admin.scard(key) == 0  # it left
        assert (slots.free, list(slots.turns)) == (1, [])
        ended = Queue(admin, name).enqueue("t", {}, delay_ms=600_000)
        Queue(admin, name).cancel(ended)
        with pytest.raises(JobCancelled):
            q.result(ended, timeout_s=5)
    finally:
        q.close()


# -- listings read record heads (client/job_listing.py, spec_record.spec_head) --------------


def _clients(url: str) -> dict[str, redis.Redis]:
    return {
        "bytes": redis.Redis.from_url(url),
        "backslashreplace": connect(url),
        "replace": redis.Redis.from_url(url, decode_responses=True, encoding_errors="replace"),
        "strict": redis.Redis.from_url(url, decode_responses=True),
    }


def _record(url: str, q: Queue, job: str) -> bytes:
    raw = redis.Redis.from_url(url)
    try:
        record = raw.get(q.keys.spec(job))
    finally:
        raw.close()
    assert isinstance(record, bytes)
    return record


def _set_payload(url: str, q: Queue, job: str, payload_text: str) -> bytes:
    """The job's spec record with its payload replaced (its head as enqueue wrote it)."""
    whole = _record(url, q, job)
    raw = redis.Redis.from_url(url)
    head = whole[: len(whole) - len(whole.split(b"|", 8)[8])]
    record = head + payload_text.encode()
    raw.set(q.keys.spec(job), record)
    raw.close()
    return record


def _listed(c: redis.Redis, name: str, job: str) -> Any:
    (got,) = [j for _, j in job_listing.page(Queue(c, name), "due", 0, 10, {}) if j.id == job]
    return got


def _without_payload(fields: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in fields.items() if k != "payload"}


@pytest.mark.parametrize("pad", ["0", "1", "2", "short"])
def test_a_head_read_cut_inside_a_multibyte_character_lists_as_the_whole_record(
    url: str, admin: redis.Redis, pad: str
) -> None:
    """A payload of 3-byte characters, HEAD_BYTES falling at each byte of one of them (or the
    record shorter than the head): every kind of client lists the fields of the whole read but
    the payload (a strict one reads the whole record)."""
    name = _name()
    q = Queue(admin, name)
    job = q.enqueue("t.multibyte", {}, max_attempts=7, timeout_ms=1234, result_ttl_ms=99_000)
    text = '"' + "€" * 100 + '"' if pad == "short" else '"' + "a" * int(pad) + "€" * 400 + '"'
    record = _set_payload(url, q, job, text)
    assert (len(record) < HEAD_BYTES) == (pad == "short")
    whole = q.get_job(job)
    assert whole.payload_json == text
    for kind, c in _clients(url).items():
        try:
            got = _listed(c, name, job)
            assert _without_payload(got.fields) == _without_payload(whole.fields), kind
            assert (got.task, got.state, got.max_attempts) == ("t.multibyte", "due", 7), kind
            if kind == "strict":
                assert got.payload_json == text  # read whole: it cannot read a cut reply
        finally:
            c.close()


def test_a_record_of_exactly_the_head_size_is_listed_and_retried_whole(
    url: str, admin: redis.Redis
) -> None:
    """A record exactly HEAD_BYTES long: its head read is the whole record. Listed without
    its payload; a fail (the head read of lib/job.lua job_spec) retries it with the payload
    intact."""
    name = _name()
    q = Queue(admin, name)
    job = q.enqueue("t.exact", {})
    head = len(_record(url, q, job)) - len("{}")
    text = '"' + "é" * ((HEAD_BYTES - head - 2) // 2) + "a" * ((HEAD_BYTES - head - 2) % 2) + '"'
    assert len(_set_payload(url, q, job, text)) == HEAD_BYTES
    got = _listed(admin, name, job)
    assert (got.task, got.max_attempts, "payload" in got.fields) == ("t.exact", 5, False)
    (claimed,) = q.claim("w", limit=1).jobs
    assert claimed.payload_json == text
    q.fail(job, claimed.token, ("Boom", "x", ""), delay_ms=0)
    assert q.get_job(job).state == "due"
    (again,) = q.claim("w", limit=1).jobs
    assert (again.id, again.payload_json, again.attempts) == (job, text, 2)


def test_a_record_with_a_bar_too_many_lists_as_its_whole_read_does(
    url: str, admin: redis.Redis
) -> None:
    """A hand edit that puts a '|' among the fields before the payload: the head read and the
    whole read split the record the same way (the flags field takes what follows)."""
    name = _name()
    q = Queue(admin, name)
    job = q.enqueue("t.bars", {"p": "x" * 3000})
    parts = _record(url, q, job).split(b"|", 8)
    raw = redis.Redis.from_url(url)
    raw.set(q.keys.spec(job), b"|".join([*parts[:7], b"zz|yy", parts[7], parts[8]]))
    raw.close()
    whole = q.get_job(job)
    got = _listed(admin, name, job)
    assert _without_payload(got.fields) == _without_payload(whole.fields)


# -- cancel and fail read record heads (lua/cancel.lua, lua/fail.lua) -----------------------


def test_cancel_of_a_never_claimed_job_whose_record_is_of_another_type(
    url: str, admin: redis.Redis
) -> None:
    """Its record edited into a hash: the cancel reads no spec (a GETRANGE of another type) and
    cancels the job as before, its run time pinned, no enqueued_ms invented."""
    name = _name()
    q = Queue(admin, name)
    job = q.enqueue("t", {}, delay_ms=600_000)
    admin.delete(q.keys.spec(job))
    admin.hset(q.keys.spec(job), "x", "1")
    assert q.cancel(job) == "scheduled"
    fields = admin.hgetall(q.keys.job(job))
    assert (fields["state"], "enqueued_ms" in fields, "run_at_ms" in fields) == (
        "cancelled",
        False,
        True,
    )


def test_cancel_of_a_never_claimed_large_job_keeps_its_enqueue_time(
    url: str, admin: redis.Redis
) -> None:
    """The cancel writes enqueued_ms into the hash (not the record): get_job reads it back, and
    the record keeps only its head."""
    name = _name()
    q = Queue(admin, name)
    job = q.enqueue("t", {"p": "é" * 4000}, delay_ms=600_000)
    before = q.get_job(job)
    assert q.cancel(job) == "scheduled"
    after = q.get_job(job)
    assert after.fields["enqueued_ms"] == before.fields["enqueued_ms"]
    assert after.run_at_ms == before.run_at_ms
    assert len(_record(url, q, job)) < HEAD_BYTES


# -- scheduler queue priority-aging (cli/queue_config.py) -----------------------------------


def _cli(url: str, *args: str) -> Result:
    runner = CliRunner(env={"COLUMNS": "200", "REDIS_URL": None, "SCHEDULER_QUEUE": None})
    return runner.invoke(main, ["queue", "priority-aging", *args, "--url", url])


@pytest.fixture
def pq(admin: redis.Redis) -> Iterator[PartitionedQueue]:
    p = PartitionedQueue.create(admin, _name(), partitions=3)
    p.enqueue("t", job_id=f"p1.{uuid.uuid4().hex}")  # the queue exists for the CLI
    yield p


def test_the_priority_aging_note_names_a_redis_cli_line_that_reaches_the_server(
    url: str, admin: redis.Redis, pq: PartitionedQueue
) -> None:
    admin.hset(QueueKeys(pq.name).config, "priority_aging_ms", "7")
    res = _cli(url, "-q", pq.name)
    assert res.exit_code == 0, res.output
    (line,) = [x for x in res.stderr.splitlines() if "redis-cli" in x]
    words = shlex.split(line[line.index("redis-cli") :])
    flags = connection_flags(url)  # the server's socket (-s) or host and port
    assert flags and all(f in words for f in flags), (flags, line)


def test_priority_aging_on_a_partly_corrupt_partitioned_queue_says_what_it_wrote(
    url: str, admin: redis.Redis, pq: PartitionedQueue
) -> None:
    bad = QueueKeys(pq.parts[1].name).config
    admin.delete(bad)
    admin.set(bad, "edited")
    res = _cli(url, "-q", pq.name, "5")
    others = [admin.hget(QueueKeys(p.name).config, "priority_aging_ms") for p in pq.parts[::2]]
    assert res.exit_code != 0
    assert "nothing written" not in res.output or others == [None, None], (res.output, others)


def test_a_too_large_whole_number_of_ms_is_refused_as_out_of_range(
    url: str, admin: redis.Redis
) -> None:
    name = _name()
    Queue(admin, name).enqueue("t")
    res = _cli(url, "-q", name, "99999999999999999")
    assert res.exit_code == 2
    assert "must be in 0 .. 315360000000 ms" in res.output, res.output
    assert admin.hget(QueueKeys(name).config, "priority_aging_ms") is None


def test_priority_aging_of_a_missing_queue_exits_1_and_writes_nothing(
    url: str, admin: redis.Redis
) -> None:
    name = _name()
    for args in ((), ("--json",), ("5000",), ("--default", "--json")):
        res = _cli(url, "-q", name, *args)
        assert (res.exit_code, res.stdout) == (1, ""), (args, res.output)
        assert f"no queue named {name!r}" in res.stderr
    assert admin.exists(QueueKeys(name).config) == 0


def test_priority_aging_json_of_a_partitioned_queue_that_differs_by_partition(
    url: str, admin: redis.Redis, pq: PartitionedQueue
) -> None:
    assert _cli(url, "-q", pq.name, "2s").exit_code == 0
    admin.hset(QueueKeys(pq.parts[2].name).config, "priority_aging_ms", "abc")
    res = _cli(url, "-q", pq.name, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert (data["priority_aging_ms"], data["stored"], data["changed"]) == (None, None, False)
    assert [(p["priority_aging_ms"], p["stored"]) for p in data["partitions"]] == [
        (2000, "2000"),
        (2000, "2000"),
        (60000, "abc"),
    ]
