"""An operator's stop or quiet of a `--processes` pool's child (`scheduler workers stop|quiet`):
the child is not replaced by its supervisor (before, it exited 0 and was started again at once,
as after --max-jobs: a pool could not be stopped from afar), and once every child was stopped
this way the supervisor exits 0. Real pools of real worker processes."""

from __future__ import annotations

from pathlib import Path

import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.cli.main import main
from tests.test_worker_pool import children, ledger_pids, spawn_pool, stop
from tests.workers.procs import wait_for

FAST = ("--heartbeat-ms", "100", "--lease-ms", "3000")


def cli(url: str, *args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, [*args, "--url", url])
    return res.exit_code, res.output


def test_a_stopped_child_is_not_replaced_and_a_quieted_last_one_stops_the_pool(
    redis_url: str, client: redis.Redis, q: Queue, pool_log: Path
) -> None:
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--worker-id", "pw", *FAST,
                      log=pool_log)  # fmt: skip
    try:
        wait_for(lambda: len(children(pool.pid)) == 2, what="two children")
        wait_for(lambda: cli(redis_url, "workers", "-q", q.name)[1].count("pw.") == 2,
                 what="both listed")  # fmt: skip
        first, second = children(pool.pid)
        code, out = cli(redis_url, "workers", "stop", "pw.1", "-q", q.name)
        assert code == 0, out
        # The verb is named: the child's exit code says which one (stop: 86, quiet: 87).
        stopped = "(scheduler workers stop): not replaced; 1 of 2 processes left"
        wait_for(lambda: stopped in pool_log.read_text(), what="the stopped child gone")
        # The other one works on; long enough for a replacement to have started (1 s).
        ids = [q.enqueue("sync_sleep", {"s": 0.05}) for _ in range(30)]
        wait_for(lambda: all(q.status(i) == "done" for i in ids), timeout_s=60, what="all done")
        remaining = children(pool.pid)
        assert len(remaining) == 1 and remaining[0] in (first, second), remaining
        assert set(ledger_pids(client, q)) == set(remaining)
        assert "starting another" not in pool_log.read_text()
        assert pool.poll() is None
        code, out = cli(redis_url, "workers", "quiet", "--all", "--yes", "-q", q.name)
        assert code == 0, out
        assert pool.wait(30) == 0, pool_log.read_text()[-2000:]
    finally:
        stop(pool, pool_log)
    log = pool_log.read_text()
    assert (
        "(scheduler workers quiet): not replaced; 0 of 2 processes left: the pool stops" in log
    ), log[-2000:]
    assert "starting another" not in log


def test_stop_all_stops_the_whole_pool(
    redis_url: str, client: redis.Redis, q: Queue, pool_log: Path
) -> None:
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--worker-id", "pa", *FAST,
                      log=pool_log)  # fmt: skip
    try:
        wait_for(lambda: cli(redis_url, "workers", "-q", q.name)[1].count("pa.") == 2,
                 what="both listed")  # fmt: skip
        code, out = cli(redis_url, "workers", "stop", "--all", "--yes", "-q", q.name)
        assert code == 0, out
        assert pool.wait(30) == 0, pool_log.read_text()[-2000:]
    finally:
        stop(pool, pool_log)
    assert "the pool stops" in pool_log.read_text()
    assert children(pool.pid) == []


def test_the_retired_codes_are_no_commands_exit_codes() -> None:
    """EXIT_RETIRED (stop) and EXIT_QUIETED (quiet) are seen by a supervisor alone: they must
    not mean anything in the table, and each names its own verb."""
    from scheduler.cli.worker_pool_child import EXIT_QUIETED, EXIT_RETIRED, RETIRED_BY, retired_code
    from scheduler.core.exits import EXIT_CODES

    assert not {EXIT_RETIRED, EXIT_QUIETED} & {code for code, _ in EXIT_CODES}
    assert RETIRED_BY == {EXIT_RETIRED: "stop", EXIT_QUIETED: "quiet"}
    assert [retired_code(v) for v in ("stop", "quiet")] == [EXIT_RETIRED, EXIT_QUIETED]
