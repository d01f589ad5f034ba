"""The CLI as a scripting contract, as an operator's shell script or cron job uses it: with
--json, stdout holds one JSON document or nothing (never a message, a prompt or a progress
bar: those go to stderr); each kind of failure has one exit code across commands (unknown
queue 1, not found 1, bad input 2, Redis down or refusing for now 3, ACL 5); piped output has
no ANSI codes and keeps ids whole; a confirmation never hangs a run without a terminal."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import Queue
from scheduler.cli import confirm
from scheduler.cli.main import main
from scheduler.core import exits
from scheduler.core.connection import connect
from scheduler.operations.requests import Script
from tests.conftest import delete_queue, dump_queue
from tests.redis_server import RedisProcess, free_port

SCHEDULER = str(Path(sys.executable).parent / "scheduler")
ANSI = re.compile("\x1b\\[")
# SGR colour parameters (30-39, 40-49, 90-97, 100-107, 38;5;n / 38;2;r;g;b): NO_COLOR's scope.
SGR = re.compile(r"\x1b\[([0-9;]*)m")


def is_colour(params: str) -> bool:
    parts = [int(p) for p in params.split(";") if p]
    return any(30 <= p <= 49 or 90 <= p <= 107 for p in parts)


def invoke(*args: str, url: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, [*args, "--url", url], input=stdin)


def stdout_is_json_or_nothing(result: Result) -> None:
    """What a script's `x=$(scheduler ... --json)` may hold: one JSON object, or nothing."""
    if result.stdout.strip():
        assert isinstance(json.loads(result.stdout), dict), result.stdout


def piped_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")}
    return dict(env, TERM="xterm-256color")


def piped(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCHEDULER, *args, "--url", url], stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=120, env=piped_env(),
    )  # fmt: skip


def make_dead(q: Queue, n: int = 1) -> list[str]:
    ids = [q.enqueue("t", {"n": i}, max_attempts=1) for i in range(n)]
    for job in q.claim("w", limit=n).jobs:
        assert q.fail(job.id, job.token, ValueError("bad")).status == "dead"
    return ids


@pytest.fixture
def full(q: Queue) -> dict[str, str]:
    """A queue holding a due job, a dead job and a schedule."""
    (dead,) = make_dead(q)  # first: the claim takes it, not the due job
    due = q.enqueue("t", {"a": 1})
    q.schedule("nightly", "t", every_ms=3_600_000)
    return {"due": due, "dead": dead}


# Every command documented with --json (docs/cli.md), on queue Q; JOB: a job id of it.
JSON_COMMANDS: list[list[str]] = [
    ["dead", "list"],
    ["dead", "purge", "--yes"],
    ["dead", "requeue", "--yes"],
    ["dead", "retention"],
    ["doctor"],
    ["enqueue", "t"],
    ["jobs", "cancel", "JOB"],
    ["jobs", "list", "--state", "due"],
    ["jobs", "reschedule", "JOB", "--now"],
    ["jobs", "show", "JOB"],
    ["keys"],
    ["pause"],
    ["resume"],
    ["queue", "priority-aging"],
    ["schedules", "add", "s2", "t", "--every", "1h"],
    ["schedules", "list"],
    ["schedules", "pause", "nightly"],
    ["schedules", "resume", "nightly"],
    ["schedules", "run", "nightly"],
    ["schedules", "remove", "nightly"],
    ["stats"],
    ["workers", "list"],
    ["workers", "quiet", "--all", "--yes"],
    ["workers", "stop", "--all", "--yes"],
]
IDS = [" ".join(c[:2]) for c in JSON_COMMANDS]


def cmd(template: list[str], queue: str, job: str = "no-such-job") -> list[str]:
    return [job if a == "JOB" else a for a in template] + ["--json", "-q", queue]


# -- success: one JSON document, the warnings on stderr ----------------------------------------
@pytest.mark.parametrize("template", JSON_COMMANDS, ids=IDS)
def test_json_success_is_one_document_on_stdout(
    redis_url: str, q: Queue, full: dict[str, str], template: list[str]
) -> None:
    result = invoke(*cmd(template, q.name, full["due"]), url=redis_url)
    # doctor exits 1 on the test server's settings (findings); every other one succeeds here
    assert result.exit_code in (0, 1 if template == ["doctor"] else 0), result.output
    data = json.loads(result.stdout)  # the whole of stdout: nothing before or after it
    assert isinstance(data, dict) and data
    assert not ANSI.search(result.stdout)
    assert result.stdout.startswith("{") and result.stdout.endswith("}\n")


