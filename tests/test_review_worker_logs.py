"""Review: what the worker and the CLI write to their logs, as an operator reads them in journald
or a log pipeline (scheduler/worker/logs.py, log_limit.py, scheduler/cli/worker.py; README
"Workers", docs/glossary.md, docs/security.md, docs/guide/workers.md).

Real `scheduler worker` processes (lone, `--burst`, and a `-p 2` pool) run registries written
to tmp_path against the run's own server, each bounded by a timeout; the rest run an embedded
Worker on its own loop in a thread (tests/embedded_worker.py) with a logger of the test's own,
formatted by the worker's formatters. Each xfail names what the code does instead."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import shlex
import signal
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler import JobSpec, Queue, Registry
from scheduler.cli.main import main
from scheduler.core.exits import EXIT_UNREACHABLE, EXIT_USAGE
from scheduler.worker import WorkerSettings, logs
from tests.embedded_worker import worker_thread
from tests.workers.procs import ROOT, SCHEDULER, stop_all, wait_for

# -- helpers ----------------------------------------------------------------------------------


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def events(self, event: str) -> list[logging.LogRecord]:
        return [r for r in self.records if getattr(r, "event", None) == event]


@pytest.fixture
def captured(queue_name: str) -> Iterator[tuple[logging.Logger, Records]]:
    """A worker logger of this test's own (not propagating), at INFO, keeping its records."""
    log = logging.getLogger(f"scheduler.worker.review_logs.{queue_name}")
    log.setLevel(logging.INFO)
    log.propagate = False
    seen = Records()
    log.handlers[:] = [seen]
    yield log, seen
    log.handlers[:] = []


def wait_records(seen: Records, event: str, n: int, timeout_s: float = 30.0) -> None:
    wait_for(lambda: len(seen.events(event)) >= n, timeout_s, f"{n} {event!r} log lines")


def write_registry(tmp_path: Path, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    return f"{name}:registry"


def worker_cmd(url: str, registry: str, queue: str, *args: str) -> list[str]:
    return [SCHEDULER, "worker", registry, "--url", url, "--queue", queue, *args]


def worker_env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=f"{tmp_path}:{ROOT}")


def run_cli_worker(
    url: str, tmp_path: Path, registry: str, queue: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """`scheduler worker` run to its exit (`--burst`, or a refused start), 60 s at most."""
    return subprocess.run(
        worker_cmd(url, registry, queue, *args),
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=worker_env(tmp_path),
    )  # fmt: skip


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every non-blank line as a JSON object; AssertionError naming the first that is not."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}\n--- all:\n{text}") from None
        assert isinstance(obj, dict), line
        out.append(obj)
    return out


APP_REGISTRY = """
    import logging
    from scheduler import Registry

    registry = Registry()
    app = logging.getLogger("review.app")

    @registry.task(name="chatty")
    def chatty(payload, ctx):
        app.info("app-info %s", ctx.job_id)
        app.warning("app-warning %s", ctx.job_id)
        return "ok"

    @registry.task(name="failing")
    def failing(payload, ctx):
        raise RuntimeError("failing\\nsecond line")
"""


# -- defects ----------------------------------------------------------------------------------


def test_a_registry_that_configures_logging_does_not_silence_the_worker(
    redis_url: str, q: Queue, tmp_path: Path
) -> None:
    """An app's registry module configures logging at import with the stdlib's dictConfig
    (Django's settings, most apps' logging.conf). Its default disable_existing_loggers=True
    disables every logger that exists already, and `scheduler worker` created
    `scheduler.worker` (logs.setup) before importing the registry: the worker then logs
    nothing, not its start, not one job's claimed / done / dead line, not a crash."""
    registry = write_registry(
        tmp_path,
        "review_dictconfig",
        APP_REGISTRY
        + """
    import logging.config
    logging.config.dictConfig({"version": 1, "root": {"level": "INFO"}})
    """,
    )
    done, dead = q.enqueue("chatty", 1), q.enqueue("failing", 2, max_attempts=1)
    out = run_cli_worker(redis_url, tmp_path, registry, q.name, "--burst", "--json-logs")
    assert out.returncode == 0, out.stderr
    lines = json_lines(out.stderr)
    assert any("started" in x["msg"] for x in lines), out.stderr
    assert [x["job_id"] for x in lines if x.get("event") == "done"] == [done], out.stderr
    assert [x["job_id"] for x in lines if x.get("event") == "dead"] == [dead], out.stderr


