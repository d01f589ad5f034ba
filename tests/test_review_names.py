"""Names and identifiers end to end (review): queue, job, schedule and worker names taken at
one boundary and followed through the CLI, the doctor's fix lines, partitioned queues and the
key layout. A name the product takes must work everywhere it is later shown or used; a name it
cannot handle must be refused where it is given.

Findings are strict xfails (the correct behaviour, failing today); the unmarked tests verify
behaviour that holds (the shell quoting of redis-cli lines, one slot per queue)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner, Result
from redis.crc import key_slot

from scheduler import PartitionedQueue, PartitionMismatch, Queue
from scheduler.cli.main import main
from scheduler.core.partitions import meta_key
from tests.conftest import delete_queue


def cli(redis_url: str, *args: str) -> Result:
    runner = CliRunner(env={"COLUMNS": "300", "REDIS_URL": None, "SCHEDULER_QUEUE": None})
    return runner.invoke(main, [*args, "--url", redis_url])


def doctor_findings(redis_url: str, queue: str) -> list[dict[str, object]]:
    out = cli(redis_url, "doctor", "--json", "--no-server", "-q", queue)
    return list(json.loads(out.stdout)["findings"])


def run_line(redis_url: str, line: str) -> Result:
    """A `scheduler ...` command line as an operator pastes it: split as a POSIX shell does,
    run by the CLI (its own --url is in the line)."""
    argv = shlex.split(line)
    assert argv[0] == "scheduler", line
    runner = CliRunner(env={"COLUMNS": "300", "REDIS_URL": None, "SCHEDULER_QUEUE": None})
    return runner.invoke(main, argv[1:])


@pytest.fixture
def pq(client: redis.Redis, queue_name: str) -> Iterator[PartitionedQueue]:
    made = PartitionedQueue.create(client, queue_name, partitions=2)
    yield made
    for name in made.layout.names:
        delete_queue(client, Queue(client, name))
    client.delete(meta_key(queue_name))


# -- the worker id: what docs/limits.md says `scheduler worker --worker-id` takes ---------------
def test_scheduler_worker_takes_a_worker_id_limits_md_documents(
    redis_url: str, queue_name: str
) -> None:
    """docs/limits.md: `worker_id` | `claim`, `WorkerSettings` / `scheduler worker
    --worker-id` | 1-200 bytes of valid Unicode (UTF-8: 200 ASCII characters, 100 `é`, ...).
    The Python API takes 'wörker-1' and 150 ASCII characters; `scheduler worker` exits 2
    ("invalid --worker-id ...: 1-128 characters of A-Z a-z 0-9 _ . : -")."""
    for worker_id in ("wörker-1", "w" * 150):
        cmd = [sys.executable, "-c", "from scheduler.cli.main import main; main()", "worker",
               "tests.workers.basic:registry", "--url", redis_url, "-q", queue_name, "--burst",
               "--worker-id", worker_id]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, (worker_id[:20], proc.stderr[-400:])


# -- dead letters whose id no API would make (docs/durability.md: doctor takes any id) ------------
def _gone_dead_entry(client: redis.Redis, q: Queue, job_id: str) -> None:
    """A dead-list entry whose record is gone (deleted by hand): `record gone` in dead list."""
    client.zadd(q.keys.dead, {job_id: 1_000})


def test_the_dead_list_purge_hint_is_one_argument_per_id(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    _gone_dead_entry(client, q, "bad id")
    out = cli(redis_url, "dead", "list", "-q", q.name)
    assert out.exit_code == 0, out.output
    (line,) = [ln for ln in out.stdout.splitlines() if "scheduler dead purge" in ln]
    argv = shlex.split(line[line.index("scheduler") :].split(" removes", 1)[0])
    assert argv[argv.index("--id") + 1] == "bad id", line


def test_the_doctor_fix_drops_a_gone_dead_entry_whatever_its_id(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    """docs/durability.md: doctor "takes any id stored in a place ..., also one no API would
    make"; an id on the dead list whose record is gone: "`dead purge --id` drops it". The
    Python API does (check_id_list: any str); the CLI's --id refuses 'bad id' and the fix
    line the doctor prints fails with 'invalid job id'."""
    _gone_dead_entry(client, q, "bad id")
    (fix,) = [str(f["fix"]) for f in doctor_findings(redis_url, q.name) if f["job_id"] == "bad id"]
    line = fix.split("to drop it: ", 1)[1]
    out = run_line(redis_url, line + " --yes")
    assert out.exit_code == 0, (line, out.output)
    assert client.zscore(q.keys.dead, "bad id") is None


# -- a name the API takes that starts with '-' -----------------------------------------------------
def test_a_doctor_fix_line_naming_a_dash_led_schedule_runs(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    """schedule-no-hash (admin/doctor_keys.py _stale_name): the fix is `scheduler schedules
    remove -q <q> <name> (drops the name)`. For '-nightly' that line is refused: "No such
    option: -n". The same holds for stuck-waiting's `scheduler jobs show -q <q> <id>` with an
    id like '-a1' (check_new_job_id takes it)."""
    q.schedule("-nightly", "t", every_ms=60_000)
    client.delete(q.keys.schedule("-nightly"))  # by hand: the name stays in the index
    (fix,) = [
        str(f["fix"]) for f in doctor_findings(redis_url, q.name) if f["code"] == "schedule-no-hash"
    ]
    line = fix.split(" (drops the name)", 1)[0]
    out = run_line(redis_url, line)
    assert out.exit_code == 0, (line, out.output)
    assert not client.sismember(q.keys.schedules, "-nightly")


# -- partitioned queues: names reserved for partitions ---------------------------------------------
def test_create_refuses_a_partition_name_that_is_a_plain_queue_with_jobs(
    client: redis.Redis, queue_name: str
) -> None:
    """`emails.p0` and `emails.p1` are natural names for priority queues. With a plain queue
    `<name>.p0` holding a job, `PartitionedQueue.create(<name>, partitions=1)` (whose one
    partition is `<name>.p0`) writes its layout: the plain queue's job is now counted, listed
    and run as the partitioned queue's, the plain queue vanishes from discovery (grouped under
    the logical name), and its own workers and the partitioned queue's share it. create refuses
    the logical name when it exists unpartitioned; the same is missing for the partitions."""
    plain = Queue(client, f"{queue_name}.p0")
    try:
        job = plain.enqueue("priority.mail", {"to": "x"})
        with pytest.raises(PartitionMismatch):
            made = PartitionedQueue.create(client, queue_name, partitions=1)
            assert made.layout.names == (plain.name,)
            made.get_job(job)  # the plain queue's job, now the partitioned queue's
        assert client.get(meta_key(queue_name)) is None  # nothing written
    finally:
        delete_queue(client, plain)
        client.delete(meta_key(queue_name))


def test_a_partitioned_queue_keeps_one_schedule_per_name(
    redis_url: str, client: redis.Redis, pq: PartitionedQueue
) -> None:
    """README: "A schedule lives in one partition (by its name), so 'exactly one pending run'
    still holds". A plain Queue on a partition's name (the CLI opens `-q <queue>.p<k>` so) is
    refused nothing: 'nightly' defined there too gives pq.list_schedules() two 'nightly', each
    with its own pending run, and `schedules remove -q <queue> nightly` removes one of them."""
    pq.schedule("nightly", "t", every_ms=60_000)
    home = pq.layout.partition_of_schedule("nightly")
    other = pq.layout.names[1 - home]
    cli(redis_url, "schedules", "add", "-q", other, "nightly", "t", "--every", "1m")
    names = [s.name for s in pq.list_schedules()]
    assert names.count("nightly") == 1, names
    runs = [s.pending for s in pq.list_schedules() if s.name == "nightly"]
    assert len(runs) == 1, runs


# -- verified: redis-cli lines quote key names; a queue lives in one slot --------------------------
def test_scheduler_keys_lines_reach_a_brace_expanding_shell_intact(
    redis_url: str, client: redis.Redis
) -> None:
    """'1..3' is a valid queue name; unquoted, bash expands sched:{1..3}:due into three words
    (sched:1:due sched:2:due sched:3:due). Every redis-cli line of `scheduler keys` passes its
    key to the shell as one word, the key itself."""
    q = Queue(client, "1..3")
    try:
        q.enqueue("t", 1)
        out = cli(redis_url, "keys", "-q", q.name)
        assert out.exit_code == 0, out.output
        lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip().startswith("redis-cli")]
        assert lines, out.stdout
        for line in lines:
            words = line.split(" ", 1)[1]
            echoed = subprocess.run(
                ["bash", "-c", f"printf '%s\\n' {words}"], capture_output=True, text=True
            ).stdout.splitlines()
            key = next(w for w in echoed if w.startswith("sched:"))
            assert key.startswith("sched:{1..3}:"), (line, echoed)
            assert not any(w.startswith("sched:1:") for w in echoed), (line, echoed)
    finally:
        delete_queue(client, q)


def test_every_key_a_queue_writes_is_in_its_one_slot(client: redis.Redis, queue_name: str) -> None:
    """All of a queue's keys carry its hash tag: job ids with ':' and '.', flow keys with '/'
    and ':', schedules, a worker id with braces and spaces, results and dead letters."""
    q = Queue(client, queue_name)
    try:
        a = q.enqueue("t.a", 1, job_id="a:b.c", key="k é {x}")
        q.enqueue("t/b", 2, concurrency_key="tenant:7/x", concurrency_limit=1)
        q.enqueue("t", 3, rate_limit="5/s", rate_key="r:1/2", after=[a])
        q.schedule("n.1", "t", every_ms=60_000)
        q.schedule("c-1", "t", cron="*/5 * * * *")
        batch = q.claim("w {a} b*?", limit=10)
        for i, job in enumerate(batch.jobs):
            if i % 2:
                q.fail(job.id, job.token, ("E", "m", "tb"), retryable=False)
            else:
                q.complete(job.id, job.token, {"ok": True})
        keys = list(client.scan_iter(match=q.keys.pattern(), count=1000))
        assert len(keys) > 8, keys
        assert {key_slot(str(k).encode()) for k in keys} == {key_slot(q.keys.prefix.encode())}
    finally:
        delete_queue(client, q)
