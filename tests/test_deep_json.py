"""Stored JSON nested deeper than Python's parser goes (a hand edit, or a hostile holder of the
app role): json.loads raises RecursionError, not ValueError. Every reader shows such a value as
text with a "not JSON" note, or refuses it with a typed error; before, `jobs show`, `jobs list`,
`dead list` and `doctor` ended in a RecursionError traceback, and `Queue.result()` raised it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner
from starlette.testclient import TestClient

from scheduler import Queue, UnreadableRecord
from scheduler._spawn import RedisProcess
from scheduler.cli.main import main
from scheduler.dashboard import Auth, create_app

DEEP = "[" * 5000 + "]" * 5000  # far past the C parser's recursion limit (~1000)


@pytest.fixture
def jobs(module_server: RedisProcess) -> Iterator[tuple[Queue, str, str]]:
    """A dead job whose payload and a done job whose result are DEEP."""
    raw = redis.Redis.from_url(module_server.url)
    raw.flushall()
    q = Queue.from_url(module_server.url, "deep")
    dead = q.enqueue("t", {"a": 1}, max_attempts=1)
    done = q.enqueue("t", {"a": 2})
    got = {j.id: j for j in q.claim("w", limit=2, lease_ms=60_000).jobs}
    q.fail(dead, got[dead].token, ("E", "boom", ""))
    q.complete(done, got[done].token, {"ok": 1})
    raw.hset(q.keys.job(dead), "payload", DEEP)
    raw.hset(q.keys.job(done), "result", DEEP)
    yield q, dead, done


def test_cli_readers_show_deep_json_as_text(
    jobs: tuple[Queue, str, str], module_server: RedisProcess
) -> None:
    q, dead, done = jobs
    base = ["--url", module_server.url, "-q", q.name]
    for args in (["jobs", "show", dead], ["jobs", "show", dead, "--json"],
                 ["jobs", "show", done], ["jobs", "list", "--state", "dead"],
                 ["dead", "list"], ["dead", "list", "--json"]):  # fmt: skip
        got = CliRunner().invoke(main, [*args, *base])
        assert got.exception is None or isinstance(got.exception, SystemExit), (args, got.output)
        assert got.exit_code == 0, (args, got.output)
        assert "Traceback" not in got.output and "RecursionError" not in got.output
    shown = CliRunner().invoke(main, ["jobs", "show", dead, *base])
    assert "not JSON" in shown.output
    # doctor reads every job: the deep one is a finding, the run goes on to the end.
    checked = CliRunner().invoke(main, ["doctor", *base])
    assert checked.exception is None or isinstance(checked.exception, SystemExit), checked.output
    assert checked.exit_code in (0, 1), checked.output
    assert "Traceback" not in checked.output


def test_result_of_a_deep_result_is_a_typed_refusal(jobs: tuple[Queue, str, str]) -> None:
    q, _, done = jobs
    with pytest.raises(UnreadableRecord, match="result is not JSON"):
        q.result(done, timeout_s=1)


def test_dashboard_job_pages_show_deep_json(
    jobs: tuple[Queue, str, str], module_server: RedisProcess
) -> None:
    q, dead, done = jobs
    with TestClient(create_app(url=module_server.url, auth=Auth())) as web:
        for job in (dead, done):
            page = web.get(f"/queues/{q.name}/jobs/{job}")
            assert page.status_code == 200, page.text[-500:]
        assert web.get(f"/queues/{q.name}/dead").status_code == 200
