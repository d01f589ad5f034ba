"""The operator CLI, from a review (scheduler/cli/*.py but dashboard, schedules, dead): each
test failed on the code it was written against."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import Queue
from scheduler.admin.inspection import live_workers
from scheduler.cli import demo
from scheduler.cli.demo_tasks import LEDGER
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core import exits
from tests.conftest import delete_queue

Run = Callable[..., Result]
ROOT = Path(__file__).resolve().parents[1]
SCHEDULER = str(Path(sys.executable).parent / "scheduler")
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")
PASSWORD = "pw-Review-7q"


@pytest.fixture
def cli(redis_url: str) -> Run:
    runner = CliRunner(env={"COLUMNS": "200"})

    def run(*args: str, url: str = redis_url) -> Result:
        return runner.invoke(main, [*args, "--url", url])

    return run


def worker(redis_url: str, queue: str, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, TEST_REDIS_URL=redis_url, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [SCHEDULER, "worker", "tests.workers.basic:registry", "--url", redis_url, "-q", queue,
         "--log-level", "WARNING", *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def finished(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out


# -- enqueue -------------------------------------------------------------------------------
def test_enqueue_a_deeply_nested_payload_is_bad_input(cli: Run, q: Queue) -> None:
    result = cli("enqueue", "t", "-q", q.name, "--payload", "[" * 50_000 + "]" * 50_000)
    assert result.exit_code == exits.EXIT_USAGE, repr(result.exception)
    assert q.counts().due == 0


def test_enqueue_prints_a_stored_id_with_controls_escaped(
    cli: Run, q: Queue, client: redis.Redis
) -> None:
    q.enqueue("t", key="k1")
    (idem,) = client.scan_iter(match=q.keys.prefix + "idem:*")
    client.set(idem, "evil\x07\r\x08id")  # hand-edited in redis-cli
    result = cli("enqueue", "t", "--key", "k1", "-q", q.name)
    assert result.exit_code == 0, result.output
    assert not RAW_CONTROL.findall(result.stdout.rstrip("\n")), repr(result.stdout)


# -- stats, keys ---------------------------------------------------------------------------
@pytest.mark.parametrize("interval", ["nan", "inf"])
def test_stats_watch_refuses_an_interval_that_is_no_number(
    cli: Run, q: Queue, interval: str
) -> None:
    q.enqueue("t")
    result = cli("stats", "--watch", "--json", "--count", "2", "--interval", interval, "-q", q.name)
    assert result.exit_code == exits.EXIT_USAGE, result.output
    assert result.stdout == ""


@pytest.mark.pq(partitions=2)
def test_keys_of_a_partitioned_queue_points_at_its_jobs(cli: Run, pq: PartitionedQueue) -> None:
    for n in range(2):
        pq.enqueue("t", {"n": n})
    result = cli("keys", "--json", "-q", pq.name)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["exists"] is True, "a queue holding 2 jobs is shown as having no keys"
    assert pq.parts[0].keys.prefix in result.stdout


# -- hand-edited keys ----------------------------------------------------------------------
@pytest.fixture
def broken_layout(client: redis.Redis, queue_name: str) -> Iterator[str]:
    """A queue whose partition record was hand-edited into something no version wrote."""
    prefix = f"sched:{{{queue_name}}}:"
    client.set(prefix + "partitions", "garbage")
    client.zadd(prefix + "due", {"x": 1})
    yield queue_name
    client.delete(prefix + "partitions", prefix + "due")


@pytest.mark.parametrize(
    "cmd", [["stats"], ["workers"], ["doctor", "--no-server"], ["stats", "-q"],
            ["enqueue", "t", "-q"]], ids=" ".join,
)  # fmt: skip
def test_a_hand_edited_partition_record_is_not_bad_usage(
    cli: Run, broken_layout: str, cmd: list[str]
) -> None:
    args = [*cmd, broken_layout] if cmd[-1] == "-q" else cmd
    result = cli(*args)
    assert result.exit_code != exits.EXIT_USAGE, result.output


def test_doctor_reports_a_wrong_type_due_key_as_a_finding(
    cli: Run, q: Queue, client: redis.Redis
) -> None:
    client.set(q.keys.due, "hand-written")
    result = cli("doctor", "--no-server", "--json", "-q", q.name)
    assert result.stdout.startswith("{"), result.output
    codes = [f["code"] for f in json.loads(result.stdout)["findings"]]
    assert "wrong-type" in codes and result.exit_code == exits.EXIT_FAILED


def test_stats_of_every_queue_survives_one_wrong_type_key(
    cli: Run, q: Queue, client: redis.Redis, queue_name: str
) -> None:
    q.enqueue("t")
    other = Queue(client, queue_name + "-b")
    client.rpush(other.keys.due, "hand-written")
    try:
        result = cli("stats", "--json")
    finally:
        client.delete(other.keys.due)
    assert f'"{q.name}"' in result.stdout, result.output


# -- worker start-up -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "args", [["--metrics-port", "70000"], ["--lease-ms", "86400001"]], ids=" ".join
)
def test_worker_refuses_out_of_range_settings_as_usage(
    redis_url: str, q: Queue, args: list[str]
) -> None:
    code, out = finished(worker(redis_url, q.name, *args))
    assert code == exits.EXIT_USAGE, out
    assert "Traceback" not in out


def test_worker_refuses_a_nan_grace(redis_url: str, q: Queue, client: redis.Redis) -> None:
    proc = worker(redis_url, q.name, "--grace", "nan")
    deadline = time.monotonic() + 30
    while proc.poll() is None and not live_workers(client, q.keys)[0]:
        assert time.monotonic() < deadline, "the worker neither refused nor started"
        time.sleep(0.05)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    code, out = finished(proc)
    assert code == exits.EXIT_USAGE, out


def test_worker_on_a_wrong_type_partition_key_is_not_unreachable(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    key = f"sched:{{{queue_name}}}:partitions"
    client.hset(key, "a", "b")
    try:
        code, out = finished(worker(redis_url, queue_name))
    finally:
        client.delete(key)
    assert code != exits.EXIT_UNREACHABLE and "cannot reach" not in out, out


def test_worker_on_a_hand_edited_partition_record_prints_no_traceback(
    redis_url: str, broken_layout: str
) -> None:
    code, out = finished(worker(redis_url, broken_layout))
    assert code != exits.EXIT_OK and "Traceback" not in out, out


# -- demo ----------------------------------------------------------------------------------
def with_password(url: str) -> str:
    return url.replace("://", f"://default:{PASSWORD}@", 1)  # the default user has nopass


def test_demo_keep_on_a_given_url_never_prints_its_password(
    redis_url: str, client: redis.Redis
) -> None:
    result = CliRunner().invoke(main, ["demo", "--url", with_password(redis_url), "--keep"])
    delete_queue(client, Queue(client, "demo"))
    client.delete(LEDGER)
    assert result.exit_code == 0, result.output
    assert PASSWORD not in result.output


def test_demo_workers_get_the_password_from_the_environment_not_argv(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[list[str]] = []

    def popen(cmd: list[str], **_: Any) -> Any:
        seen.append(cmd)
        return None

    monkeypatch.setattr(subprocess, "Popen", popen)  # demo.py calls subprocess.Popen
    demo._spawn(with_password("redis://127.0.0.1:1/0"))
    (cmd,) = seen
    assert not any(PASSWORD in part for part in cmd), cmd