def test_queue_move_json_is_one_document(redis_url: str, q: Queue, client: redis.Redis) -> None:
    q.enqueue("t", 1)
    dest = Queue(client, q.name + "-to")
    try:
        result = invoke(
            "queue", "move", "--from", q.name, "--to", dest.name, "--json", url=redis_url
        )
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["moved"] == 1
        assert dest.counts().due == 1
    finally:
        delete_queue(client, dest)


# -- Redis unreachable: 3, one line on stderr, stdout empty, for every command -----------------
@pytest.mark.parametrize("template", JSON_COMMANDS, ids=IDS)
def test_redis_down_is_exit_3_and_nothing_on_stdout(template: list[str]) -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"
    result = invoke(*cmd(template, "anyq"), url=down)
    assert result.exit_code == exits.EXIT_UNREACHABLE, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("Error: cannot reach Redis"), result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1


# -- an unknown queue: 1, named with the known ones, stdout empty -----------------------------
REFUSING = [
    c for c in JSON_COMMANDS if c[0] not in ("enqueue", "keys") and c[:2] != ["schedules", "add"]
]


@pytest.mark.parametrize("template", REFUSING, ids=[" ".join(c[:2]) for c in REFUSING])
def test_an_unknown_queue_is_exit_1_everywhere(
    redis_url: str, client: redis.Redis, template: list[str]
) -> None:
    name = "typo-" + uuid.uuid4().hex[:10]
    result = invoke(*cmd(template, name), url=redis_url)
    assert result.exit_code == exits.EXIT_FAILED, result.output
    assert result.stdout == ""
    assert f"no queue named {name!r}" in result.stderr and "known:" in result.stderr
    assert list(client.scan_iter(match=f"sched:{{{name}}}:*")) == []  # nothing written


def test_queue_move_from_an_unknown_queue_is_exit_1(redis_url: str) -> None:
    name = "typo-" + uuid.uuid4().hex[:10]
    result = invoke("queue", "move", "--from", name, "--to", name + "x", "--json", url=redis_url)
    assert result.exit_code == exits.EXIT_FAILED and result.stdout == ""
    assert "no queue named so" in result.stderr


# -- not found: 1 everywhere; stdout a JSON answer or nothing -----------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ["jobs", "show", "no-such-job"],
        ["jobs", "reschedule", "no-such-job", "--now"],
        ["jobs", "cancel", "no-such-job"],
        ["dead", "requeue", "--id", "no-such-job", "--yes"],
        ["dead", "purge", "--id", "no-such-job", "--yes"],
        ["schedules", "pause", "no-such-schedule"],
        ["schedules", "resume", "no-such-schedule"],
        ["schedules", "run", "no-such-schedule"],
        ["schedules", "remove", "no-such-schedule"],
        ["workers", "stop", "no-such-worker"],
        ["workers", "quiet", "no-such-worker"],
    ],
    ids=" ".join,
)
def test_not_found_is_exit_1_everywhere(
    redis_url: str, client: redis.Redis, q: Queue, full: dict[str, str], args: list[str]
) -> None:
    before = dump_queue(client, q)
    result = invoke(*args, "--json", "-q", q.name, url=redis_url)
    assert result.exit_code == exits.EXIT_FAILED, result.output
    stdout_is_json_or_nothing(result)
    assert "no-such" in result.stdout + result.stderr  # the missing one is named
    assert dump_queue(client, q) == before


