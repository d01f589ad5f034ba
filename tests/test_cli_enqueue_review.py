"""Review of the CLI commands that write for the app developer (`scheduler enqueue`,
`scheduler schedules add`) and the `scheduler worker` start flags: parity with the Python API
(the same option stores the same job or schedule, is refused exactly when the API refuses it),
bad values (exit 2, one clear line, nothing written), time and payload parsing, --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import Queue
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core import exits
from scheduler.core.backoff import Backoff
from scheduler.core.errors import BadArgument
from tests.conftest import dump_queue
from tests.redis_server import RedisProcess

Run = Callable[..., Result]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cli(redis_url: str) -> Run:
    runner = CliRunner(env={"COLUMNS": "200"})

    def run(*args: str, env: dict[str, str] | None = None) -> Result:
        return runner.invoke(main, [*args, "--url", redis_url], env=env)

    return run


def ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


def indexed(client: redis.Redis, name: str) -> bool:
    return bool(client.sismember("sched:queues", name))


# -- enqueue: parity with Queue.enqueue --------------------------------------------------------
VOLATILE = {"enqueued_ms", "run_at_ms", "start_by_ms"}


def stable(fields: dict[str, str]) -> dict[str, str]:
    """A job's fields but the times of its own enqueue."""
    return {k: v for k, v in fields.items() if k not in VOLATILE}


def test_enqueue_every_option_stores_what_the_api_stores(cli: Run, q: Queue) -> None:
    parent = q.enqueue("t", None)
    api = q.enqueue(
        "mail.send", {"a": [1, 2.5, "x"], "b": None}, delay_ms=60_000, max_attempts=3,
        backoff=Backoff(250, 2, 10_000, 0.5), key="k-api", key_ttl_ms=3_600_000, jitter_ms=1000,
        timeout_ms=1500, job_id="api-1", result_ttl_ms=7_200_000, keep_payload=True, priority=4,
        concurrency_key="ck", concurrency_limit=2, rate_limit="10/1s", rate_key="rk",
        after=[parent], start_within_ms=600_000,
    )  # fmt: skip
    out = cli("enqueue", "mail.send", "-q", q.name, "--payload", '{"a": [1, 2.5, "x"], "b": null}',
              "--in", "1m", "--max-attempts", "3", "--backoff", "250,2,10000,0.5", "--key", "k-cli",
              "--key-ttl", "1h", "--jitter", "1s", "--timeout", "1500ms", "--job-id", "cli-1",
              "--result-ttl", "2h", "--keep-payload", "--priority", "4", "--concurrency-key", "ck",
              "--concurrency-limit", "2", "--rate-limit", "10/1s", "--rate-key", "rk",
              "--after", parent, "--start-within", "10m")  # fmt: skip
    assert ok(out) == "cli-1"
    a, c = q.get_job(api), q.get_job("cli-1")
    assert (c.state, c.task, c.payload_json) == (a.state, a.task, a.payload_json)
    assert stable(c.fields) == stable(a.fields)
    for job in (a, c):  # the same run time and start deadline rules, from its own enqueue
        delay = int(job.fields["run_at_ms"]) - int(job.fields["enqueued_ms"])
        assert 60_000 <= delay <= 61_000
        assert int(job.fields["start_by_ms"]) - int(job.fields["run_at_ms"]) == 600_000


def test_enqueue_defaults_match_the_api_defaults(cli: Run, q: Queue) -> None:
    api = q.get_job(q.enqueue("t"))
    cli_job = q.get_job(ok(cli("enqueue", "t", "-q", q.name)))
    assert stable(cli_job.fields) == stable(api.fields)
    assert cli_job.payload_json == api.payload_json == "null"


def test_enqueue_key_ttl_holds_the_key_as_the_api_does(
    cli: Run, q: Queue, client: redis.Redis
) -> None:
    first = ok(cli("enqueue", "t", "-q", q.name, "--key", "order-9", "--key-ttl", "2h"))
    [idem] = [k for k in client.scan_iter(match=q.keys.pattern()) if ":idem:" in k]
    assert 2 * 3_600_000 - 60_000 < client.pttl(idem) <= 2 * 3_600_000
    # The API with the same key answers the CLI's job: one key space.
    assert q.enqueue("t", key="order-9") == first


