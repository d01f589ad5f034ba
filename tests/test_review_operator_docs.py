"""The operator's view, as the docs show it: README's `redis-cli` lines and key schema, the
`scheduler` commands' words, JSON fields and exit codes (scheduler/core/exits.py), the glossary's
state words, and the CLI's answer to an operator's mistake (an unreachable URL, a wrong
password, a queue or job id that does not exist, a URL that is not a Redis at all).

Everything runs against a private TCP redis-server (the doc lines name a host and port) holding
a queue with a job in each state: due, scheduled, leased, retrying, dead, finished (done and
cancelled), held by flow control. tests/test_doc_snippets.py only parses the doc's command lines
and tests/test_cli_language.py checks the unknown-queue refusal for the commands it lists; the
tests here run what those leave out. The strict xfails are defects (see each reason)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import Queue
from scheduler.cli.main import main
from scheduler.core import exits
from scheduler.core.connection import connect
from tests.conftest import dump_queue
from tests.fixtures.not_redis import http_listener
from tests.redis_server import RedisProcess, require_server

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
GLOSSARY = (ROOT / "docs" / "glossary.md").read_text()
Run = Callable[..., Result]
USER, PASSWORD = "rvop", "right-pw"


@pytest.fixture(scope="module")
def server() -> Iterator[RedisProcess]:
    """A private server on a TCP port (the doc's lines and the CLI's fixes name host and port),
    with an ACL user whose password the wrong-password tests get wrong."""
    with RedisProcess(require_server("the operator docs review"), tcp=True) as srv:
        c = redis.Redis(host="127.0.0.1", port=srv.port)
        c.execute_command("ACL", "SETUSER", USER, "on", f">{PASSWORD}", "~*", "&*", "+@all")  # type: ignore[no-untyped-call]
        c.close()
        yield srv


@pytest.fixture
def url(server: RedisProcess) -> Iterator[str]:
    c = connect(server.tcp_url)
    c.flushall()
    c.close()
    yield server.tcp_url


@pytest.fixture
def client(url: str) -> Iterator[redis.Redis]:
    c = connect(url)
    yield c
    c.close()


@pytest.fixture
def cli(url: str) -> Run:
    # REDIS_URL unset: a line the CLI prints must reach the server by itself, not by the env.
    runner = CliRunner(env={"COLUMNS": "200", "REDIS_URL": None, "SCHEDULER_QUEUE": None})

    def run(*args: str, at: str | None = None, input: str | None = None) -> Result:
        return runner.invoke(main, [*args, "--url", at or url], input=input)

    return run


def states(client: redis.Redis, name: str = "emails") -> tuple[Queue, dict[str, str]]:
    """A queue with one job in each state a job can be in; the ids by state word."""
    q = Queue(client, name)
    q.enqueue("mail.bounce", {"n": 1}, max_attempts=1, job_id="j-dead")
    q.enqueue("mail.retry", {"n": 2}, max_attempts=3, job_id="j-retry")
    q.enqueue("mail.done", {"n": 3}, job_id="j-done")
    q.enqueue("mail.lease", {"n": 4}, job_id="j-leased")
    tokens = {j.id: j.token for j in q.claim("w1", limit=4, lease_ms=600_000).jobs}
    assert sorted(tokens) == ["j-dead", "j-done", "j-leased", "j-retry"]
    q.fail("j-dead", tokens["j-dead"], ("ValueError", "bad address", "tb"))
    q.fail("j-retry", tokens["j-retry"], ("TimeoutError", "smtp slow", "tb"), delay_ms=3_600_000)
    q.complete("j-done", tokens["j-done"], {"ok": True})
    q.enqueue("mail.send", {"n": 5}, job_id="j-due")
    q.enqueue("mail.send", {"n": 6}, delay_ms=3_600_000, job_id="j-sched")
    q.enqueue("mail.child", {"n": 7}, after=["j-leased"], job_id="j-held")
    q.enqueue("mail.cancel", {"n": 8}, job_id="j-cancel")
    q.cancel("j-cancel")
    return q, {"due": "j-due", "scheduled": "j-sched", "retrying": "j-retry",
               "leased": "j-leased", "dead": "j-dead", "done": "j-done",
               "cancelled": "j-cancel", "held": "j-held"}  # fmt: skip


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def one_line_error(result: Result, code: int) -> None:
    """The documented exit code and one line on stderr, never a traceback."""
    assert not (result.exception and not isinstance(result.exception, SystemExit)), (
        f"uncaught {type(result.exception).__name__}: {result.exception}"
    )
    assert result.exit_code == code, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output


# -- README's redis-cli lines and key schema -------------------------------------------------
def _readme_cli_lines() -> list[str]:
    block = README.split("Looking at a queue named `emails` from `redis-cli`:", 1)[1]
    body = block.split("```", 2)[1]
    return [ln.split("#")[0].strip() for ln in body.splitlines() if ln.startswith("redis-cli")]


def test_readme_redis_cli_lines_show_each_state(client: redis.Redis, server: RedisProcess) -> None:
    """README's five `redis-cli` lines, run as written (with `-p` of this server) on a queue
    named `emails`: each shows what its comment says."""
    if shutil.which("redis-cli") is None or shutil.which("bash") is None:
        pytest.skip("no redis-cli or bash")
    q, ids = states(client)
    lines = _readme_cli_lines()
    assert len(lines) == 5

    def run(line: str) -> list[str]:
        line = line.replace("redis-cli ", f"redis-cli -p {server.port} ", 1)
        out = subprocess.run(["bash", "-c", line.replace("<id>", ids["dead"])],
                             capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
        return out.stdout.splitlines()

    nxt, due_now, leased, dead, job = (run(ln) for ln in lines)
    # next ten of due, run_at in ms: every waiting job not held, scored by its run_at
    waiting = dict(zip(nxt[0::2], map(int, nxt[1::2]), strict=True))
    assert set(waiting) == {ids["due"], ids["scheduled"], ids["retrying"]}
    for jid, at in waiting.items():
        assert q.get_job(jid).run_at_ms == at
    assert due_now == ["1"]  # only j-due's time has come
    lease = dict(zip(leased[0::2], map(int, leased[1::2]), strict=True))
    assert list(lease) == [ids["leased"]]
    assert lease[ids["leased"]] == int(client.zscore(q.keys.leased, ids["leased"]) or 0)
    assert dead[0] == ids["dead"] and int(dead[1]) == int(q.get_job(ids["dead"]).fields["dead_ms"])
    fields = dict(zip(job[0::2], job[1::2], strict=True))
    assert fields["state"] == "dead" and fields["task"] == "mail.bounce"


def _schema() -> list[tuple[re.Pattern[str], str]]:
    """README's key schema table: (the key's pattern, its Redis type)."""
    table = README.split("### Key schema", 1)[1].split("\n\n")[2]
    rows = []
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        names = re.findall(r"`([^`]+)`", cells[0])
        kinds = [t.strip().lower() for t in cells[1].split(",")]
        for name, kind in zip(names, kinds if len(kinds) == len(names) else kinds * len(names),
                              strict=True):  # fmt: skip
            text = re.escape(name).replace(re.escape("{q}"), r"\{[^}]+\}")
            text = re.sub(r"<[^>]+>", ".+", text.replace(r"\<", "<").replace(r"\>", ">"))
            rows.append((re.compile(text + "$"), kind))
    return rows


def test_readme_key_schema_types_are_what_the_code_writes(client: redis.Redis) -> None:
    """Each key the queue holds that README's key schema names has the type the table gives,
    and the table names the keys of every state (the flow keys are docs/flow-control.md's)."""
    q, _ = states(client)
    q.enqueue("mail.key", {}, key="idem-1")
    q.pause()
    q.schedule("nightly", "report.build", {}, cron="0 9 * * *")
    schema = _schema()
    assert len(schema) >= 15
    seen = set()
    for key in client.scan_iter(match="sched:*"):
        kind = client.type(key)
        matched = [t for pat, t in schema if pat.match(key)]
        if not matched:
            assert ":flow:" in key or key.endswith(":schedules") or ":schedule:" in key, key
            continue
        seen.add(key.split(":")[2] if key.count(":") > 1 else key)
        assert kind in matched, (key, kind, matched)
    assert {"due", "leased", "dead", "finished", "config", "job", "spec", "idem"} <= seen


# -- the CLI's words, per state ----------------------------------------------------------------
def test_jobs_list_and_cancel_speak_the_glossary_words(client: redis.Redis, cli: Run) -> None:
    """`jobs list --state W` lists the jobs the glossary calls W; `jobs cancel --json` answers
    each id's state before in the same words (a retrying job is `scheduled`), `missing` for an
    unknown id, and exits 1 for the done, dead and missing ones."""
    _, ids = states(client)
    listed = {}
    for state in ("due", "scheduled", "held", "leased", "dead", "finished"):
        data = ok_json(cli("jobs", "list", "-q", "emails", "--state", state, "--json"))
        listed[state] = sorted(j["id"] for j in data["jobs"])
        assert all(re.fullmatch(r"[a-z_]+", k) for k in data), data.keys()
    assert listed == {
        "due": [ids["due"]], "scheduled": sorted([ids["scheduled"], ids["retrying"]]),
        "held": [ids["held"]], "leased": [ids["leased"]], "dead": [ids["dead"]],
        "finished": sorted([ids["cancelled"], ids["done"]]),
    }  # fmt: skip
    for word in ("due", "scheduled", "held", "leased", "dead", "done", "cancelled"):
        assert f"`{word}`" in GLOSSARY or f"| {word} |" in GLOSSARY, word
    shown = ok_json(cli("jobs", "show", "-q", "emails", ids["held"], "--json"))
    assert (shown["state"], shown["stored_state"], shown["places"]) == ("held", "due",
                                                                        ["flow:held"])  # fmt: skip
    order = ["held", "due", "scheduled", "retrying", "leased", "dead", "done"]
    res = cli("jobs", "cancel", "-q", "emails", *(ids[s] for s in order), "no-such-id", "--json")
    assert res.exit_code == exits.EXIT_FAILED, res.output
    assert json.loads(res.stdout)["jobs"] == {
        ids["held"]: "held", ids["due"]: "due", ids["scheduled"]: "scheduled",
        ids["retrying"]: "scheduled", ids["leased"]: "leased", ids["dead"]: "dead",
        ids["done"]: "done", "no-such-id": "missing",
    }  # fmt: skip


def test_stats_json_has_the_documented_fields(client: redis.Redis, cli: Run) -> None:
    """README: `windows` `1m`, `5m`, `60m`; `paused_ms`; `error` null for a readable queue;
    the counters are vocabulary.py's STAT_FIELDS."""
    from scheduler.core.vocabulary import STAT_FIELDS

    states(client)
    row = ok_json(cli("stats", "-q", "emails", "--json"))["queues"][0]
    assert (row["due"], row["scheduled"], row["leased"], row["dead"]) == (2, 2, 1, 1)
    assert row["held"] == {"key_limit": 0, "rate_window": 0, "waiting": 1}
    assert row["error"] is None and row["paused_ms"] is None
    assert set(row["windows"]) == {"1m", "5m", "60m"}
    assert set(row["windows"]["1m"]) == set(STAT_FIELDS)
    assert row["windows"]["1m"]["dead"] == 1 and row["windows"]["1m"]["done"] == 1


# -- operator actions: what the docs say and nothing else ------------------------------------
def test_dead_requeue_moves_that_job_back_with_a_fresh_budget_only(
    client: redis.Redis, cli: Run
) -> None:
    q, ids = states(client)
    before = dump_queue(client, q)
    res = cli("dead", "requeue", "-q", "emails", "--id", ids["dead"], "--yes", "--json")
    assert ok_json(res) == {"action": "requeued", "done": 1, "matched": 1, "queue": "emails",
                            "skipped": 0}  # fmt: skip
    job = q.get_job(ids["dead"])
    assert (job.state, job.attempts) == ("due", 0)
    after = dump_queue(client, q)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    allowed = {q.keys.due, q.keys.dead, q.keys.job(ids["dead"]), q.keys.wake}  # wake: a token
    assert {k for k in changed if ":stats:" not in k} <= allowed, changed


def test_pause_and_resume_touch_only_the_config(client: redis.Redis, cli: Run) -> None:
    """`pause` prints `paused` then `already`, stores `paused_ms` in the config HASH (README's
    key schema), `stats` marks the queue; `resume` prints `resumed` then `active`; the jobs are
    untouched."""
    q, _ = states(client)
    before = {k: v for k, v in dump_queue(client, q).items() if ":stats:" not in k}
    assert ok_json(cli("pause", "-q", "emails", "--json"))["status"] == "paused"
    assert ok_json(cli("pause", "-q", "emails", "--json"))["status"] == "already"
    assert client.type(q.keys.config) == "hash" and client.hget(q.keys.config, "paused_ms")
    assert "emails (paused)" in cli("stats", "-q", "emails").stdout
    assert ok_json(cli("stats", "-q", "emails", "--json"))["queues"][0]["paused_ms"] is not None
    assert ok_json(cli("resume", "-q", "emails", "--json"))["status"] == "resumed"
    assert ok_json(cli("resume", "-q", "emails", "--json"))["status"] == "active"
    after = {k: v for k, v in dump_queue(client, q).items() if ":stats:" not in k}
    assert {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)} <= {
        q.keys.config, q.keys.wake,
    }  # fmt: skip