def test_a_handlers_own_logging_reaches_the_worker_log_as_json(
    redis_url: str, q: Queue, tmp_path: Path
) -> None:
    """A handler logs with `logging.getLogger(__name__)` as any library does. `scheduler
    worker` owns the process's stderr, but it sets up only the `scheduler` logger: the root
    logger has no handler, so the app's INFO line is dropped (whatever --log-level says) and
    its WARNING is written by Python's last-resort handler as `app-warning <id>`, no time,
    no level, and not JSON under --json-logs: a JSON pipeline rejects it."""
    registry = write_registry(tmp_path, "review_app", APP_REGISTRY)
    job = q.enqueue("chatty", 1)
    out = run_cli_worker(redis_url, tmp_path, registry, q.name, "--burst", "--json-logs")
    assert out.returncode == 0, out.stderr
    lines = json_lines(out.stderr)  # the app's warning, as written today, is no JSON line
    msgs = [x["msg"] for x in lines]
    assert f"app-info {job}" in msgs and f"app-warning {job}" in msgs, out.stderr


def test_json_logs_a_refused_start_is_a_json_line(redis_url: str, tmp_path: Path) -> None:
    """With `--json-logs` the one line saying why a worker will not start (the one an
    operator's alert is about: a restart loop) is plain text `error: cannot reach Redis at
    ...`, as are the registry's import error and a refused setting: a JSON pipeline drops
    or flags them as unparseable. Each should be a JSON object with level `error`."""
    registry = write_registry(tmp_path, "review_app", APP_REGISTRY)
    gone = "unix:///nonexistent/review-logs.sock"
    cases = [
        (gone, registry, [], EXIT_UNREACHABLE),
        (redis_url, "review_missing_module:registry", [], 4),
        (redis_url, registry, ["--grace", "-1"], EXIT_USAGE),
    ]
    for url, reg, extra, code in cases:
        out = run_cli_worker(url, tmp_path, reg, "q-review-logs", "--json-logs", *extra)
        assert out.returncode == code, (reg, extra, out.stderr)
        lines = json_lines(out.stderr)
        assert [x["level"] for x in lines][-1:] == ["error"], out.stderr


PASSWORD = "Zq7pW3xK9vL2mN8r"


def test_an_error_cut_for_the_log_never_shows_part_of_a_url_password(
    redis_url: str, q: Queue, captured: tuple[logging.Logger, Records]
) -> None:
    """docs/security.md: every worker log line has URL passwords redacted. The retry / dead
    line's `error` is the handler's message cut to 200 characters (reporting.py `_failed`:
    `err[1][:200]`), and only then redacted by the formatter; when the cut falls inside a
    URL's password, what is left (`redis://app:Zq7pW3x`) has no `@`, so redact() sees no
    password and the first characters of it are written to the log. The stored last_error
    (fail_reply.py) redacts first, then cuts."""
    log, seen = captured
    reg = Registry()
    message = "." * 180 + f" redis://app:{PASSWORD}@cache.internal:6379/0 refused"

    @reg.task(name="leaky")
    def leaky(payload: Any, ctx: Any) -> None:
        raise RuntimeError(message)

    job = q.enqueue("leaky", None, max_attempts=1)
    with worker_thread(redis_url, reg, WorkerSettings(queues=(q.name,)), logger=log):
        wait_records(seen, "dead", 1)
    (line,) = seen.events("dead")
    assert line.job_id == job  # type: ignore[attr-defined]
    for formatter in (logs.JsonFormatter(), logs.TextFormatter()):
        text = formatter.format(line)
        assert PASSWORD[:5] not in text, text


