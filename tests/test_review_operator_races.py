"""Operator commands racing live workers or another operator, from a review: each race is
interleaved by hand (a hook at the moment the command waits), each test failed on the code it
was written against and names the promise it checks."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from scheduler import Queue
from scheduler.admin.inspection import server_now_ms
from scheduler.cli import dead as dead_cli
from scheduler.cli import dead_retention as retention_cli
from scheduler.cli import jobs as jobs_cli
from tests import test_cli_write
from tests.test_cli_write import Run, ok_json

cli = test_cli_write.cli  # the fixture: the CLI on the test's server

HOUR_MS = 3_600_000


def _park(q: Queue, job_id: str, error: BaseException) -> None:
    """A real dead letter (fail.lua's park); nothing else may be due when it is called."""
    q.enqueue("t", {}, job_id=job_id, max_attempts=1)
    (j,) = q.claim("w", limit=1).jobs
    assert j.id == job_id
    assert q.fail(j.id, j.token, error, retryable=False).status == "dead"


def _run_again_and_die(q: Queue, job_id: str, error: BaseException) -> None:
    """Another operator requeues the dead job, a worker runs it and it dies again."""
    assert q.requeue_dead([job_id]) == 1
    (j,) = q.claim("w2", limit=1).jobs
    assert j.id == job_id
    assert q.fail(j.id, j.token, error, retryable=False).status == "dead"


# -- dead purge / requeue: the selection is acted on after the confirmation ---------------------
@pytest.mark.parametrize(
    "verb, flt",
    [("purge", ["--error-type", "KeyError"]), ("purge", ["--older-than", "1h"]),
     ("requeue", ["--error-type", "KeyError"])],
)  # fmt: skip
def test_a_bulk_action_leaves_a_job_that_stopped_matching_its_filter_while_it_asked(
    cli: Run,
    q: Queue,
    client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    verb: str,
    flt: list[str],
) -> None:
    """`dead purge --error-type KeyError` selects the dead jobs, then asks. While it waits,
    another operator requeues one of them, it runs and dies again of a ValueError (and now,
    not hours ago). The purge deleted it for good all the same: a job its filter no longer
    selects, lost by a command that said it deletes KeyError (or old) dead letters only."""
    _park(q, "a", KeyError("gone"))
    _park(q, "b", KeyError("gone"))
    for jid in ("a", "b"):  # both died two hours ago
        old = int(client.hget(q.keys.job(jid), "dead_ms") or 0) - 2 * HOUR_MS
        client.hset(q.keys.job(jid), "dead_ms", old)
        client.zadd(q.keys.dead, {jid: old})

    def meanwhile(*_: Any, **__: Any) -> bool:
        _run_again_and_die(q, "b", ValueError("other"))
        return True

    # the confirmation (scheduler/cli/confirm.py, as dead.py imports it) runs the race instead
    monkeypatch.setattr(dead_cli, "confirm", lambda *_a, **_k: meanwhile())
    out = ok_json(cli("dead", verb, "--json", "-q", q.name, *flt))
    assert (out["matched"], out["done"], out["skipped"]) == (2, 1, 1)
    b = q.get_job("b")  # still there, and still dead (not requeued a second time)
    assert (b.state, b.fields["last_error_type"]) == ("dead", "ValueError")
    assert q.dead_ids() == ["b"]  # "a" purged or requeued as asked


# -- dead retention: a limit not given is kept, also one another operator just set ---------------
def test_setting_one_retention_limit_keeps_the_other_that_another_operator_set_meanwhile(
    cli: Run, q: Queue, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Operator A sets `--max-age 30d` (the count limit, 2, is kept). While A's command runs,
    operator B turns the count limit off to keep every dead job. A's write put the count limit
    it had read (2) back: B's `off` is silently undone and the next park deletes dead jobs B
    chose to keep."""
    for jid in ("d1", "d2"):
        _park(q, jid, KeyError("x"))
    q.set_dead_retention(max_count=2)
    real_beyond = retention_cli.beyond

    def meanwhile(*args: Any) -> int:
        monkeypatch.setattr(retention_cli, "beyond", real_beyond)  # B's command runs plainly
        b = cli("dead", "retention", "--json", "-q", q.name, "--max-count", "off", "--yes")
        assert ok_json(b)["max_count"] is None
        return real_beyond(*args)

    monkeypatch.setattr(retention_cli, "beyond", meanwhile)
    a = ok_json(cli("dead", "retention", "--json", "-q", q.name, "--max-age", "30d", "--yes"))
    assert (a["max_age_ms"], a["max_count"]) == (30 * 24 * HOUR_MS, None)
    assert retention_cli.read_limits(client, q.keys) == (30 * 24 * HOUR_MS, None)
    _park(q, "d3", KeyError("x"))
    assert sorted(q.dead_ids()) == ["d1", "d2", "d3"]  # B's `off`: nothing trimmed


# -- jobs show: the record and where it is stored, read as of one moment --------------------------
def test_jobs_show_never_shows_a_leased_record_in_no_place_while_its_worker_completes(
    cli: Run, q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`jobs show` read the record (state leased, token, lease) and then, in another read,
    where the job is stored. A worker completing the job between the two reads made it print a
    leased job that is in no place with an expiry: a state no stored job ever had."""
    jid = q.enqueue("t", {})
    (j,) = q.claim("w", limit=1).jobs
    real_now = server_now_ms
    done: list[str] = []

    def meanwhile(*args: Any) -> int:
        if not done:  # the worker completes between the command's reads
            done.extend(q.complete_many([(j.id, j.token, 1)]))
        return real_now(*args)

    monkeypatch.setattr(jobs_cli, "server_now_ms", meanwhile)
    data = ok_json(cli("jobs", "show", jid, "--json", "-q", q.name))
    assert done == ["done"]
    shown = (data["state"], data["places"], data["ttl_ms"] is not None)
    assert shown in [("leased", ["leased"], False), ("done", [], True)], shown