def test_doctor_fix_rearms_an_orphan_and_nothing_else(client: redis.Redis, cli: Run) -> None:
    """A retrying job taken out of due by hand: doctor names it (`orphan-hash`, `rearms`), exit
    1; --fix puts it back at its own run time, says `1 re-armed`, exit 0, and changes no other
    job."""
    q, ids = states(client)
    at = q.get_job(ids["retrying"]).run_at_ms
    client.zrem(q.keys.due, ids["retrying"])
    found = cli("doctor", "-q", "emails", "--no-server", "--json")
    assert found.exit_code == exits.EXIT_FAILED
    (issue,) = json.loads(found.stdout)["findings"]
    assert (issue["code"], issue["job_id"], issue["rearms"]) == ("orphan-hash", ids["retrying"],
                                                                 True)  # fmt: skip
    others = {
        k: v
        for k, v in dump_queue(client, q).items()
        if ids["retrying"] not in k and k not in (q.keys.due, q.keys.wake) and ":stats:" not in k
    }
    fixed = cli("doctor", "-q", "emails", "--no-server", "--fix")
    assert fixed.exit_code == 0 and "1 re-armed" in fixed.stdout, fixed.output
    assert client.zscore(q.keys.due, ids["retrying"]) == at
    after = {
        k: v
        for k, v in dump_queue(client, q).items()
        if ids["retrying"] not in k and k not in (q.keys.due, q.keys.wake) and ":stats:" not in k
    }
    assert after == others


