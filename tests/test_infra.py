"""The test and CI infrastructure itself: the one spawner (scheduler._spawn), the server choice
(SCHEDULER_TEST_SERVER), and the Makefile stages that CI runs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis

import scheduler._spawn as spawn
from scheduler.cli.embedded import PrivateRedis
from tests import redis_server
from tests.redis_server import SERVER_ENV, RedisProcess, require_server, server_kind

ROOT = Path(__file__).resolve().parent.parent


def test_the_session_server_is_the_one_asked_for(client: redis.Redis) -> None:
    if os.environ.get("REDIS_URL") and not os.environ.get(SERVER_ENV):
        pytest.skip("REDIS_URL: a server this run did not start")
    info = client.info("server")
    assert ("valkey_version" in info) == (server_kind() == "valkey"), info.get("server_name")


def test_unknown_server_kind_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SERVER_ENV, "memcached")
    with pytest.raises(pytest.UsageError, match="memcached"):
        server_kind()


def test_a_missing_server_fails_under_ci_and_skips_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_server, "find_redis_server", lambda: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="not found"):
        require_server("infra test")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        require_server("infra test")


def test_valkey_binary_is_installed_with_the_test_extra() -> None:
    path = spawn.valkey_binary()
    assert path is not None and os.access(path, os.X_OK)


def test_restart_hard_keeps_acknowledged_data_and_port() -> None:
    binary = require_server("a server to kill")
    with RedisProcess(binary, ("--appendonly", "yes", "--appendfsync", "always"), tcp=True) as srv:
        port = srv.port
        with srv.client() as c:
            c.set("k", "v")
        srv.restart(hard=True)
        assert (srv.restarts, srv.port) == (1, port)
        with redis.Redis.from_url(srv.tcp_url, decode_responses=True) as c:
            assert c.get("k") == "v"
        d = srv.dir
    assert not os.path.exists(d) and not srv.running


def test_a_taken_port_is_picked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    binary = require_server("a server on TCP")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = int(taken.getsockname()[1])
        picks = [busy]
        real = spawn.free_port
        monkeypatch.setattr(spawn, "free_port", lambda: picks.pop() if picks else real())
        with RedisProcess(binary, tcp=True) as srv:
            assert srv.port != busy and picks == []
            assert srv.client().ping()


def test_a_server_that_cannot_start_says_where_its_log_is() -> None:
    binary = require_server("a server with a bad option")
    srv = RedisProcess(binary, ("--no-such-option", "1"))
    with pytest.raises(RuntimeError, match=r"redis\.log"):
        srv.start()
    srv.cleanup()
    assert not os.path.exists(srv.dir)


def test_private_redis_for_the_demo_starts_and_removes_its_dir() -> None:
    with PrivateRedis(require_server("the demo server")) as srv:
        assert srv.socket.startswith(srv.dir) and len(srv.socket) < 100
        assert srv.client().ping()
    assert not os.path.exists(srv.dir)


@pytest.fixture
def make() -> str:
    return redis_server.require_binary("make", "the Makefile stages")


def test_make_test_runs_every_stage(make: str) -> None:
    out = subprocess.run([make, "-n", "test"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    assert "ruff check" in out and "ruff format --check" in out and "mypy" in out
    assert ".venv/bin/python -m pytest -n " in out
    assert "SCHEDULER_TEST_SERVER=valkey" in out and "tests/test_walkthrough.py" in out
    assert ".venv-lowest-redis/bin/python -m pytest" in out and "tests/faults/test_crash.py" in out
    lowest = next(ln for ln in out.splitlines() if ".venv-lowest-redis/bin/python -m pytest" in ln)
    assert "tests/test_direct_pool.py" in lowest  # the direct I/O path on the lowest redis-py


def test_the_lowest_redis_venv_gets_the_floor_of_pyproject(make: str) -> None:
    out = subprocess.run([make, "-n", "-B", ".venv-lowest-redis/.installed-test"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    floors = [line.split(">=")[1].split('"')[0]
              for line in (ROOT / "pyproject.toml").read_text().splitlines()
              if line.strip().startswith('"redis[hiredis]>=')]  # fmt: skip
    assert len(floors) == 1
    assert f"'redis[hiredis]=={floors[0]}.*'" in out


def test_a_stage_that_runs_no_test_fails_loudly(make: str) -> None:
    # -o install-test: no pip here; this interpreter's venv; WORKERS=0: no xdist for an empty run.
    run = subprocess.run([make, "-o", "install-test", "test-valkey", f"VENV={sys.prefix}",
                          "WORKERS=0", "CONFORMANCE=tests/__init__.py", "HAND_EDITS="], cwd=ROOT,
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode != 0
    # The message itself, not make's echo of the recipe that contains it.
    assert (
        "FAILED: pytest ran no test (conformance and hand edits on Valkey)"
        in run.stdout.splitlines()
    )


def test_ci_script_runs_make_test() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    assert "set -euo pipefail" in script and "make -k test" in script


def test_slow_first_names_modules_that_exist() -> None:
    # tests/slow_first.txt orders the run (conftest): a renamed or deleted module left there
    # orders nothing, and the long one it stood for would again start in collection order.
    from pathlib import Path

    from tests.conftest import slow_first

    root = Path(__file__).parent.parent
    names = list(slow_first())
    assert len(names) >= 10
    for name in names:
        assert name.startswith("tests/") and name.endswith(".py"), name
        assert (root / name).is_file(), name