def test_json_logs_show_an_undecodable_byte_as_backslash_x(
    redis_url: str, q: Queue, captured: tuple[logging.Logger, Records]
) -> None:
    """A handler's error names a file whose name is not UTF-8 (os.fsdecode keeps the byte as
    a lone surrogate, U+DCFF). docs/security.md: undecodable bytes are shown as escapes,
    `0xff` as `\\xff`; the plain formatter does so (clean()), the JSON one writes `\\udcff`:
    JSON text that is no Unicode (a lone surrogate), which serde_json, Go's encoding/json (it
    substitutes U+FFFD) and Vector's parsers reject or alter. The stored last_error is
    already UTF-8-safe (fail_reply.py)."""
    log, seen = captured
    reg = Registry()

    @reg.task(name="undecodable")
    def undecodable(payload: Any, ctx: Any) -> None:
        raise FileNotFoundError(os.fsdecode(b"/data/report-\xff.csv"))

    q.enqueue("undecodable", None, max_attempts=1)
    with worker_thread(redis_url, reg, WorkerSettings(queues=(q.name,)), logger=log):
        wait_records(seen, "dead", 1)
    (line,) = seen.events("dead")
    assert "report-\\xff.csv" in logs.TextFormatter().format(line)  # the plain one: as promised
    got = json.loads(logs.JsonFormatter().format(line))
    got["error"].encode("utf-8")  # strict: a lone surrogate raises UnicodeEncodeError
    assert "report-\\xff.csv" in got["error"], got


def logfmt_fields(line: str) -> list[tuple[str, str]]:
    """The key=value words of a plain line as a logfmt reader (or a grep for `event=dead`)
    sees them; double-quoted values are one word."""
    words = shlex.split(line.splitlines()[0])
    return [tuple(w.split("=", 1)) for w in words if "=" in w]  # type: ignore[misc]


def test_plain_lines_fields_cannot_be_forged_by_an_error_message(
    redis_url: str, q: Queue, captured: tuple[logging.Logger, Records]
) -> None:
    """The plain log line is `<time> <LEVEL> job retry <id> event=retry queue=... job_id=...
    error=<message> retry_at_ms=...`. The message is escaped (no newline, no ESC) but not
    quoted: a payload echoed in an exception, `bad input event=dead job_id=<another id>`,
    puts a second `event` and `job_id` on the line. `grep 'job_id=X'` and a logfmt reader
    (Loki's, Vector's: the last value wins) take it for a dead line of the other job."""
    log, seen = captured
    reg = Registry()

    @reg.task(name="echoes")
    def echoes(payload: Any, ctx: Any) -> None:
        raise ValueError(f"bad input {payload}")

    job = q.enqueue("echoes", "event=dead job_id=0000000000000000", max_attempts=1)
    with worker_thread(redis_url, reg, WorkerSettings(queues=(q.name,)), logger=log):
        wait_records(seen, "dead", 1)
    (line,) = seen.events("dead")
    fields = logfmt_fields(logs.TextFormatter().format(line))
    assert [v for k, v in fields if k == "event"] == ["dead"], fields
    assert [v for k, v in fields if k == "job_id"] == [job], fields


def test_asyncio_reports_routed_to_the_worker_log_keep_their_traceback(
    redis_url: str, q: Queue, captured: tuple[logging.Logger, Records]
) -> None:
    """An async handler starts a background task and never awaits it; the task crashes.
    asyncio reports "Task exception was never retrieved" with the exception's traceback
    (its default handler logs exc_info). On a loop with no handler of its own (the CLI's, or
    an app that never set one) the worker takes these reports over, "so --json-logs output
    stays one JSON object per line", but logs only `asyncio: <message>: ValueError: <text>`:
    where the task failed is gone. JsonFormatter would carry the traceback as one `exc`
    string, so passing exc_info costs no line."""
    log, seen = captured
    reg = Registry()

    async def review_background_sync_step() -> None:
        raise ValueError("background step failed")

    @reg.task(name="spawns")
    async def spawns(payload: Any, ctx: Any) -> str:
        task = asyncio.get_running_loop().create_task(review_background_sync_step())
        while not task.done():
            await asyncio.sleep(0.01)
        del task
        gc.collect()  # the unretrieved exception is reported as the Task is collected
        return "ok"

    q.enqueue("spawns", None)
    with worker_thread(redis_url, reg, WorkerSettings(queues=(q.name,)), logger=log):
        wait_records(seen, "done", 1)
    reports = [r for r in seen.records if r.getMessage().startswith("asyncio:")]
    assert reports, [r.getMessage() for r in seen.records]
    text = logs.JsonFormatter().format(reports[0])
    assert "review_background_sync_step" in json.loads(text).get("exc", ""), text


