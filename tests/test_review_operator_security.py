"""The operator surfaces under hostile stored data, from a security review: each test failed on
the code as reviewed. A producer (or anyone with write access to the queue's keys) controls
job ids in the indexes, every field of a job hash and its size; what the CLI and the dashboard
print of them must stay inert and bounded."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import Queue
from scheduler.cli.main import main
from tests.test_dashboard import csrf_of
from tests.test_dashboard_review import web_of

PAGE_MAX = 1_000_000  # bytes: a page must stay far below the megabytes a producer can store


def cli(redis_url: str, *args: str) -> Result:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, [*args, "--url", redis_url])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{args}: crashed") from result.exception
    return result


def hand_written_job(client: redis.Redis, q: Queue, job_id: str, **fields: str) -> None:
    """A job written with HSET / ZADD, as a producer-credential holder can: any id, any field."""
    mapping: dict[Any, Any] = {"task": "t", "payload": "null", "state": "due", "attempts": "0",
               "max_attempts": "3", "run_at_ms": "1", **fields}  # fmt: skip
    client.hset(q.keys.job(job_id), mapping=mapping)
    client.zadd(q.keys.due, {job_id: 1})


# -- CLI -------------------------------------------------------------------------------------
def test_doctor_by_hand_command_does_not_let_a_stored_id_start_a_shell_line(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    # An index entry without its hash: doctor prints the repair "ready to paste". The command
    # is a `scheduler doctor --fix   # runs ...` comment: a raw newline in the id ended the
    # comment, and the id's next line ran as a command of its own when pasted into a shell.
    client.zadd(q.keys.due, {"x\ntouch /tmp/pwned #": 1})
    out = cli(redis_url, "doctor", "--no-server", "-q", q.name).stdout
    assert "missing-hash" in out, out
    assert not [line for line in out.splitlines() if line.startswith("touch")], out
    assert "'x\\x0atouch /tmp/pwned #'" in out, out  # shown, escaped, within its quotes


def test_doctor_shows_a_stored_id_as_stored_not_through_markup(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    # Printed through escaped rich markup, an id ending in '\' gained a second one and an
    # emoji code in it was replaced ('x:warning:' shown as 'x⚠'): not the id to act on.
    client.zadd(q.keys.due, {"bs\\": 1, "e:warning:x": 2})
    out = cli(redis_url, "doctor", "--no-server", "-q", q.name).stdout
    assert "job bs\\: id is in due" in out, out
    assert "job e:warning:x: id is in due" in out, out


def test_jobs_show_titles_a_job_with_its_id_as_given(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    job_id = "order:thumbs_up:42"  # a valid id (':' is allowed), also an emoji code
    hand_written_job(client, q, job_id)
    out = cli(redis_url, "jobs", "show", "-q", q.name, job_id).stdout
    assert f"job {job_id} in" in out, out


# -- dashboard -------------------------------------------------------------------------------
def _huge_payload(client: redis.Redis, q: Queue, job_id: str) -> None:
    client.hset(q.keys.job(job_id), "payload", json.dumps({"x": "A" * 3_000_000}))


def _huge_error(client: redis.Redis, q: Queue, job_id: str) -> None:
    client.hset(q.keys.job(job_id), mapping={"last_error_type": "E", "last_error": "B" * 3_000_000})


def _long_history(client: redis.Redis, q: Queue, job_id: str) -> None:
    entries = [{"type": "E", "message": "m" * 200, "attempt": i} for i in range(5_000)]
    client.hset(q.keys.job(job_id), "errors", json.dumps(entries))


def _many_fields(client: redis.Redis, q: Queue, job_id: str) -> None:
    client.hset(q.keys.job(job_id), mapping={f"f{i}": "v" * 50 for i in range(20_000)})


@pytest.mark.parametrize("plant", [_huge_payload, _huge_error, _long_history, _many_fields])
def test_a_huge_stored_value_does_not_make_a_huge_job_page(
    client: redis.Redis, q: Queue, plant: Callable[[redis.Redis, Queue, str], None]
) -> None:
    job_id = q.enqueue("mail.send", {"n": 1})
    plant(client, q, job_id)
    with web_of(client, q) as web:
        r = web.get(f"/queues/{q.name}/jobs/{job_id}")
    assert r.status_code == 200
    assert len(r.content) < PAGE_MAX, f"{plant.__name__}: a page of {len(r.content)} bytes"


def test_huge_stored_task_names_and_ids_do_not_make_a_huge_queue_page(
    client: redis.Redis, q: Queue
) -> None:
    for _ in range(10):
        client.hset(q.keys.job(q.enqueue("mail.send", None)), "task", "T" * 200_000)
    hand_written_job(client, q, "I" * 300_000)  # no job id is that long: an index entry
    with web_of(client, q) as web:
        r = web.get(f"/queues/{q.name}?state=due")
    assert r.status_code == 200 and "more characters not shown" in r.text
    assert len(r.content) < PAGE_MAX, f"a queue page of {len(r.content)} bytes"


def test_a_stored_state_is_shown_with_its_controls_neutralised(
    client: redis.Redis, q: Queue
) -> None:
    job_id = q.enqueue("mail.send", {})
    client.hset(q.keys.job(job_id), "state", "done\u202eeud")  # a hand-written state
    with web_of(client, q) as web:
        r = web.get(f"/queues/{q.name}/jobs/{job_id}")
    assert r.status_code == 200 and "done\\u202eeud" in r.text
    assert "\u202e" not in r.text, "the state badge shows the stored state's controls raw"


def test_a_non_ascii_csrf_token_is_refused_not_a_server_error(
    client: redis.Redis, q: Queue
) -> None:
    job_id = q.enqueue("mail.send", {})
    with web_of(client, q) as web:
        csrf = csrf_of(web.get(f"/queues/{q.name}/jobs/{job_id}").text)
        forged = "é" + csrf[1:]
        r = web.post(f"/queues/{q.name}/jobs/{job_id}/cancel", data={"csrf": forged})
    assert r.status_code == 403, (r.status_code, r.text[:200])
    assert q.status(job_id) == "due"


def test_many_planted_schedules_do_not_make_a_huge_schedules_page(
    client: redis.Redis, q: Queue
) -> None:
    # The schedules set and hashes are plain keys: 20,000 planted schedules made an 18 MB page
    # that took 10 s to build, on every load (the queue and workers pages were already cut).
    q.schedule("s0", "mail.send", cron="* * * * *")
    fields: dict[Any, Any] = client.hgetall(q.keys.schedule("s0"))
    pipe = client.pipeline(transaction=False)
    for i in range(1, 20_000):
        pipe.hset(q.keys.schedule(f"s{i}"), mapping={**fields, "name": f"s{i}"})
    pipe.sadd(q.keys.schedules, *[f"s{i}" for i in range(20_000)])
    pipe.execute()
    with web_of(client, q) as web:
        client.config_resetstat()
        r = web.get("/schedules")
        # The definitions read, not only the rows shown, are cut (every one took ~1 s).
        reads = client.info("commandstats").get("cmdstat_hgetall", {}).get("calls", 0)
    assert r.status_code == 200
    assert len(r.content) < PAGE_MAX, f"a schedules page of {len(r.content)} bytes"
    assert 0 < reads <= 1_000, f"the schedules page read {reads} hashes"
    assert 'id="schedules-cut"' in r.text and "20000" in r.text, "the cut is not said"


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_the_session_cookie_is_secure_when_the_dashboard_is_served_over_https(
    client: redis.Redis, q: Queue, scheme: str
) -> None:
    """Over https the session cookie (it binds the CSRF token) is marked Secure, so a browser
    never sends it over plain http; over http (localhost) it cannot be, or it would be lost."""
    from starlette.testclient import TestClient

    from scheduler.dashboard import Auth, create_app

    app = create_app(client=client, queues=[q.name], auth=Auth())
    with TestClient(app, base_url=f"{scheme}://localhost") as web:
        cookie = web.get("/").headers["set-cookie"]
    # Lax: sent on a link followed from another site, never on its POST (docs/security.md).
    assert "samesite=lax" in cookie.lower() and "httponly" in cookie.lower()
    assert ("secure" in cookie.lower().replace("samesite", "")) == (scheme == "https")
