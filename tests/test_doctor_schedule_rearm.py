"""doctor --fix parks a recurring schedule's pending run that no worker can run (its payload
edited into no JSON) and, as claim's park does (lua/lib/rearm.lua), arms the schedule's next
run. Before, the report said only "repaired": the library Report, the CLI's text and --json
never said a new run was placed. Now lua/repair.lua answers with that run's id, the fixed
finding carries it (`next_run`), `Report.next_runs` lists them, --json has "next_run" and the
printed report names the run and counts it in its summary. Real scripts on a private Redis."""

from __future__ import annotations

import json

import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.admin.doctor import check_queue, repair_queue
from scheduler.cli.main import main


def _unrunnable_run(q: Queue, client: redis.Redis, name: str = "tick") -> str:
    q.schedule(name, "t", every_ms=60_000)
    run = str(client.hget(q.keys.schedule(name), "pending"))
    client.hset(q.keys.job(run), "payload", "{not json")  # by hand
    assert [i.code for i in check_queue(client, q.name)] == ["bad-payload"]
    return run


def _pending(q: Queue, client: redis.Redis, name: str = "tick") -> str:
    return str(client.hget(q.keys.schedule(name), "pending"))


def test_the_report_names_the_next_run_the_park_armed(q: Queue, client: redis.Redis) -> None:
    run = _unrunnable_run(q, client)
    plain = q.enqueue("t", 1)
    client.hset(q.keys.job(plain), "payload", "{not json")  # parked too, no schedule's run
    report = repair_queue(client, q.name)
    assert q.status(run) == "dead" and q.status(plain) == "dead"
    nxt = _pending(q, client)
    assert nxt not in ("", run) and client.zscore(q.keys.due, nxt) is not None  # armed
    assert {i.job_id: i.next_run for i in report.fixed} == {run: nxt, plain: None}
    assert [i.job_id for i in report.next_runs] == [run]
    assert report.remaining == []
    assert [i.next_run for i in report.fixed if i.job_id == run] == [nxt]


def test_the_cli_text_and_json_say_the_next_run_is_armed(
    q: Queue, client: redis.Redis, redis_url: str
) -> None:
    run = _unrunnable_run(q, client)
    runner = CliRunner(env={"COLUMNS": "200"})
    args = ["doctor", "--url", redis_url, "-q", q.name, "--no-server", "--fix"]
    res = runner.invoke(main, [*args, "--json"])
    assert res.exit_code == 0, res.output
    fixed = json.loads(res.output)["fixed"]
    assert [(f["job_id"], f["next_run"]) for f in fixed] == [(run, _pending(q, client))]
    # The same damage on a second schedule, shown as text.
    other = _unrunnable_run(q, client, "tock")
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    assert f"the schedule's next run is armed: {_pending(q, client, 'tock')}" in res.output
    assert other in res.output
    assert "1 repaired (1 schedule run(s) parked: next run armed)" in res.output


def test_a_check_without_fix_arms_nothing(q: Queue, client: redis.Redis, redis_url: str) -> None:
    run = _unrunnable_run(q, client)
    res = CliRunner().invoke(main, ["doctor", "--url", redis_url, "-q", q.name, "--no-server",
                                    "--json"])  # fmt: skip
    assert [f["next_run"] for f in json.loads(res.output)["findings"]] == [None]
    assert _pending(q, client) == run