def test_a_pool_childs_lines_say_which_child_wrote_them(
    redis_url: str, q: Queue, tmp_path: Path
) -> None:
    """`scheduler worker -p 2 --json-logs`: the children write to the pool's stderr. A job
    transition carries `worker` (host:pid:random), but every other line of a child (`stop
    asked by the pool's supervisor`, `redis error during claim ...`, the server settings
    warning, `worker crashed`) has only ts, level, logger and msg: in journald's one stream
    an operator cannot tell which child is failing. The supervisor's own lines name
    `worker_process` and `pid`; a child's should name itself the same way."""
    registry = write_registry(tmp_path, "review_app", APP_REGISTRY)
    log_path = tmp_path / "pool.log"
    with open(log_path, "ab") as out:
        pool = subprocess.Popen(
            worker_cmd(redis_url, registry, q.name, "-p", "2", "--json-logs", "--grace", "1"),
            cwd=tmp_path, env=worker_env(tmp_path), stdout=out, stderr=out,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:

        def started() -> int:
            text = log_path.read_text(errors="replace")
            return sum("started: queues=" in line for line in text.splitlines())

        wait_for(lambda: started() == 2, 30, "both children started")
        pool.send_signal(signal.SIGTERM)
        assert pool.wait(30) == 0
    finally:
        stop_all([pool])
    lines = json_lines(log_path.read_text())
    stops = [x for x in lines if x["msg"].startswith("stop asked by the pool's supervisor")]
    assert len(stops) == 2, lines
    who = {x.get("worker") or x.get("pid") for x in stops}
    assert None not in who and len(who) == 2, stops


def test_finished_runs_lines_carry_their_duration_ms(
    redis_url: str, q: Queue, captured: tuple[logging.Logger, Records]
) -> None:
    """An operator looking for the slow jobs of one task filters the log by task and sorts by
    duration: every log pipeline's first question, and the metrics cannot name a job. The
    worker measures each run (scheduler_job_duration_seconds) but its done, retry and dead
    lines carry only job id, task, queue, worker, attempt and token."""
    log, seen = captured
    reg = Registry()

    @reg.task(name="quick")
    def quick(payload: Any, ctx: Any) -> str:
        return "ok"

    @reg.task(name="breaks")
    def breaks(payload: Any, ctx: Any) -> None:
        raise RuntimeError("no")

    q.enqueue("quick", None)
    q.enqueue("breaks", None, max_attempts=1)
    with worker_thread(redis_url, reg, WorkerSettings(queues=(q.name,)), logger=log):
        wait_records(seen, "done", 1)
        wait_records(seen, "dead", 1)
    for line in seen.events("done") + seen.events("dead"):
        got = getattr(line, "duration_ms", None)
        assert isinstance(got, int) and got >= 0, line.__dict__


# -- guards: what was checked and holds ---------------------------------------------------------


def test_a_failure_storm_logs_one_json_dead_line_per_job_and_nothing_more(
    redis_url: str, q: Queue, captured: tuple[logging.Logger, Records]
) -> None:
    """10,000 jobs whose handler fails with a multi-line, control-character message: each gets
    its claimed and its dead line (never capped: log_limit.py holds back only repeated
    retry warnings and refused reports), every line is one JSON object on one line with the
    filter fields typed, and nothing else is logged per job."""
    log, seen = captured
    reg = Registry()

    @reg.task(name="storm")
    async def storm(payload: Any, ctx: Any) -> None:
        raise RuntimeError(f'line one\nline two\r\x1b[31m {payload}\u2028{{"event": "done"}}')

    n = 10_000
    ids = q.enqueue_many([JobSpec("storm", i, max_attempts=1) for i in range(n)])
    settings = WorkerSettings(queues=(q.name,), concurrency=64, batch_size=200)
    with worker_thread(redis_url, reg, settings, logger=log):
        wait_records(seen, "dead", n, timeout_s=45)
    dead = seen.events("dead")
    assert sorted(r.job_id for r in dead) == sorted(ids)  # type: ignore[attr-defined]
    assert len(seen.events("claimed")) == n
    assert len(seen.records) <= 2 * n + 5, len(seen.records)
    fmt = logs.JsonFormatter()
    for r in dead[:500] + seen.events("claimed")[:500]:
        text = fmt.format(r)
        assert "\n" not in text and "\r" not in text and "\x1b" not in text, text
        got = json.loads(text)
        assert got["event"] in ("claimed", "dead") and got["queue"] == q.name
        for field in ("job_id", "task", "worker", "token"):
            assert isinstance(got[field], str) and got[field], got
        assert type(got["attempt"]) is int and got["attempt"] == 1, got
    assert json.loads(fmt.format(dead[0]))["error"].startswith("line one\nline two\r\x1b[31m")


def test_an_embedded_worker_leaves_the_apps_logging_alone(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    """Embedded (`Worker.run` in an app), nothing is configured: no basicConfig, no handler on
    the root or `scheduler` logger, no level or propagate changed; the worker's lines (with
    their fields as record attributes) and the handler's own reach the app's root handler,
    each once."""
    root, sched = logging.getLogger(), logging.getLogger("scheduler")
    seen = Records()
    saved = (root.level, sched.handlers[:], sched.propagate, sched.level)
    # A fresh app process: an earlier in-process `scheduler worker` (CliRunner) set it up.
    sched.handlers[:], sched.propagate, sched.level = [], True, logging.NOTSET
    root.addHandler(seen)
    root.setLevel(logging.INFO)
    try:
        before = (root.handlers[:], root.level, sched.handlers[:], sched.propagate, sched.level)
        reg = Registry()
        marker = uuid.uuid4().hex

        @reg.task(name="embedded")
        def embedded(payload: Any, ctx: Any) -> str:
            logging.getLogger("review.embedded.app").info("app %s", marker)
            return "ok"

        job = q.enqueue("embedded", None)
        with worker_thread(redis_url, reg, WorkerSettings(queues=(q.name,))):
            wait_records(seen, "done", 1)
        after = (root.handlers[:], root.level, sched.handlers[:], sched.propagate, sched.level)
        assert after == before
    finally:
        root.removeHandler(seen)
        root.level, sched.handlers[:], sched.propagate, sched.level = saved
    assert [r.job_id for r in seen.events("done")] == [job]  # type: ignore[attr-defined]
    assert [r.name for r in seen.records if r.getMessage() == f"app {marker}"] == [
        "review.embedded.app"
    ]


@pytest.mark.parametrize("value", ["verbose", "", "warn", "10", "CRITICAL", "info "])
def test_a_bad_log_level_is_a_usage_error(value: str) -> None:
    """`--log-level` takes debug, info, warning, error (any case); anything else exits 2
    naming the option, before the registry is imported."""
    out = CliRunner().invoke(
        main, ["worker", "review_never_imported:registry", "--log-level", value]
    )
    assert out.exit_code == EXIT_USAGE, out.output
    assert "--log-level" in out.output


def test_a_lone_workers_json_lines_are_json_and_at_warning_keep_the_dead_line(
    redis_url: str, q: Queue, tmp_path: Path
) -> None:
    """`scheduler worker --json-logs --log-level warning`: the claimed and done lines (INFO) are
    left out, a job's dead line (WARNING) is kept, and every line of the worker's own is one
    JSON object (the handler's multi-line error escaped in its `error` string)."""
    registry = write_registry(tmp_path, "review_app_failing", APP_REGISTRY)
    dead = q.enqueue("failing", None, max_attempts=1)
    q.enqueue("failing", None, max_attempts=1)
    out = run_cli_worker(
        redis_url, tmp_path, registry, q.name, "--burst", "--json-logs", "--log-level", "warning"
    )
    assert out.returncode == 0, out.stderr
    lines = json_lines(out.stderr)
    events = [x.get("event") for x in lines if x.get("event")]
    assert events.count("dead") == 2 and "claimed" not in events, out.stderr
    first = next(x for x in lines if x.get("job_id") == dead)
    assert first["error"] == "failing\nsecond line" and first["level"] == "warning", first
    assert type(first["ts"]) is float and type(first["attempt"]) is int, first