def test_enqueue_debounce_replaces_the_waiting_job_like_the_api(cli: Run, q: Queue) -> None:
    first = q.enqueue("t", {"v": 1}, key="d1", delay_ms=60_000)
    again = ok(cli("enqueue", "t", "-q", q.name, "--key", "d1", "--debounce", "--in", "2m",
                   "--payload", '{"v": 2}'))  # fmt: skip
    assert again == first
    job = q.get_job(first)
    assert json.loads(job.payload_json) == {"v": 2}
    assert int(job.fields["run_at_ms"]) - int(job.fields["enqueued_ms"]) >= 120_000 - 1


# -- enqueue: time parsing ---------------------------------------------------------------------
def test_at_in_the_past_is_due_now_and_in_zero_is_now(cli: Run, q: Queue) -> None:
    past = ok(cli("enqueue", "t", "-q", q.name, "--at", "2001-02-03T04:05:06Z"))
    job = q.get_job(past)
    assert job.state == "due"
    assert job.run_at_ms is not None and job.run_at_ms <= int(job.fields["enqueued_ms"])
    zero = q.get_job(ok(cli("enqueue", "t", "-q", q.name, "--in", "0s")))
    assert zero.state == "due" and zero.run_at_ms == int(zero.fields["enqueued_ms"])