# -- operator mistakes -------------------------------------------------------------------------
MISTAKE_COMMANDS = [
    ["pause"], ["resume"], ["jobs", "cancel", "x"], ["jobs", "show", "x"],
    ["jobs", "reschedule", "x", "--now"], ["dead", "retention"], ["schedules", "run", "s"],
    ["workers", "quiet", "--all", "--yes"], ["keys"], ["stats"], ["doctor"],
]  # fmt: skip


@pytest.mark.parametrize("cmd", MISTAKE_COMMANDS, ids=" ".join)
def test_unreachable_and_wrong_password_are_one_line_3_and_5(
    cli: Run, server: RedisProcess, cmd: list[str]
) -> None:
    gone = cli(*cmd, "-q", "emails", at=f"redis://127.0.0.1:{_closed_port()}/0")
    one_line_error(gone, exits.EXIT_UNREACHABLE)
    assert "cannot reach Redis" in gone.stderr
    wrong = cli(*cmd, "-q", "emails", at=f"redis://{USER}:wrong@127.0.0.1:{server.port}/0")
    one_line_error(wrong, exits.EXIT_FORBIDDEN)
    assert "wrong" not in wrong.output  # the password is never printed


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    "cmd",
    [["pause"], ["resume"], ["jobs", "cancel", "x"], ["schedules", "run", "s"],
     ["dead", "retention"], ["workers", "quiet", "--all", "--yes"]],
    ids=" ".join,
)  # fmt: skip
def test_unknown_queue_is_refused_with_the_known_ones(
    client: redis.Redis, cli: Run, cmd: list[str]
) -> None:
    """The commands tests/test_cli_language.py does not list: exit 1, the known queues named,
    nothing written."""
    states(client)
    before = sorted(client.scan_iter(match="*"))
    res = cli(*cmd, "-q", "emials")
    one_line_error(res, exits.EXIT_FAILED)
    assert "no queue named 'emials'" in res.stderr and "known: emails" in res.stderr
    assert sorted(client.scan_iter(match="*")) == before


