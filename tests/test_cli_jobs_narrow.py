"""`jobs list` and `workers` at 80 columns (issue 14's CLI list: tables readable at 80 columns
and in a pipe): one block per job or worker, so task names, worker ids and words are never
folded by character nor cut to '…'; wide consoles and pipes keep the table. A lapsed lease
reads as lapsed, not a negative time left."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import Queue
from scheduler.admin.inspection import server_now_ms
from scheduler.cli.main import main

Run = Callable[..., Result]
TASK = "billing.invoices.render-monthly-statement"
WORKER = "worker-host-eu-west-1b:4242:9f8e7d6c"


@pytest.fixture
def cli(redis_url: str) -> Callable[[str], Run]:
    def at(columns: str) -> Run:
        runner = CliRunner(env={"COLUMNS": columns})
        return lambda *args: runner.invoke(main, [*args, "--url", redis_url])

    return at


def leased_and_dead(q: Queue) -> tuple[str, str]:
    dead = q.enqueue(TASK, 1, max_attempts=1)
    (job,) = q.claim(WORKER, limit=1).jobs
    q.fail(dead, job.token, ValueError("the renderer ran out of memory on a 900 page statement"))
    leased = q.enqueue(TASK, 2)
    q.claim(WORKER, limit=1)
    return leased, dead


@pytest.mark.parametrize("state", ["leased", "dead"])
def test_at_80_columns_nothing_is_folded_by_character(
    cli: Callable[[str], Run], q: Queue, state: str
) -> None:
    ids = dict(zip(("leased", "dead"), leased_and_dead(q), strict=True))
    res = cli("80")("jobs", "list", "-q", q.name, "--state", state)
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert max(len(line) for line in out.splitlines()) <= 80, out
    words = set(out.split())
    assert {ids[state], TASK} <= words, out
    if state == "leased":
        assert WORKER in words
    else:
        assert {"memory", "statement", "exhausted"} <= words


def test_a_wide_console_keeps_the_table(cli: Callable[[str], Run], q: Queue) -> None:
    leased_and_dead(q)
    out = cli("200")("jobs", "list", "-q", q.name, "--state", "leased").stdout
    assert "┃ id" in out and WORKER in out and TASK in out


def test_a_lapsed_lease_reads_as_lapsed(
    cli: Callable[[str], Run], q: Queue, client: redis.Redis
) -> None:
    leased, _ = leased_and_dead(q)
    client.zadd(q.keys.leased, {leased: server_now_ms(client) - 90_000})
    for columns in ("80", "200"):
        out = cli(columns)("jobs", "list", "-q", q.name, "--state", "leased").stdout
        text = " ".join(out.split())  # the block wraps by word at 80 columns
        assert "lease lapsed 1m3" in text and "left -" not in text, out


def test_workers_at_80_columns_cut_nothing(
    cli: Callable[[str], Run], q: Queue, client: redis.Redis
) -> None:
    """Eight columns at 80 cut the queues and the start time to '…': a block per worker."""
    now = server_now_ms(client)
    queues = f"{q.name},billing-invoices,notifications-email"
    client.zadd(q.keys.workers, {WORKER: now})
    client.hset(q.keys.worker(WORKER), mapping={"host": "eu-west-1b-node-17", "pid": 4242,
        "queues": queues, "started_ms": now - 5_000, "last_heartbeat_ms": now,
        "in_flight": 3, "concurrency": 8, "stopping": ""})  # fmt: skip
    client.pexpire(q.keys.worker(WORKER), 60_000)
    out = cli("80")("workers", "-q", q.name).stdout
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80, out
    assert {WORKER, queues, "eu-west-1b-node-17"} <= set(out.split()) and "3 / 8" in out
    wide = cli("200")("workers", "-q", q.name).stdout
    assert "┃ queue" in wide and queues in wide