@pytest.mark.parametrize(
    "text",
    ["2031-03-30T02:30:00+02:00", "2031-10-26T02:30:00.0004+01:00", "2031-06-01T12:00:00-09:30",
     "2031-01-01 00:00:00+00:00", "2031-01-01T00:00:00-00:00"],
)  # fmt: skip
def test_at_stores_the_instant_the_api_stores(cli: Run, q: Queue, text: str) -> None:
    at = datetime.fromisoformat(text)
    api = q.get_job(q.enqueue("t", run_at=at))
    got = q.get_job(ok(cli("enqueue", "t", "-q", q.name, "--at", text)))
    assert got.run_at_ms == api.run_at_ms  # rounded up to the ms, as the API does
    assert got.run_at_ms == -(-int((at - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(
        microseconds=1)) // 1000)  # fmt: skip


def test_in_sums_its_parts_in_any_order(cli: Run, q: Queue) -> None:
    job = q.get_job(ok(cli("enqueue", "t", "-q", q.name, "--in", "30m1h250ms")))
    assert job.run_at_ms == int(job.fields["enqueued_ms"]) + 5_400_250


# -- enqueue: bad values (exit 2, one line, nothing written) -------------------------------------
BAD = {
    "in too long": ["--in", "999999d"],
    "in absurd": ["--in", "9" * 40 + "d"],
    "in with a space": ["--in", "1h 30m"],
    "in fraction": ["--in", "1.5h"],
    "in upper case unit": ["--in", "5M"],
    "in plus sign": ["--in", "+5m"],
    "in unicode digits": ["--in", "\uff15m"],
    "at before 1970": ["--at", "1969-12-31T23:59:59Z"],
    "at after 2200": ["--at", "2300-01-01T00:00:00Z"],
    "at date only": ["--at", "2031-01-01"],
    "at offset 24h": ["--at", "2031-01-01T00:00:00+24:00"],
    "at zone name": ["--at", "2031-01-01T00:00Z[Europe/Paris]"],
    "max attempts over the cap": ["--max-attempts", "1000001"],
    "priority 10": ["--priority", "10"],
    "priority negative": ["--priority", "-1"],
    "concurrency key alone": ["--concurrency-key", "ck"],
    "concurrency limit alone": ["--concurrency-limit", "2"],
    "concurrency limit 0": ["--concurrency-key", "ck", "--concurrency-limit", "0"],
    "concurrency limit too big": ["--concurrency-key", "ck", "--concurrency-limit", "10001"],
    "bad concurrency key": ["--concurrency-key", "a b", "--concurrency-limit", "1"],
    "rate key alone": ["--rate-key", "rk"],
    "rate limit 0": ["--rate-limit", "0/1s"],
    "rate limit zero window": ["--rate-limit", "10/0s"],
    "rate limit garbage": ["--rate-limit", "lots"],
    "key ttl without key": ["--key-ttl", "1h"],
    "debounce without key": ["--debounce"],
    "key ttl zero": ["--key", "k", "--key-ttl", "0s"],
    "empty key": ["--key", ""],
    "key too long": ["--key", "k" * 513],
    "result ttl over a year": ["--result-ttl", "367d"],
    "timeout over a week": ["--timeout", "8d"],
    "timeout and timeout-ms": ["--timeout", "1s", "--timeout-ms", "1000"],
    "start window too long": ["--start-within", "99999d"],
    "jitter too long": ["--jitter", "99999d"],
    "job id too long": ["--job-id", "j" * 129],
    "empty job id": ["--job-id", ""],
    "empty parent": ["--after", ""],
    "101 parents": [a for i in range(101) for a in ("--after", f"p{i}")],
    "backoff jitter over 1": ["--backoff", "100,2,1000,1.5"],
    "backoff nan": ["--backoff", "100,nan,1000,0"],
    "payload out of range float": ["--payload", "[1e400]"],
    "payload Infinity": ["--payload", "Infinity"],
    "payload empty": ["--payload", ""],
    "payload with a BOM": ["--payload", "\ufeff{}"],
    "payload lone surrogate escape": ["--payload", '"\\ud800"'],
    "payload lone surrogate raw": ["--payload", '"\udcff"'],  # a non-UTF-8 argv byte
    "payload over 512 KiB": ["--payload", json.dumps("x" * (512 * 1024 + 1))],
    "in plus jitter over ten years": ["--in", "3650d", "--jitter", "1d"],
    "debounce with a priority": ["--key", "k", "--debounce", "--priority", "3"],
    "debounce with a rate limit": ["--key", "k", "--debounce", "--rate-limit", "1/1s"],
    "debounce with a job id": ["--key", "k", "--debounce", "--job-id", "x"],
    "task too long": ["--payload", "1", "--", "t" * 201],
    "empty task": ["--payload", "1", "--", ""],
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_enqueue_is_usage_and_writes_nothing(
    cli: Run, q: Queue, client: redis.Redis, case: str
) -> None:
    args = BAD[case]
    task = [] if "--" in args else ["t"]
    result = cli("enqueue", *task, "-q", q.name, *args)
    assert result.exit_code == exits.EXIT_USAGE, result.output
    assert "Traceback" not in result.output
    assert result.stdout == ""
    lines = [x for x in result.stderr.splitlines() if x.strip() and not x.startswith("warning")]
    assert lines and "Error" in result.stderr, result.stderr
    assert dump_queue(client, q) == {} and not indexed(client, q.name)


# Spellings only the CLI parses: the API takes no such text.
CLI_ONLY = {"in with a space", "in fraction", "in upper case unit", "in plus sign",
            "in unicode digits", "at date only", "at offset 24h", "at zone name",
            "timeout and timeout-ms", "payload Infinity", "payload empty",
            "payload with a BOM"}  # fmt: skip


@pytest.mark.parametrize("case", sorted(set(BAD) - CLI_ONLY))
def test_bad_enqueue_is_refused_by_the_api_too(q: Queue, case: str) -> None:
    """Parity: every value the CLI refuses, the API refuses (but for CLI_ONLY spellings)."""
    from scheduler.cli.common import parse_backoff
    from scheduler.cli.output import parse_at, parse_duration_ms

    opts: dict[str, Any] = {}
    args, task, payload = list(BAD[case]), "t", None
    names = {"--in": "delay_ms", "--key-ttl": "key_ttl_ms", "--result-ttl": "result_ttl_ms",
             "--timeout": "timeout_ms", "--start-within": "start_within_ms",
             "--jitter": "jitter_ms"}  # fmt: skip
    while args:
        name = args.pop(0)
        if name == "--":
            task = args.pop(0)
        elif name == "--debounce":
            opts["debounce"] = True
        elif name == "--payload":
            payload = json.loads(args.pop(0))
        elif name in names:
            opts[names[name]] = parse_duration_ms(args.pop(0))
        elif name == "--at":
            opts["run_at"] = parse_at(args.pop(0))
        elif name == "--after":
            opts.setdefault("after", []).append(args.pop(0))
        elif name == "--backoff":
            try:
                opts["backoff"] = parse_backoff(args.pop(0))
            except BadArgument:
                return  # the one backoff reader refuses it for both
        else:
            key = name.lstrip("-").replace("-", "_")
            value = args.pop(0)
            opts[key] = int(value) if value.lstrip("-").isdigit() and key != "key" else value
    with pytest.raises(BadArgument):
        q.enqueue(task, payload, **opts)


# -- enqueue: partitioned queues, --json -------------------------------------------------------
def test_partitioned_enqueue_routes_as_the_api_does(cli: Run, pq: PartitionedQueue) -> None:
    by_key = ok(cli("enqueue", "t", "-q", pq.name, "--key", "order-1"))
    assert pq.enqueue("t", key="order-1") == by_key  # the same partition, the same key
    parent = pq.enqueue("t", None)
    child = ok(cli("enqueue", "t", "-q", pq.name, "--after", parent))
    assert child.split(".")[0] == parent.split(".")[0]  # a child lives with its parent
    assert pq.get_job(child).state == "held"
    named = ok(cli("enqueue", "t", "-q", pq.name, "--job-id", "mine-1", "--json"))
    assert json.loads(named) == {"id": "mine-1", "queue": pq.name, "task": "t"}
    assert pq.get_job("mine-1").task == "t"


def test_partitioned_enqueue_refuses_parents_of_two_partitions(
    cli: Run, pq: PartitionedQueue, client: redis.Redis
) -> None:
    a = pq.enqueue("t", None)
    b = next(i for i in (pq.enqueue("t", None) for _ in range(10)) if i[:3] != a[:3])
    before = {p.name: dump_queue(client, p) for p in pq.parts}
    result = cli("enqueue", "t", "-q", pq.name, "--after", a, "--after", b)
    assert result.exit_code == exits.EXIT_USAGE, result.output
    assert "partition" in result.stderr
    assert {p.name: dump_queue(client, p) for p in pq.parts} == before


@pytest.fixture(scope="module")
def volatile_url() -> Iterator[str]:
    """A private server with persistence off: enqueue warns on stderr."""
    from tests.redis_server import require_binary

    server = RedisProcess(require_binary("redis-server", "a server with unsafe settings")).start()
    try:
        yield server.url
    finally:
        server.cleanup()


def test_enqueue_json_is_one_object_on_stdout_beside_a_warning(volatile_url: str) -> None:
    runner = CliRunner()
    args = ["enqueue", "t", "-q", "jq", "--key", "k", "--json", "--url", volatile_url]
    first = runner.invoke(main, args)
    assert first.exit_code == 0, first.output
    assert "warning:" in first.stderr  # persistence off: said, on stderr only
    data = json.loads(first.stdout)  # the whole of stdout is one JSON object
    assert set(data) == {"id", "queue", "task"} and data["queue"] == "jq"
    again = runner.invoke(main, args)
    assert json.loads(again.stdout)["id"] == data["id"]  # the key's job, as the API answers


def test_schedules_add_json_is_one_object(cli: Run, q: Queue) -> None:
    out = ok(cli("schedules", "add", "s", "t", "-q", q.name, "--every", "5m", "--json"))
    assert json.loads(out) == {"queue": q.name, "schedule": "s", "status": "created"}


# -- schedules add: parity with Queue.schedule, bad values ---------------------------------------
def test_schedules_add_every_option_is_the_api_definition(cli: Run, q: Queue) -> None:
    status = q.schedule(
        "a", "t", {"x": 1}, cron="0 9 * * 1-5", tz="Europe/Berlin", jitter_ms=5000,
        misfire="catch_up:3", max_attempts=3, backoff=Backoff(250, 2, 10_000, 0.5),
        timeout_ms=1500, priority=4, concurrency_key="ck", concurrency_limit=2,
        rate_limit="10/1s", rate_key="rk", start_within_ms=600_000,
    )  # fmt: skip
    assert status == "created"
    out = cli("schedules", "add", "a", "t", "-q", q.name, "--payload", '{"x": 1}',
              "--cron", "0 9 * * 1-5", "--tz", "Europe/Berlin", "--jitter", "5s",
              "--misfire", "catch_up:3", "--max-attempts", "3", "--backoff", "250,2,10000,0.5",
              "--timeout", "1500ms", "--priority", "4", "--concurrency-key", "ck",
              "--concurrency-limit", "2", "--rate-limit", "10/1s", "--rate-key", "rk",
              "--start-within", "10m")  # fmt: skip
    assert ok(out) == "a: unchanged"  # the same definition: nothing written
    q.schedule("b", "t", every_ms=60_000)
    assert ok(cli("schedules", "add", "b", "t", "-q", q.name, "--every", "1m")) == "b: unchanged"
    q.schedule("c", "t", cron="0 9 * * *")
    out = cli("schedules", "add", "c", "t", "-q", q.name, "--cron", "0 9 * * *", "--tz", "UTC")
    assert ok(out) == "c: unchanged"  # UTC named is the default


BAD_SCHEDULE = {
    "tz with every": ["--every", "1m", "--tz", "Europe/Berlin"],
    "unknown tz": ["--cron", "0 9 * * *", "--tz", "Mars/Olympus"],
    "empty tz": ["--cron", "0 9 * * *", "--tz", ""],
    "tz path": ["--cron", "0 9 * * *", "--tz", "../../etc/passwd"],
    "catch up 0": ["--every", "1m", "--misfire", "catch_up:0"],
    "catch up 1001": ["--every", "1m", "--misfire", "catch_up:1001"],
    "catch up without N": ["--every", "1m", "--misfire", "catch_up"],
    "misfire word": ["--every", "1m", "--misfire", "never"],
    "jitter not under every": ["--every", "1m", "--jitter", "1m"],
    "every over ten years": ["--every", "3651d"],
    "zero start window": ["--every", "1m", "--start-within", "0s"],
    "priority 10": ["--every", "1m", "--priority", "10"],
    "max attempts over the cap": ["--every", "1m", "--max-attempts", "1000001"],
    "timeout over a week": ["--every", "1m", "--timeout", "8d"],
    "rate key alone": ["--every", "1m", "--rate-key", "x"],
    "concurrency key alone": ["--every", "1m", "--concurrency-key", "x"],
    "lone surrogate payload": ["--every", "1m", "--payload", '"\\ud800"'],
    "NaN payload": ["--every", "1m", "--payload", "NaN"],
    "out of range float": ["--every", "1m", "--payload", "[1e400]"],
    "cron macro": ["--cron", "@daily"],
    "cron that never fires": ["--cron", "0 0 31 4 *"],
    "cron step leaving one value": ["--cron", "*/90 * * * *"],
    "cron reversed range": ["--cron", "0 22-2 * * *"],
    "cron over 512 characters": ["--cron", ",".join(["1"] * 300) + " * * * *"],
    "cron jitter over its interval": ["--cron", "* * * * *", "--jitter", "2m"],
    "payload over 512 KiB": ["--every", "1m", "--payload", json.dumps("x" * 600_000)],
    "empty cron": ["--cron", ""],
}


@pytest.mark.parametrize("case", sorted(BAD_SCHEDULE))
def test_bad_schedules_add_is_usage_and_keeps_the_old_definition(
    cli: Run, q: Queue, client: redis.Redis, case: str
) -> None:
    q.schedule("s", "t", {"v": 1}, every_ms=3_600_000)
    before = dump_queue(client, q)
    result = cli("schedules", "add", "s", "t", "-q", q.name, *BAD_SCHEDULE[case])
    assert result.exit_code == exits.EXIT_USAGE, result.output
    assert result.stdout == "" and "Error" in result.stderr and "Traceback" not in result.output
    assert dump_queue(client, q) == before


def test_bad_schedules_add_on_a_new_queue_indexes_nothing(cli: Run, client: redis.Redis) -> None:
    name = "never-" + os.urandom(5).hex()
    result = cli("schedules", "add", "s", "t", "-q", name, "--every", "1m", "--tz", "UTC")
    assert result.exit_code == exits.EXIT_USAGE
    assert not indexed(client, name) and list(client.scan_iter(match=f"sched:{{{name}}}*")) == []


# -- worker start flags ------------------------------------------------------------------------
BAD_WORKER = {
    "lease 0": ["--lease-ms", "0"],
    "lease over a day": ["--lease-ms", "86400001"],
    "lease under 3 beats": ["--lease-ms", "29", "--heartbeat-ms", "10"],
    "heartbeat under 10": ["--heartbeat-ms", "9"],
    "concurrency 0": ["-c", "0"],
    "concurrency text": ["-c", "many"],
    "batch 0": ["--batch", "0"],
    "batch over 1000": ["--batch", "1001"],
    "grace negative": ["--grace", "-1"],
    "grace nan": ["--grace", "nan"],
    "grace inf": ["--grace", "inf"],
    "abandoned threads 0": ["--max-abandoned-threads", "0"],
    "result ttl 0": ["--result-ttl-ms", "0"],
    "result ttl over a year": ["--result-ttl-ms", "99999999999999"],
    "queue with braces": ["-q", "evil}{x"],
    "empty queue": ["-q", ""],
    "empty worker id": ["--worker-id", ""],
    "burst in a pool": ["--burst", "-p", "2"],
    "processes 257": ["-p", "257"],
    "max jobs 0": ["--max-jobs", "0"],
    "metrics port 70000": ["--metrics-port", "70000"],
    "log level": ["--log-level", "loud"],
    "bad url": ["--url", "redis://x:notaport/0"],
}


@pytest.mark.parametrize("case", sorted(BAD_WORKER))
def test_bad_worker_flag_is_usage_before_any_io(
    private: redis.Redis, module_server: RedisProcess, case: str
) -> None:
    args = ["worker", "tests.workers.basic:registry", "--url", module_server.url,
            *BAD_WORKER[case]]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == exits.EXIT_USAGE, result.output
    assert "Traceback" not in result.output and result.stderr.strip()
    assert private.dbsize() == 0  # no worker record, no queue index entry


def test_worker_works_the_queue_scheduler_queue_names_as_enqueue_does(
    private: redis.Redis, module_server: RedisProcess
) -> None:
    """docs/cli.md: a single --queue defaults to env SCHEDULER_QUEUE; docs/guide/examples.md and
    examples/flask_app/tasks.py: SCHEDULER_QUEUE is read "by the worker and by the app", the
    worker started as `scheduler worker examples.flask_app.tasks:registry` (no -q). With it set,
    `scheduler enqueue` writes to that queue; a worker started the same way must work it."""
    env = {"SCHEDULER_QUEUE": "envq", "REDIS_URL": module_server.url}
    enq = CliRunner().invoke(main, ["enqueue", "noop"], env=env)
    assert enq.exit_code == 0, enq.output
    job_id = enq.stdout.strip()
    q = Queue(private, "envq")
    assert q.get_job(job_id).state == "due"  # enqueue honoured SCHEDULER_QUEUE
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler", "worker", "tests.workers.basic:registry", "--burst",
         "--log-level", "WARNING"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), TEST_REDIS_URL=module_server.url,
                           **env),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert q.get_job(job_id).state == "done", "the worker did not work SCHEDULER_QUEUE's queue"


# -- enqueue: more parity ----------------------------------------------------------------------
UNREACHABLE_BAD = {
    "in too long": ["--in", "999999d"],
    "at after 2200": ["--at", "2300-01-01T00:00:00Z"],
    "max attempts over the cap": ["--max-attempts", "1000001"],
    "job id of a schedule's run": ["--job-id", "schedule:x:1"],
    "key ttl without key": ["--key-ttl", "1h"],
    "payload out of range float": ["--payload", "[1e400]"],
    "task too long": ["--payload", "1", "--", "t" * 201],
}


@pytest.mark.parametrize("case", sorted(UNREACHABLE_BAD))
def test_bad_enqueue_is_usage_even_when_redis_is_down(case: str) -> None:
    """The API refuses these with BadArgument "before anything is sent" (docs/limits.md), so
    with no server at all; the CLI must say what is wrong (exit 2), not "cannot reach Redis"
    (exit 3: "try again", which cannot help). Flow options already are checked first."""
    from tests.redis_server import free_port

    args = UNREACHABLE_BAD[case]
    task = [] if "--" in args else ["t"]
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    result = CliRunner().invoke(main, ["enqueue", *task, *args, "--url", url])
    assert result.exit_code == exits.EXIT_USAGE, result.output
    assert "cannot reach" not in result.stderr


def test_schedules_add_bad_input_is_usage_even_when_redis_is_down() -> None:
    from tests.redis_server import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    args = ["schedules", "add", "s", "t", "--every", "1m", "--tz", "UTC", "--url", url]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == exits.EXIT_USAGE, result.output


def test_resending_a_job_id_changes_nothing_as_the_api(
    cli: Run, q: Queue, client: redis.Redis
) -> None:
    q.enqueue("t", {"v": 1}, job_id="same-1")
    before = dump_queue(client, q)
    again = cli("enqueue", "t", "-q", q.name, "--job-id", "same-1", "--payload", '{"v": 2}',
                "--in", "1h", "--priority", "7")  # fmt: skip
    assert ok(again) == "same-1"
    assert dump_queue(client, q) == before


def test_repeated_after_names_one_parent(cli: Run, q: Queue) -> None:
    parent = q.enqueue("t", None)
    child = ok(cli("enqueue", "t", "-q", q.name, "--after", parent, "--after", parent))
    fields = q.get_job(child).fields
    assert (fields["parents"], fields["waiting_for"]) == (parent, "1")
    [claimed] = q.claim("w", limit=5).jobs
    q.complete(claimed.id, claimed.token)
    assert q.get_job(child).state == "due"  # one completion frees it


def test_key_ttl_counts_from_the_run_time(cli: Run, q: Queue, client: redis.Redis) -> None:
    ok(cli("enqueue", "t", "-q", q.name, "--key", "later", "--in", "1h", "--key-ttl", "1h"))
    [idem] = [k for k in client.scan_iter(match=q.keys.pattern()) if ":idem:" in k]
    assert 2 * 3_600_000 - 60_000 < client.pttl(idem) <= 2 * 3_600_000


def test_key_ttl_defaults_to_a_day_past_the_run_time(
    cli: Run, q: Queue, client: redis.Redis
) -> None:
    ok(cli("enqueue", "t", "-q", q.name, "--key", "daily", "--in", "1h"))
    [idem] = [k for k in client.scan_iter(match=q.keys.pattern()) if ":idem:" in k]
    assert 25 * 3_600_000 - 60_000 < client.pttl(idem) <= 25 * 3_600_000


def test_partitioned_schedules_add_is_the_api_definition(cli: Run, pq: PartitionedQueue) -> None:
    assert pq.schedule("nightly", "t", {"a": 1}, cron="0 3 * * *", tz="Asia/Tokyo") == "created"
    out = cli("schedules", "add", "nightly", "t", "-q", pq.name, "--cron", "0 3 * * *",
              "--tz", "Asia/Tokyo", "--payload", '{"a": 1}')  # fmt: skip
    assert ok(out) == "nightly: unchanged"  # routed to the partition holding it


def test_schedules_add_honours_scheduler_queue(cli: Run, q: Queue) -> None:
    out = cli("schedules", "add", "s", "t", "--every", "1m", env={"SCHEDULER_QUEUE": q.name})
    assert ok(out) == "s: created"
    assert [s.name for s in q.list_schedules()] == ["s"]


# -- what the write commands accept, the read commands can print -------------------------------
DEEP = "[" * 600 + "]" * 600  # accepted: the parser's limit is near 1,000 levels


def test_a_deep_payload_enqueue_accepts_is_shown_by_jobs_show_and_list_json(
    cli: Run, q: Queue
) -> None:
    """`scheduler enqueue` (and Queue.enqueue) accept a 600-level payload; the read commands'
    --json then died of a RecursionError traceback (core/safety.py visible_bytes recurses two
    frames a level) while the text forms and the worker handle it."""
    job_id = ok(cli("enqueue", "t", "-q", q.name, "--payload", DEEP))
    assert ok(cli("jobs", "show", job_id, "-q", q.name))  # the text form copes
    for cmd in (["jobs", "show", job_id], ["jobs", "list", "--state", "due"]):
        result = cli(*cmd, "-q", q.name, "--json")
        assert not isinstance(result.exception, RecursionError), cmd
        assert result.exit_code == 0, (cmd, result.output[-300:])
        json.loads(result.stdout)


def test_a_deep_payload_schedules_add_accepts_is_listed_by_schedules_list_json(
    cli: Run, q: Queue
) -> None:
    assert ok(cli("schedules", "add", "s", "t", "-q", q.name, "--every", "1h", "--payload", DEEP))
    result = cli("schedules", "list", "-q", q.name, "--json")
    assert not isinstance(result.exception, RecursionError)
    assert result.exit_code == 0, result.output[-300:]
    json.loads(result.stdout)
