"""A wrong password, and a user whose ACL lacks what the dashboard needs.

redis-py raises AuthenticationError as a ConnectionError, so a wrong password used to read as
"cannot reach Redis" (exit 3, which a supervisor retries forever; the dashboard's "Redis
unreachable"). It is exit 5 now, with the credentials named and the password never shown. And
the dashboard under a user without SCAN (the app role) answered bare 500s; its pages now name
the refused command and the role to use."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler._spawn import RedisProcess
from scheduler.cli.main import main
from scheduler.dashboard import Auth, create_app
from tests.redis_server import require_server

SECRET = "s3cret-Pa55"


@pytest.fixture(scope="module")
def server() -> Iterator[RedisProcess]:
    with RedisProcess(require_server("a server with a password"), tcp=True) as srv:
        admin = redis.Redis(unix_socket_path=srv.socket)
        admin.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", "noscan", "on", f">{SECRET}", "~*", "+@all", "-scan"
        )
        Queue(admin, "mail").enqueue("send", {"to": "a"})
        yield srv


def _url(server: RedisProcess, user: str, password: str) -> str:
    return f"redis://{user}:{password}@127.0.0.1:{server.port}/0"


def test_cli_exits_5_on_a_wrong_password_without_showing_it(server: RedisProcess) -> None:
    url = _url(server, "noscan", "wrong-" + SECRET)
    for args in (["stats", "-q", "mail"], ["enqueue", "t", "-q", "mail"]):
        got = CliRunner().invoke(main, [*args, "--url", url])
        assert got.exit_code == 5, (args, got.output)
        assert "refused the credentials" in got.stderr and "user and password" in got.stderr
        assert SECRET not in got.output


def test_worker_start_exits_5_on_a_wrong_password(server: RedisProcess) -> None:
    url = _url(server, "noscan", "wrong-" + SECRET)
    done = subprocess.run([sys.executable, "-m", "scheduler", "worker",
                           "tests.workers.basic:registry", "--url", url, "-q", "mail"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 5, done.stderr
    assert "refused the credentials" in done.stderr and SECRET not in done.stderr


def test_dashboard_names_the_wrong_credentials_and_the_missing_permission(
    server: RedisProcess,
) -> None:
    wrong = create_app(url=_url(server, "noscan", "wrong-" + SECRET), auth=Auth())
    with TestClient(wrong, raise_server_exceptions=False) as web:
        page = web.get("/")
        assert page.status_code == 500
        assert "Redis refused the login" in page.text and "user and password" in page.text
        assert SECRET not in page.text
    noscan = create_app(url=_url(server, "noscan", SECRET), auth=Auth())
    with TestClient(noscan, raise_server_exceptions=False) as web:
        for path in ("/", "/api/overview", "/schedules"):
            page = web.get(path)
            assert page.status_code == 500, path
            assert "may not run SCAN" in page.text and "operator role" in page.text, path
        assert web.get("/queues/mail").status_code == 200  # a named queue needs no SCAN