@pytest.mark.parametrize(
    ("args", "answers"),
    [
        (["jobs", "show", "no-such-job"], False),
        (["jobs", "reschedule", "no-such-job", "--now"], False),
        (["jobs", "cancel", "no-such-job"], True),
        (["schedules", "pause", "no-such-schedule"], True),
        (["schedules", "run", "no-such-schedule"], True),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else str(v),
)
def test_not_found_prints_an_answer_only_where_the_readme_says(
    redis_url: str, q: Queue, args: list[str], answers: bool
) -> None:
    """README's CLI section: a refusal before any answer (`jobs show|reschedule` of a job not
    found) leaves stdout empty; `jobs cancel` and `schedules ...` answer `"missing"` (exit 1)."""
    q.enqueue("t", None)  # the queue exists: not refused as an unknown queue name
    result = invoke(*args, "--json", "-q", q.name, url=redis_url)
    assert result.exit_code == exits.EXIT_FAILED, result.output
    if answers:
        assert '"missing"' in result.stdout, result.stdout
        assert isinstance(json.loads(result.stdout), dict)
    else:
        assert result.stdout == "", result.stdout


def test_a_partly_done_cancel_is_exit_1_with_each_outcome(
    redis_url: str, q: Queue, full: dict[str, str]
) -> None:
    result = invoke("jobs", "cancel", full["due"], "no-such-job", "--json", "-q", q.name,
                    url=redis_url)  # fmt: skip
    assert result.exit_code == exits.EXIT_FAILED, result.output
    # each id's state before (README): the due one cancelled, the missing one named
    assert json.loads(result.stdout)["jobs"] == {full["due"]: "due", "no-such-job": "missing"}
    assert q.counts().due == 0


def test_a_partly_dead_id_list_is_exit_1_and_requeues_nothing(
    redis_url: str, q: Queue, full: dict[str, str]
) -> None:
    result = invoke("dead", "requeue", "--id", full["dead"], "--id", full["due"], "--yes",
                    "--json", "-q", q.name, url=redis_url)  # fmt: skip
    assert result.exit_code == exits.EXIT_FAILED and result.stdout == ""
    assert full["due"] in result.stderr
    assert q.counts().dead == 1


# -- bad input: 2, stdout empty, nothing written -----------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ["enqueue", "t", "--payload", "{nope"],
        ["enqueue", "t", "--at", "tomorrow"],
        ["enqueue", "t", "--in", "soon"],
        ["jobs", "list", "--state", "bogus"],
        ["jobs", "reschedule", "JOB", "--in", "garbage"],
        ["jobs", "reschedule", "JOB", "--at", "2030-01-01T00:00:00"],
        ["jobs", "reschedule", "JOB"],
        ["jobs", "cancel"],
        ["dead", "list", "--older-than", "x"],
        ["dead", "retention", "--max-age", "forever"],
        ["dead", "retention", "--off", "--max-age", "1d"],
        ["schedules", "add", "s", "t", "--cron", "not a cron"],
        ["schedules", "add", "s", "t", "--cron", "* * * * *", "--tz", "Mars/Base"],
        ["workers", "stop"],
        ["stats", "--watch", "--interval", "0"],
    ],
    ids=" ".join,
)
def test_bad_input_is_exit_2_and_writes_nothing(
    redis_url: str, client: redis.Redis, q: Queue, full: dict[str, str], args: list[str]
) -> None:
    before = dump_queue(client, q)
    result = invoke(*cmd(args, q.name, full["due"]), url=redis_url)
    assert result.exit_code == exits.EXIT_USAGE, result.output
    assert result.stdout == ""
    assert result.stderr.strip() and "Traceback" not in result.stderr
    assert dump_queue(client, q) == before


@pytest.mark.parametrize("url", ["notaurl", "redis://127.0.0.1:1/0?foo=bar"])
def test_a_bad_url_is_exit_2_for_reads_and_writes(url: str) -> None:
    for args in (["stats", "--json"], ["enqueue", "t", "--json", "-q", "x"]):
        result = invoke(*args, url=url)
        assert result.exit_code == exits.EXIT_USAGE, result.output
        assert result.stdout == "" and "invalid --url" in result.stderr


# -- Redis refusing for now (maxmemory) is 3; an ACL refusal is 5: one code per kind -------------
@pytest.fixture
def own(module_server: RedisProcess) -> Iterator[tuple[str, redis.Redis, Queue]]:
    c = connect(module_server.url)
    q = Queue(c, "own-" + uuid.uuid4().hex[:10])
    yield module_server.url, c, q
    c.config_set("maxmemory", "0")
    delete_queue(c, q)
    c.close()


WRITES = [
    ["enqueue", "t"],
    ["pause"],
    ["schedules", "add", "s", "t", "--every", "1h"],
    ["dead", "retention", "--max-count", "5"],
    ["queue", "priority-aging", "5000"],
]