@pytest.mark.parametrize("cmd", [["jobs", "show", "j-due"], ["jobs", "reschedule", "j-due",
                                                             "--now"]], ids=" ".join)  # fmt: skip
def test_jobs_show_and_reschedule_refuse_an_unknown_queue(
    client: redis.Redis, cli: Run, cmd: list[str]
) -> None:
    """README: "A queue name with no keys is refused (exit 1, the known queues listed) by every
    command but `enqueue`, `schedules add` and `worker` ... and `keys`". A typo in -q must not
    read as "the job is gone"."""
    states(client)
    res = cli(*cmd, "-q", "emials")
    one_line_error(res, exits.EXIT_FAILED)
    assert "no queue named 'emials'" in res.stderr and "known: emails" in res.stderr


def test_unknown_job_id_is_one_line_1(client: redis.Redis, cli: Run) -> None:
    q, _ = states(client)
    before = dump_queue(client, q)
    for cmd in (["jobs", "show", "nope"], ["jobs", "reschedule", "nope", "--now"],
                ["dead", "requeue", "--id", "nope", "--yes"],
                ["dead", "purge", "--id", "nope", "--yes"]):  # fmt: skip
        res = cli(*cmd, "-q", "emails")
        one_line_error(res, exits.EXIT_FAILED)
        assert "nope" in res.stderr
    assert {k: v for k, v in dump_queue(client, q).items() if ":stats:" not in k} == {
        k: v for k, v in before.items() if ":stats:" not in k
    }


