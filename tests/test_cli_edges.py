"""CLI edges found this session: `scheduler worker --metrics-port` on a port already taken (one
line and exit 1, not a traceback: the OSError of prometheus-client's bind ended the worker as a
crash), and doctor on a queue left with job records but none of the keys queue_exists reads."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.cli.main import main


def test_a_taken_metrics_port_is_one_line_and_exit_1(redis_url: str) -> None:
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        cmd = [sys.executable, "-c", "from scheduler.cli.main import main; main()", "worker",
               "tests.workers.basic:registry", "--url", redis_url, "-q", "metricsport",
               "--metrics-port", str(port)]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert f"error: cannot serve metrics on port {port}" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_doctor_takes_a_queue_whose_sets_are_gone_and_puts_its_job_back(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    """Before: with due deleted by hand, the queue's pending job (its spec alone) made no key
    queue_exists looks at, and doctor refused 'no queue named ... known: <that queue>'."""
    job = q.enqueue("t")
    client.delete(q.keys.due)
    for stats in client.scan_iter(match=q.keys.prefix + "stats:*"):
        client.delete(stats)
    runner = CliRunner()
    found = runner.invoke(main, ["doctor", "--url", redis_url, "-q", q.name])
    assert "orphan-spec" in found.output, found.output
    # The repair is shown as what --fix runs (it was labelled "by hand:", which it is not).
    assert "what --fix runs:" in found.output and "by hand:" not in found.output
    fixed = runner.invoke(main, ["doctor", "--fix", "--url", redis_url, "-q", q.name])
    assert "1 repaired" in fixed.output, fixed.output  # (the test server's settings remain)
    assert client.zscore(q.keys.due, job) is not None
    gone = runner.invoke(main, ["doctor", "--url", redis_url, "-q", "no-such-queue-xyz"])
    assert gone.exit_code == 1 and "no queue named 'no-such-queue-xyz'" in gone.output


def test_a_corrupt_key_at_worker_start_is_exit_1_not_cannot_reach(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """CorruptKey is transient to a running worker (it backs off until the key is fixed), but a
    start that meets one must not say 'cannot reach Redis' with exit 3, the code a supervisor
    restarts on: restarting cannot fix a key edited by hand."""
    from scheduler import CorruptKey
    from scheduler.cli.worker_start import start_failure
    from scheduler.core.exits import EXIT_ERROR

    spoiled = CorruptKey("due is not a zset (nothing written)")
    assert start_failure(spoiled, "redis://h") == EXIT_ERROR
    err = capsys.readouterr().err
    assert "edited by hand" in err and "scheduler doctor" in err and "cannot reach" not in err