def test_a_full_server_is_exit_3_for_every_write(own: tuple[str, redis.Redis, Queue]) -> None:
    url, c, q = own
    q.enqueue("t", 1)
    before = dump_queue(c, q)
    c.config_set("maxmemory-policy", "noeviction")
    c.config_set("maxmemory", "1")
    for args in WRITES:
        result = invoke(*args, "--json", "-q", q.name, url=url)
        assert result.exit_code == exits.EXIT_UNREACHABLE, (args, result.output)
        assert result.stdout == "", args
        assert "refused the command for now" in result.stderr, args
    c.config_set("maxmemory", "0")
    assert dump_queue(c, q) == before


def with_user(url: str, user: str, password: str) -> str:
    scheme, rest = url.split("://", 1)  # redis:// or unix:// (the test servers' socket)
    return f"{scheme}://{user}:{password}@{rest}"


def test_an_acl_refusal_is_exit_5_for_every_write(own: tuple[str, redis.Redis, Queue]) -> None:
    url, c, q = own
    q.enqueue("t", 1)
    user, password = "ro-" + uuid.uuid4().hex[:6], "pw-Scripting-4k"
    # Reads and the scripts' own calls only as far as reading goes: no write anywhere.
    commands = ["+@read", "+@connection", "-@write", "-@scripting", "+eval", "+evalsha",
                "+script|load", "+info", "+time"]  # fmt: skip
    c.acl_setuser(user, enabled=True, passwords=[f"+{password}"], keys=["*"], channels=["*"],
                  commands=commands)  # fmt: skip
    try:
        ro = with_user(url, user, password)
        for args in WRITES:
            result = invoke(*args, "--json", "-q", q.name, url=ro)
            assert result.exit_code == exits.EXIT_FORBIDDEN, (args, result.output)
            assert result.stdout == "", args
            assert "operator role" in result.stderr, args  # says what to do
        stats = invoke("stats", "--json", "-q", q.name, url=ro)  # a read still answers
        assert stats.exit_code == 0 and json.loads(stats.stdout)["queues"][0]["due"] == 1
        wrong = invoke("stats", "--json", url=with_user(url, user, "no"))
        assert wrong.exit_code == exits.EXIT_FORBIDDEN and wrong.stdout == ""
    finally:
        c.acl_deluser(user)


# -- confirmations without a terminal ------------------------------------------------------------
def confirming(q: Queue, what: str) -> list[str]:
    """A command that asks first (no --yes) with something to act on."""
    if what == "cancel":
        q.enqueue("t", 1)
        return ["jobs", "cancel", "--state", "due"]
    if what == "quiet":  # a worker that exists only in Redis: one presence beat
        q._execute(Script("worker_beat", ["w1", "30000", "beat", "h", "1", q.name, "0", "1", ""]))
        return ["workers", "quiet", "--all"]
    make_dead(q, 2)
    if what == "purge":
        return ["dead", "purge"]
    if what == "requeue":
        return ["dead", "requeue"]
    return ["dead", "retention", "--max-count", "0"]


CONFIRMING = ["cancel", "purge", "requeue", "retention", "quiet"]


@pytest.mark.parametrize("what", CONFIRMING)
def test_a_confirmation_with_stdin_at_eof_declines_and_changes_nothing(
    redis_url: str, client: redis.Redis, q: Queue, what: str
) -> None:
    args = confirming(q, what)
    before = dump_queue(client, q)
    proc = piped(*args, "--json", "-q", q.name, url=redis_url)
    assert proc.returncode == exits.EXIT_FAILED, proc.stderr
    assert proc.stdout == ""  # the question went to stderr
    assert "?" in proc.stderr and not ANSI.search(proc.stderr)
    assert dump_queue(client, q) == before


@pytest.mark.parametrize("what", CONFIRMING)
def test_a_confirmation_without_a_terminal_says_to_pass_yes(
    redis_url: str, q: Queue, what: str
) -> None:
    """Was "...? [y/N]: Aborted!" alone (scheduler/cli/confirm.py now asks for them all)."""
    proc = piped(*confirming(q, what), "--json", "-q", q.name, url=redis_url)
    assert proc.returncode == exits.EXIT_FAILED
    assert "no answer (stdin is not a terminal): pass --yes to" in proc.stderr, proc.stderr
    assert "Aborted" not in proc.stderr


