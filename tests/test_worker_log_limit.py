"""Repeated 'redis error during ...' warnings are capped (scheduler/worker/log_limit.py): while
a node stays down, each retrying loop logged one line a second for as long as it was down."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import redis.asyncio as aredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.log_limit import LogLimit
from scheduler.worker.registry import Registry


class _Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_a_burst_per_window_then_one_line_saying_how_many_were_held() -> None:
    clock = _Clock()
    limit = LogLimit(burst=3, window_s=60.0, clock=clock)
    got = [limit.admit("claim") for _ in range(10)]
    assert got[:2] == ["", ""] and "counted, not logged" in str(got[2])
    assert got[3:] == [None] * 7
    assert limit.admit("heartbeat") == ""  # another kind of line has its own budget
    clock.now_s += 59.9
    assert limit.admit("claim") is None
    clock.now_s += 0.2
    assert limit.admit("claim") == "; 8 more like it in the last 60s not logged"
    assert limit.admit("claim") == ""  # a new window
    clock.now_s += 120
    assert limit.admit("claim") == ""  # nothing held in that window: a plain line


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_the_workers_retry_warnings_are_capped_and_still_counted() -> None:
    log = logging.getLogger("test.log_limit")
    lines = _Lines()
    log.addHandler(lines)
    try:
        client = aredis.Redis(unix_socket_path="/nonexistent/r.sock")  # never connected
        w = Worker(client, Registry(), WorkerSettings(queues=("q",)), logger=log)
        for _ in range(30):
            w._redis_error("claim", RedisConnectionError("Error 111 connecting"))
        w._redis_error("claim", RedisTimeoutError("Timeout reading"))
        w._redis_error("heartbeat", RedisConnectionError("Error 111 connecting"))
    finally:
        log.removeHandler(lines)
    claims = [x for x in lines.lines if x.startswith("redis error during claim: Connection")]
    assert len(claims) == 5 and "counted, not logged" in claims[-1]
    assert sum("during claim: TimeoutError" in x for x in lines.lines) == 1
    assert sum("during heartbeat" in x for x in lines.lines) == 1
    counted = w.metrics.registry.get_sample_value("scheduler_redis_errors_total")
    assert counted == 32  # every error still counted


def test_the_reports_refused_lines_are_capped_and_say_how_many_were_held() -> None:
    """'complete refused' and 'fail of job ... errored' (reporting.py) had no cap: a refusal
    that met every outcome (a server answering each report with an error the worker cannot
    retry) logged one ERROR line per job for as long as it lasted. Now the first 5 of each
    kind, then, past the window, one saying how many were held back."""
    log = logging.getLogger("test.log_limit.reports")
    log.propagate = False
    lines = _Lines()
    log.addHandler(lines)
    clock = _Clock()
    try:
        client = aredis.Redis(unix_socket_path="/nonexistent/r.sock")  # never connected
        w = Worker(client, Registry(), WorkerSettings(queues=("q",)), logger=log)
        w._log_limit = LogLimit(clock=clock)  # the worker's limit, on a clock the test moves
        for i in range(20):
            run: Any = SimpleNamespace(queue="q", job=SimpleNamespace(id=f"j{i}"))
            w._completed([(run, None)], ResponseError("ERR refused by the server"))
            w._failed(run, ("E", "m", "tb"), True, ResponseError("ERR refused by the server"))
        clock.now_s += 60
        w._completed([(run, None)], ResponseError("ERR refused by the server"))
        w._failed(run, ("E", "m", "tb"), True, ResponseError("ERR refused by the server"))
    finally:
        log.removeHandler(lines)
    for kind in ("complete refused: ERR refused", "errored: ERR refused"):
        got = [x for x in lines.lines if kind in x]
        assert len(got) == 6, lines.lines  # 5 in the window, then 1 in the next
        assert got[0].endswith("ERR refused by the server"), got
        assert "more like it are counted, not logged" in got[4], got
        assert got[5].endswith("; 15 more like it in the last 60s not logged"), got
    assert "fail of job j0 errored" in lines.lines[1], lines.lines  # the first ones are kept