def test_demo_with_a_wrong_password_is_exit_5(cli: Run, server: RedisProcess) -> None:
    """The exit table is "one table for every command": 5 is a refused password. demo said 3
    (try again), so a script retries a password that will never pass."""
    res = cli("demo", at=f"redis://{USER}:wrong@127.0.0.1:{server.port}/0")
    assert res.exit_code == exits.EXIT_FORBIDDEN, res.output


@pytest.fixture
def not_redis() -> Iterator[str]:
    """A TCP service that is not Redis (an HTTP server on the port typed by mistake)."""
    with http_listener() as port:
        yield f"redis://127.0.0.1:{port}/0"


@pytest.mark.parametrize("cmd", [["stats"], ["jobs", "show", "x"], ["enqueue", "t"],
                                 ["doctor"], ["pause"]], ids=" ".join)  # fmt: skip
def test_a_url_that_is_not_redis_is_one_line(cli: Run, not_redis: str, cmd: list[str]) -> None:
    """An operator's wrong port (an HTTP server there): one line naming the problem and 3
    (Redis cannot be reached) or 2 (bad settings), never a traceback."""
    res = cli(*cmd, "-q", "emails", at=not_redis)
    assert not (res.exception and not isinstance(res.exception, SystemExit)), (
        f"uncaught {type(res.exception).__name__}: {res.exception}"
    )
    assert res.exit_code in (exits.EXIT_UNREACHABLE, exits.EXIT_USAGE), res.output
    assert len([ln for ln in res.stderr.splitlines() if ln.strip()]) == 1, res.output


