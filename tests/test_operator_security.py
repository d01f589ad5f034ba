"""Hostile stored data against the operator surface (issue 17, items 2-4 and "Done when").

Anyone holding the producer credential can write any bytes into `sched:*`, and any handler's
exception text becomes `last_error`. These tests write hostile values by hand (terminal escapes,
OSC title changes, C1 controls, bidi overrides, rich markup, non-UTF-8 bytes, a pickle, numbers
no reader expects) into every field an operator tool shows, then run the real worker and every
read command: nothing crashes, no traceback, no raw control character on stdout / stderr,
credentials never printed, nothing unpickled, and the queue's other jobs still run."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import Queue
from scheduler.cli.main import main
from scheduler.core.keys import QueueKeys
from scheduler.core.safety import clean, redact
from tests.redis_server import RedisProcess
from tests.workers.procs import wait_for

ROOT = Path(__file__).resolve().parents[1]
SCHEDULER = str(Path(sys.executable).parent / "scheduler")
QUEUE = "hostile"
# What a terminal would act on: C0 controls but \t and \n, DEL, C1, bidi controls, separators.
RAW_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]"
)
PY_TRACEBACK = re.compile(r'Traceback \(most recent call last\):\n\s+File "')
ESCAPES = "\x1b[2J\x1b]0;pwned\x07\x9b31m\u202egnp.exe\r\x00"
MARKUP = "[/bold] [red]fake[/red] [link=http://x]y[/link] [/]"
PICKLE_MARKER = "unpickled-marker"


def evil(tag: str) -> str:
    return f"{tag}:{ESCAPES}{MARKUP}"


@pytest.fixture
def raw(module_server: RedisProcess) -> Iterator[redis.Redis]:
    """Bytes in, bytes out: what a hostile producer writes."""
    client = redis.Redis.from_url(module_server.url)
    client.flushdb()  # a private server: module_server in tests/conftest.py
    yield client
    client.close()


def no_raw_controls(text: str, where: str) -> None:
    found = RAW_CONTROL.findall(text)
    assert not found, f"{where}: raw control characters {found!r} in output:\n{text[:3000]!r}"
    # A Python traceback of the tool itself (a stored traceback shown on purpose has no File).
    assert not PY_TRACEBACK.search(text), f"{where}: a traceback:\n{text[:3000]}"


def run_cli(url: str, *args: str) -> Result:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, [*args, "--url", url])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{args}: crashed") from result.exception
    return result


def checked(url: str, *args: str, codes: tuple[int, ...] = (0,)) -> Result:
    result = run_cli(url, *args)
    where = " ".join(args)
    assert result.exit_code in codes, f"{where}: exit {result.exit_code}\n{result.output}"
    no_raw_controls(result.stdout, where + " (stdout)")
    no_raw_controls(result.stderr, where + " (stderr)")
    if "--json" in args and result.exit_code == 0:
        json.loads(result.stdout)
    return result


def store_job(raw: redis.Redis, job_id: str, place: str, **fields: str | bytes) -> None:
    """A job written by hand, as a hostile producer can: any field, any bytes."""
    k = QueueKeys(QUEUE)
    now_ms = int(time.time() * 1000)
    base: dict[str, str | bytes] = {
        "task": "noop", "payload": "null", "state": place, "attempts": "0", "max_attempts": "3",
        "run_at_ms": str(now_ms - 1000), "enqueued_ms": str(now_ms - 2000),
    }  # fmt: skip
    base.update(fields)
    raw.hset(k.job(job_id), mapping=base)  # type: ignore[arg-type]
    if place == "dead":
        raw.zadd(k.dead, {job_id: now_ms})
    elif place == "leased":
        raw.zadd(k.leased, {job_id: now_ms + 600_000})
    else:
        raw.zadd(k.due, {job_id: now_ms - 1000})


HOSTILE_IDS = {
    "task": "h-task", "error": "h-error", "bytes": "h-bytes", "payload": "h-payload",
    "pickle": "h-pickle", "huge": "h-huge", "timeout": "h-timeout", "history": "h-history",
    "deadbytes": "h-deadbytes", "leased": "h-leased",
}  # fmt: skip


def plant(raw: redis.Redis, marker: Path) -> None:
    """Every hostile value of issue 17 items 2-4, plus a pickle, 1e400 and '30s'."""
    k = QueueKeys(QUEUE)
    i = HOSTILE_IDS
    now_ms = int(time.time() * 1000)
    history = json.dumps([
        "not an object",
        {"attempt": evil("a"), "at_ms": 10**30, "type": evil("T"), "message": evil("m"),
         "traceback": "Traceback (most recent call last):\n  " + evil("tb") + "\n"},
    ])  # fmt: skip
    store_job(raw, i["task"], "due", task=evil("task"))
    store_job(raw, i["payload"], "due", payload=json.dumps({"x": ESCAPES + MARKUP}))
    store_job(raw, i["pickle"], "due",
              payload=f"cos\nsystem\n(S'touch {marker}'\ntR.")  # fmt: skip
    store_job(raw, i["huge"], "due", run_at_ms="1e400")
    store_job(raw, i["timeout"], "due", timeout_ms="30s")
    store_job(raw, i["bytes"], "due", task=b"t\xff\xfe", payload=b'"\xff\xc3("')
    store_job(raw, i["error"], "dead", last_error_type=evil("Type"), last_error=evil("err"),
              dead_reason=evil("reason"), dead_ms=str(now_ms), attempts="3",
              worker=evil("w"), result=json.dumps(ESCAPES))  # fmt: skip
    store_job(raw, i["history"], "dead", errors=history, dead_reason="x", dead_ms="1e400",
              last_error_type="E", last_error="boom")  # fmt: skip
    store_job(raw, i["deadbytes"], "dead", last_error_type=b"\xff", last_error=b"\xc3(\x1b[2J",
              dead_reason=b"\x80\x81", dead_ms=str(now_ms))  # fmt: skip
    store_job(raw, i["leased"], "leased", worker=evil("holder"), token=evil("1-tok"))
    # A worker record with a hostile host (the worker hash is what `workers` shows).
    wid = "w-hostile"
    raw.zadd(k.workers, {wid: now_ms})
    raw.hset(k.worker(wid), mapping={"host": evil("host"), "pid": "1", "queues": evil("q"),
                                     "started_ms": "1e400", "in_flight": "x"})  # fmt: skip
    raw.pexpire(k.worker(wid), 600_000)
    # A schedule with a hostile name and fields, and a key of a queue whose name is hostile.
    name = evil("sched")
    raw.sadd(k.schedules, name, b"s\xff")
    raw.hset(
        k.schedule(name),
        mapping={
            "task": evil("t"),
            "kind": "cron",
            "cron": evil("c"),
            "tz": evil("tz"),
            "pending": "1",
            "cursor_ms": "1e400",
        },
    )
    raw.hset(k.schedule("").encode() + b"s\xff", mapping={"task": "x"})
    raw.zadd("sched:{" + ESCAPES + "}:due", {"x": 1})


READ_COMMANDS: list[tuple[str, ...]] = [
    ("stats",), ("stats", "--json"), ("stats", "-q", QUEUE), ("stats", "-q", QUEUE, "--json"),
    ("workers",), ("workers", "--json"), ("keys", "-q", QUEUE), ("keys", "-q", QUEUE, "--json"),
    *[("jobs", "list", "-q", QUEUE, "--state", s, *j)
      for s in ("due", "scheduled", "leased", "dead") for j in ((), ("--json",))],
    ("dead", "list", "-q", QUEUE), ("dead", "list", "-q", QUEUE, "--json"),
    ("schedules", "list", "-q", QUEUE), ("schedules", "list", "-q", QUEUE, "--json"),
]  # fmt: skip


def read_everything(url: str) -> None:
    for args in READ_COMMANDS:
        checked(url, *args)
    for job_id in HOSTILE_IDS.values():
        for extra in ((), ("--json",)):
            checked(url, "jobs", "show", "-q", QUEUE, job_id, *extra)
    for extra in ((), ("--json",)):
        checked(url, "doctor", "--no-server", *extra, codes=(0, 1))


def test_every_read_command_shows_hostile_data_escaped(
    raw: redis.Redis, module_server: RedisProcess, tmp_path: Path
) -> None:
    plant(raw, tmp_path / PICKLE_MARKER)
    read_everything(module_server.url)
    # Shown, escaped, not dropped: the operator still sees what is stored.
    shown = checked(module_server.url, "jobs", "show", "-q", QUEUE, HOSTILE_IDS["error"]).stdout
    assert "\\x1b[2J" in shown and "\\u202e" in shown and "[/bold]" in shown
    history = checked(module_server.url, "jobs", "show", "-q", QUEUE, HOSTILE_IDS["history"]).stdout
    assert "last traceback" in history and "\\x1b]0;pwned\\x07" in history
    assert "host:\\x1b[2J" in checked(module_server.url, "workers").stdout
    as_json = json.loads(checked(module_server.url, "workers", "--json").stdout)
    assert as_json["workers"][0]["host"] == evil("host")  # JSON keeps the value, escaped


def test_non_utf8_job_data_is_shown_escaped_and_doctor_reports_it(
    raw: redis.Redis, module_server: RedisProcess, tmp_path: Path
) -> None:
    plant(raw, tmp_path / PICKLE_MARKER)
    url = module_server.url
    for extra in ((), ("--json",)):
        out = checked(url, "jobs", "show", "-q", QUEUE, HOSTILE_IDS["bytes"], *extra).stdout
        assert "\\xff\\xfe" in out.replace("\\\\", "\\")
        for state in ("due", "dead"):
            checked(url, "jobs", "list", "-q", QUEUE, "--state", state, *extra)
        out = checked(url, "dead", "list", "-q", QUEUE, *extra).stdout
        assert "\\xc3(" in out.replace("\\\\", "\\")
    report = json.loads(checked(url, "doctor", "--no-server", "--json", codes=(1,)).stdout)
    undecodable = {f["job_id"]: f for f in report["findings"] if f["code"] == "undecodable"}
    assert set(undecodable) >= {HOSTILE_IDS["bytes"], HOSTILE_IDS["deadbytes"]}
    assert "payload" in undecodable[HOSTILE_IDS["bytes"]]["message"]
    assert "last_error" in undecodable[HOSTILE_IDS["deadbytes"]]["message"]
    text = checked(url, "doctor", "--no-server", codes=(1,)).stdout
    assert f"undecodable job {HOSTILE_IDS['bytes']}" in text


def spawn_worker(url: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, TEST_REDIS_URL=url, PYTHONPATH=str(ROOT))
    with open(log, "wb") as out:
        return subprocess.Popen(
            [SCHEDULER, "worker", "tests.workers.basic:registry", "--url", url, "--queue", QUEUE,
             "--heartbeat-ms", "500", "--lease-ms", "2000", *args],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip


@pytest.mark.parametrize("log_format", [(), ("--json-logs",)], ids=["plain", "json"])
def test_real_worker_survives_hostile_jobs_and_logs_them_escaped(
    raw: redis.Redis, module_server: RedisProcess, tmp_path: Path, log_format: tuple[str, ...]
) -> None:
    marker = tmp_path / PICKLE_MARKER
    plant(raw, marker)
    reader = redis.Redis.from_url(
        module_server.url, decode_responses=True, encoding_errors="replace"
    )
    q = Queue(reader, QUEUE)
    good = [q.enqueue("noop", {"n": n}) for n in range(5)]
    log = tmp_path / "worker.log"
    worker = spawn_worker(module_server.url, log, *log_format)
    try:
        wait_for(lambda: all(q.status(j) == "done" for j in good) or worker.poll() is not None,
                 what="the good jobs")  # fmt: skip
        alive = worker.poll() is None
        if alive:
            worker.send_signal(signal.SIGTERM)
            code = worker.wait(30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    text = log.read_bytes().decode("utf-8", "surrogateescape")
    assert not marker.exists(), "a pickle was unpickled"
    no_raw_controls(text, "worker log")
    assert alive and code == 0, f"the worker stopped on its own or uncleanly:\n{text[-3000:]}"
    assert all(q.status(j) == "done" for j in good)
    assert q.status(HOSTILE_IDS["pickle"]) == "dead"
    assert q.get_job(HOSTILE_IDS["pickle"]).fields["last_error_type"] == "InvalidPayload"
    # Each job no worker can read is parked alone, with a reason; the rest ran.
    for name in ("task", "bytes", "huge", "timeout"):
        job = q.get_job(HOSTILE_IDS[name])
        assert (job.state, bool(job.dead_reason)) == ("dead", True), (name, job.fields)
    assert q.status(HOSTILE_IDS["payload"]) == "done"
    # And the operator tools still read the queue the worker left behind.
    read_everything(module_server.url)


def test_clean_and_redact_units() -> None:
    assert clean("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert clean("x\u202ey\u2066") == "x\\u202ey\\u2066"
    assert clean("\x9b\x7f\r\n\t") == "\\x9b\\x7f\\x0d\\x0a\\x09"
    assert clean("tb\n  at\tx\r\n", keep_newlines=True) == "tb\n  at\tx\\x0d\n"
    assert clean("byte \udcff") == "byte \\xff"  # surrogateescape: the original byte
    assert clean("ok é ü 漢字 [x]") == "ok é ü 漢字 [x]"
    # Invisible format characters: "job\u200b1" must not print as "job1".
    assert clean("job\u200b1\ufeff\xad") == "job\\u200b1\\ufeff\\xad"
    assert clean("a\U000e0041b") == "a\\U000e0041b"  # a tag character (hidden text)
    every_cf = [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"]
    assert [c for c in every_cf if clean(c) == c] == []
    assert redact("at rediss://app:pa@ss@h:6380/0 x") == "at rediss://app:***@h:6380/0 x"
    assert redact("unix://:pw@/run/redis.sock") == "unix://:***@/run/redis.sock"
    assert redact("redis://h:6379/0?password=pw&db=1") == "redis://h:6379/0?password=***&db=1"
    assert redact("redis://h:6379/0") == "redis://h:6379/0"


# -- 17.3: the Redis password appears in no output -------------------------------------------
PASSWORD = "pw-Zq8-secret"


def unreachable_url() -> str:
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    return f"rediss://sched-app:{PASSWORD}@127.0.0.1:{port}/0"


def test_worker_that_cannot_connect_never_prints_the_password(tmp_path: Path) -> None:
    url = unreachable_url()
    for log_format in ((), ("--json-logs",)):
        log = tmp_path / "worker.log"
        worker = spawn_worker(url, log, *log_format)
        code = worker.wait(60)
        text = log.read_text()
        assert code == 3, text  # EXIT_REDIS = EXIT_UNREACHABLE: unreachable at start
        assert "cannot reach Redis at rediss://sched-app:***@127.0.0.1" in text
        assert PASSWORD not in text


CLI_COMMANDS: list[tuple[str, ...]] = [
    *READ_COMMANDS, ("jobs", "show", "-q", QUEUE, "some-id"), ("doctor",), ("doctor", "--fix"),
    ("enqueue", "noop", "-q", QUEUE), ("dead", "requeue", "-q", QUEUE, "--yes"),
    ("dead", "purge", "-q", QUEUE, "--yes"), ("schedules", "pause", "s", "-q", QUEUE),
    ("schedules", "resume", "s", "-q", QUEUE), ("schedules", "remove", "s", "-q", QUEUE),
]  # fmt: skip


def test_no_cli_command_prints_the_password() -> None:
    url = unreachable_url()
    for args in CLI_COMMANDS:
        result = run_cli(url, *args)
        assert result.exit_code == 3, (args, result.output)  # EXIT_UNREACHABLE
        assert "cannot reach Redis" in result.stderr
        assert PASSWORD not in result.output, args
    demo = run_cli(url, "demo")
    assert demo.exit_code == 3 and PASSWORD not in demo.output, demo.output
    assert "redis://" not in demo.output or "***@" in demo.output
    # A URL the client refuses to parse is quoted back redacted too.
    bad = f"redis://sched-app:{PASSWORD}@127.0.0.1:notaport/0"
    result = run_cli(bad, "stats")
    assert result.exit_code == 2 and PASSWORD not in result.output, result.output


def test_log_formatters_escape_and_redact() -> None:
    """Plain: one line per record whatever the message holds (no fake line, no escape), the
    traceback the only multi-line part; JSON: ensure_ascii escapes; both redact URLs."""
    import io
    import logging

    from scheduler.worker import logs

    root = logging.getLogger("scheduler")
    saved = (root.handlers[:], root.level, root.propagate)
    try:
        for json_logs in (False, True):
            stream = io.StringIO()
            log = logs.setup("INFO", json_logs, stream)
            try:
                raise RuntimeError(f"boom {ESCAPES} at redis://u:{PASSWORD}@h:1/0")
            except RuntimeError:
                log.exception(
                    "fail %s",
                    evil("x") + "\n2026-01-01 INFO job done fake",
                    extra={"task": evil("t"), "url": f"rediss://u:{PASSWORD}@h/0"},
                )
            logs.transition(log, "claimed", queue="q", job_id="j", task=evil("task"), attempt=1,
                            token="1-t", level=logging.INFO)  # fmt: skip
            text = stream.getvalue()
            assert not RAW_CONTROL.findall(text), (json_logs, text)
            assert PASSWORD not in text and "***@h" in text
            lines = text.splitlines()
            if json_logs:
                assert [json.loads(line)["level"] for line in lines] == ["error", "info"]
            else:
                assert len([ln for ln in lines if re.match(r"^\d{4}-\d\d-\d\d ", ln)]) == 2, text
                assert "\\x0a2026-01-01 INFO job done fake" in lines[0]
                assert "Traceback (most recent call last):" in lines[1]
    finally:
        root.handlers[:], root.level, root.propagate = saved


def test_doctor_reports_and_repairs_infinite_scores(
    raw: redis.Redis, module_server: RedisProcess
) -> None:
    """`ZADD due inf id` hides a job forever and `ZADD leased inf id` holds its lease forever:
    doctor reports both (it crashed with OverflowError) and --fix sets them to now."""
    q = Queue(redis.Redis.from_url(module_server.url, decode_responses=True), QUEUE)
    held = q.enqueue("noop", None)
    assert [j.id for j in q.claim("w", limit=2).jobs] == [held]
    hidden = q.enqueue("noop", None)
    raw.zadd(q.keys.due, {hidden: float("inf")})
    raw.zadd(q.keys.leased, {held: float("inf")})
    report = json.loads(
        checked(module_server.url, "doctor", "--no-server", "--json", codes=(1,)).stdout
    )
    assert {(f["job_id"], f["code"]) for f in report["findings"]} == {
        (hidden, "bad-score"), (held, "bad-score")}  # fmt: skip
    fixed = json.loads(
        checked(module_server.url, "doctor", "--no-server", "--fix", "--json").stdout
    )
    assert {f["job_id"] for f in fixed["fixed"]} == {hidden, held} and fixed["ok"]
    again = {j.id for j in q.claim("w2", limit=5).jobs}  # the lapsed lease is reaped, re-run
    assert again == {hidden, held}