def test_a_declined_confirmation_says_nothing_changed(redis_url: str, q: Queue) -> None:
    for answer in ("n\n", "\n"):  # the default is no
        args = confirming(q, "purge")
        result = invoke(*args, "-q", q.name, url=redis_url, stdin=answer)
        assert result.exit_code == exits.EXIT_FAILED, result.output
        assert "declined: nothing changed" in result.stderr and "--yes" not in result.stderr
        assert q.counts().dead > 0


def test_a_confirmation_in_the_cli_runner_without_input_says_to_pass_yes(
    redis_url: str, q: Queue
) -> None:
    """CliRunner's stdin has no file descriptor: read as before, EOF is no answer."""
    result = invoke(*confirming(q, "cancel"), "-q", q.name, url=redis_url)
    assert result.exit_code == exits.EXIT_FAILED
    assert "pass --yes to cancel them" in result.stderr and q.counts().due == 1


def test_yes_piped_in_confirms(redis_url: str, q: Queue) -> None:
    """`yes | scheduler dead purge`: an answer on a pipe is taken (a documented way to script)."""
    make_dead(q, 2)
    proc = subprocess.run(
        [SCHEDULER, "dead", "purge", "--json", "-q", q.name, "--url", redis_url],
        input="y\n", capture_output=True, text=True, timeout=120, env=piped_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["done"] == 2 and q.counts().dead == 0
    assert not ANSI.search(proc.stderr)  # the progress bar is not drawn on a pipe


def test_a_confirmation_on_an_open_non_terminal_stdin_does_not_hang(
    redis_url: str, q: Queue
) -> None:
    q.enqueue("t", 1)
    proc = subprocess.Popen(
        [SCHEDULER, "jobs", "cancel", "--state", "due", "--json", "-q", q.name, "--url", redis_url],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=piped_env(),
    )  # fmt: skip
    try:
        proc.wait(timeout=30)  # a deadline for the exit, not a measure of speed
    except subprocess.TimeoutExpired:
        pytest.fail("still waiting for an answer on a stdin no one writes to")
    finally:
        if proc.poll() is None:
            proc.kill()
        err = proc.communicate()[1]
    assert proc.returncode == exits.EXIT_FAILED
    assert q.counts().due == 1
    assert (
        f"no answer on stdin within {confirm.ANSWER_WAIT_S} s (not a terminal): pass --yes" in err
    )


# -- piped text: no ANSI codes, ids whole ------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ["stats"],
        ["jobs", "list", "--state", "due"],
        ["jobs", "list", "--state", "dead"],
        ["jobs", "show", "DUE"],
        ["dead", "list"],
        ["doctor"],
        ["keys"],
        ["schedules", "list"],
        ["workers"],
        ["jobs", "show", "no-such-job"],
    ],
    ids=" ".join,
)
def test_piped_text_has_no_ansi_codes(
    redis_url: str, q: Queue, full: dict[str, str], args: list[str]
) -> None:
    q.pause()  # a paused queue's marks and doctor's findings are what colour would be spent on
    proc = piped(*[full["due"] if a == "DUE" else a for a in args], "-q", q.name, url=redis_url)
    assert proc.returncode in (0, 1), proc.stderr
    assert proc.stdout.strip() or proc.stderr.strip()
    assert not ANSI.search(proc.stdout + proc.stderr), proc.stdout + proc.stderr


def tty_output(args: list[str], env: dict[str, str]) -> str:
    """What a terminal shows (stdout and stderr on one pty)."""
    main_fd, tty_fd = pty.openpty()
    proc = subprocess.Popen([SCHEDULER, *args], stdin=subprocess.DEVNULL, stdout=tty_fd,
                            stderr=tty_fd, env=env)  # fmt: skip
    os.close(tty_fd)
    out = b""
    try:
        while select.select([main_fd], [], [], 60)[0]:
            try:
                chunk = os.read(main_fd, 65536)
            except OSError:  # EIO: the last writer closed the pty
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(main_fd)
        proc.wait(timeout=60)
    return out.decode(errors="replace")