# -- scheduler keys --------------------------------------------------------------------------
def test_keys_counts_one_hash_per_schedule(client: redis.Redis, cli: Run) -> None:
    q, _ = states(client)
    q.schedule("nightly", "report.build", {}, cron="0 9 * * *")
    q.schedule("tick", "t.tick", {}, every_ms=3_600_000)
    assert len(q.list_schedules()) == 2
    data = ok_json(cli("keys", "-q", "emails", "--json"))
    fixed = {k["key"]: k for k in data["keys"]}
    assert fixed[q.keys.schedules]["size"] == 2
    fam = {f["pattern"]: f for f in data["families"]}[q.keys.prefix + "schedule:*"]
    assert fam["about"].startswith("HASH one per recurring schedule")
    assert fam["count"] == 2, fam


def test_keys_lines_reach_the_server_and_types_match(client: redis.Redis, cli: Run,
                                                     server: RedisProcess) -> None:  # fmt: skip
    states(client)
    res = cli("keys", "-q", "emails")
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("redis-cli")]
    assert len(lines) == 5 and all(f"-p {server.port}" in ln for ln in lines)
    data = ok_json(cli("keys", "-q", "emails", "--json"))
    for k in data["keys"]:
        assert k["type"] == client.type(k["key"]), k


# -- the fixes the CLI prints name the server it was given ------------------------------------
def test_doctor_json_fix_names_the_server(client: redis.Redis, cli: Run,
                                          server: RedisProcess) -> None:  # fmt: skip
    """scheduler/cli/redis_cli.py: the lines the CLI prints "reach the server the command was
    given"; the text output does (`redis-cli -p PORT CONFIG SET ...`), --json does not."""
    states(client)
    text = cli("doctor", "-q", "emails")
    assert f"redis-cli -p {server.port} CONFIG SET appendonly yes" in text.stdout
    data = json.loads(cli("doctor", "-q", "emails", "--json").stdout)
    (off,) = [f for f in data["findings"] if f["code"] == "persistence-off"]
    assert f"-p {server.port}" in off["fix"], off["fix"]


def test_enqueue_warning_fix_names_the_server(cli: Run, server: RedisProcess) -> None:
    res = cli("enqueue", "t.x", "-q", "emails")
    assert res.exit_code == 0, res.output
    (warning,) = [ln for ln in res.stderr.splitlines() if "persistence-off" in ln]
    assert f"redis-cli -p {server.port} CONFIG SET appendonly yes" in warning, warning


def test_doctor_fix_command_names_the_url(client: redis.Redis, cli: Run,
                                          server: RedisProcess) -> None:  # fmt: skip
    q, ids = states(client)
    client.zrem(q.keys.due, ids["retrying"])
    res = cli("doctor", "-q", "emails", "--no-server")
    assert res.exit_code == exits.EXIT_FAILED, res.output
    (fix,) = [ln.strip() for ln in res.stdout.splitlines() if ln.strip().startswith("fix:")]
    assert "scheduler doctor --fix" in fix and str(server.port) in fix, fix