@pytest.mark.parametrize(
    "args", [["doctor"], ["stats"], ["jobs", "list", "--state", "due"]], ids=" ".join
)
def test_no_color_on_a_terminal_drops_every_colour(
    redis_url: str, q: Queue, full: dict[str, str], args: list[str]
) -> None:
    env = piped_env()
    coloured = tty_output([*args, "-q", q.name, "--url", redis_url], env)
    plain = tty_output([*args, "-q", q.name, "--url", redis_url], dict(env, NO_COLOR="1"))
    assert plain.strip() and "Traceback" not in plain
    if args == ["doctor"]:  # the test server's settings findings are red on a terminal
        assert any(is_colour(m) for m in SGR.findall(coloured)), coloured
    assert not [m for m in SGR.findall(plain) if is_colour(m)], plain


def test_piped_ids_of_the_longest_names_are_whole(redis_url: str, client: redis.Redis) -> None:
    q = Queue(client, "q" * 32 + uuid.uuid4().hex)  # 64: the longest queue name
    try:
        (dead,) = make_dead(q)
        job = q.enqueue("t", {"a": 1}, job_id="j" * 96 + uuid.uuid4().hex)  # 128: the longest
        for args in (["jobs", "list", "--state", "due"], ["jobs", "show", job], ["stats"]):
            out = piped(*args, "-q", q.name, url=redis_url).stdout
            lines = out.splitlines()
            assert any(q.name in line for line in lines), (args, out)
            if args[0] == "jobs":
                assert any(job in line for line in lines), (args, out)
        dead_out = piped("dead", "list", "-q", q.name, url=redis_url).stdout
        assert any(dead in line for line in dead_out.splitlines()), dead_out
    finally:
        delete_queue(client, q)


def test_piped_leased_list_keeps_the_worker_id_and_task_whole(redis_url: str, q: Queue) -> None:
    task = "billing.invoices.render_monthly_statement_pdf"
    worker = "billing-worker-deployment-7d9f8b6c5d-x2x4z:1:9f3a1c2b"  # a k8s pod's host:pid:hex
    job = q.enqueue(task, {"a": 1}, job_id="invoice-" + str(uuid.uuid4()))
    q.claim(worker, limit=1)
    out = piped("jobs", "list", "--state", "leased", "-q", q.name, url=redis_url).stdout
    row = [line for line in out.splitlines() if job in line]
    assert row, out
    assert worker in row[0] and task in row[0], out


def test_a_leased_row_too_wide_for_a_terminal_is_a_block_with_ids_whole(
    redis_url: str, q: Queue
) -> None:
    """Where the terminal (COLUMNS) cannot hold the row whole: one block per job, not a table
    folding the task and worker id mid-word; wide enough, the table."""
    task = "billing.invoices.render_monthly_statement_pdf"
    worker = "billing-worker-deployment-7d9f8b6c5d-x2x4z:1:9f3a1c2b"
    job = q.enqueue(task, {"a": 1}, job_id="invoice-" + str(uuid.uuid4()))
    q.claim(worker, limit=1)
    args = ["jobs", "list", "--state", "leased", "-q", q.name, "--url", redis_url]
    narrow = tty_output(args, dict(piped_env(), COLUMNS="150")).splitlines()
    assert any(job in line and task in line for line in narrow), narrow
    assert any(line.strip() == f"worker: {worker}" for line in narrow), narrow
    wide = tty_output(args, dict(piped_env(), COLUMNS="200")).splitlines()
    assert any(job in line and task in line and worker in line for line in wide), wide


def test_a_widened_pipe_still_wraps_a_long_error(redis_url: str, q: Queue) -> None:
    """A pipe is widened for whole ids and task names, not for every error's length."""
    task = "reports." + "x" * 150
    job = q.enqueue(task, 1, job_id="j" * 96 + uuid.uuid4().hex, max_attempts=1)
    error = " ".join(["the upstream ledger refused the statement"] * 8)  # 335 characters
    (lease,) = q.claim("w", limit=1).jobs
    q.fail(lease.id, lease.token, ValueError(error))
    out = piped("jobs", "list", "--state", "dead", "-q", q.name, url=redis_url).stdout
    lines = out.splitlines()
    assert any(job in line and task in line for line in lines), out
    assert max(map(len, lines)) < len(job) + len(task) + len(error) // 2, out  # wrapped
    cells = [line.split("│")[-2].strip() for line in lines if "│" in line]
    assert " ".join(c for c in cells if c) == f"ValueError: {error}", out  # by word
