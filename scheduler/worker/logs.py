"""Worker logging: one line per job transition with job id, task, attempt and token; plain
text by default, one JSON object per line with --json-logs.

Log lines quote untrusted text (task names, exception messages with payload text, URLs), so
both formatters redact URL passwords; the plain one escapes control characters (a fake log line
or a terminal escape cannot be injected) and quotes a field's value logfmt-style when it holds
a space, '=' or '"' (an error message cannot add a field); the JSON one relies on ensure_ascii,
and shows an undecodable byte as `\\xff` text, as the plain one does (a lone surrogate is no
valid UTF-8: strict JSON readers reject the line)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
from typing import Any

from scheduler.core.safety import clean, redact, safe, visible_bytes

LOGGER = "scheduler.worker"
_RESERVED = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
_QUOTED = re.compile(r'[\s="]')  # a value with one of these is quoted (logfmt)
_json_logs = [False]  # setup's format: the lines written outside the logger follow it (console)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        for k, v in record.__dict__.items():
            if k not in _RESERVED and not k.startswith("_"):
                out[k] = redact(v) if isinstance(v, str) else v
        if record.exc_info:
            out["exc"] = redact(self.formatException(record.exc_info))
        # ensure_ascii (the default) writes every control character as \uXXXX.
        return json.dumps(visible_bytes(out), default=lambda v: visible_bytes(redact(str(v))))


def _value(v: object) -> str:
    """A field's value as logfmt writes it: bare, or quoted with `"` and `\\` escaped."""
    s = safe(v)
    if _QUOTED.search(s) is None:
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = f"{self.formatTime(record)} {record.levelname} {safe(record.getMessage())}"
        extra = [
            f"{k}={_value(v)}"
            for k, v in record.__dict__.items()
            if k not in _RESERVED and not k.startswith("_")
        ]
        if extra:
            line += " " + " ".join(extra)
        # A traceback is the one text meant to span lines: newlines kept, other controls escaped.
        if record.exc_info:
            line += "\n" + clean(redact(self.formatException(record.exc_info)), keep_newlines=True)
        if record.stack_info:
            line += "\n" + clean(redact(self.formatStack(record.stack_info)), keep_newlines=True)
        return line


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    owned = False  # its stream is our dup of stderr (closed when replaced)

    def handleError(self, record: logging.LogRecord) -> None:
        # A line that cannot be written (its stream gone) must not raise into the worker.
        with contextlib.suppress(Exception):
            super().handleError(record)


class _Who(logging.Filter):
    """Names the worker and its pid on each line: a pool's children share one stream."""

    def __init__(self, worker: str) -> None:
        super().__init__()
        self.worker, self.pid = worker, os.getpid()

    def filter(self, record: logging.LogRecord) -> bool:
        fields = record.__dict__
        fields.setdefault("worker", self.worker)  # a job's line has it already
        fields.setdefault("pid", self.pid)
        return True


def _stderr() -> Any:
    """A stream of our own on the process's stderr: a handler that closes sys.stderr (or
    replaces it) does not take the worker's log, nor the worker, with it."""
    try:
        fd = os.dup(sys.stderr.fileno())
    except (AttributeError, ValueError, OSError):  # no real stderr (embedded, captured)
        return sys.stderr
    return os.fdopen(fd, "w", buffering=1, encoding="utf-8", errors="backslashreplace")


def setup(level: str = "INFO", json_logs: bool = False, stream: Any = None) -> logging.Logger:
    handler = _Handler(stream or _stderr())
    handler.owned = stream is None and handler.stream is not sys.stderr
    handler.setFormatter(JsonFormatter() if json_logs else TextFormatter())
    _json_logs[0] = json_logs
    root = logging.getLogger("scheduler")
    for old in root.handlers:  # set up again (in-process): no dup of stderr left open
        if isinstance(old, _Handler) and old.owned:
            with contextlib.suppress(Exception):
                old.stream.close()
    top = logging.getLogger()  # after_registry's handler there too is replaced
    top.handlers[:] = [h for h in top.handlers if not isinstance(h, _Handler)]
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    return logging.getLogger(LOGGER)


def after_registry(level: str) -> None:
    """`scheduler worker`, once its registry is imported. A registry that ran
    logging.config.dictConfig / fileConfig (disable_existing_loggers, their default) disabled
    the worker's loggers, which then wrote nothing at all: they are enabled and set up again.
    The app's own loggers (a handler's logging.getLogger(__name__)) write to the worker's
    stream in its format, at --log-level, unless the registry gave the root logger a handler
    of its own: without one their INFO lines were dropped and their warnings written bare
    (logging.lastResort), no JSON. An embedded worker never calls this: the app's logging
    is the app's."""
    loggers = logging.root.manager.loggerDict
    disabled = [
        lg
        for name, lg in loggers.items()
        if name.partition(".")[0] == "scheduler" and isinstance(lg, logging.Logger) and lg.disabled
    ]
    for lg in disabled:
        lg.disabled = False
    sched = logging.getLogger("scheduler")
    if disabled:
        setup(level, _json_logs[0])
        logging.getLogger(LOGGER).warning(
            "the registry's logging configuration (logging.config's disable_existing_loggers) "
            "disabled %d of the worker's loggers: enabled again",
            len(disabled),
        )
    root, ours = logging.getLogger(), [h for h in sched.handlers if isinstance(h, _Handler)]
    if not root.handlers and ours:
        root.handlers[:] = ours
        root.setLevel(level.upper())


def name_lines(worker: str) -> None:
    """Every line the worker's handler writes from now on names `worker` and this pid."""
    for h in logging.getLogger("scheduler").handlers:
        if isinstance(h, _Handler):
            h.addFilter(_Who(worker))


def console_line(text: str, level: int = logging.ERROR) -> str:
    """What a refused start (and a line written outside the logger) prints: `error: text`, or
    under --json-logs one JSON log line (a pipeline would drop or flag the plain text). Takes
    no lock: a forked child writes it (fork_guard.py)."""
    name = logging.getLevelName(level)
    if not _json_logs[0]:
        return safe(f"{name.lower()}: {text}")
    fields = {"name": LOGGER, "msg": text, "levelno": level, "levelname": name, "pid": os.getpid()}
    return JsonFormatter().format(logging.makeLogRecord(fields))


def console(text: str, level: int = logging.ERROR) -> None:
    """console_line(text, level) on stderr."""
    print(console_line(text, level), file=sys.stderr, flush=True)


def transition(
    log: logging.Logger,
    event: str,
    *,
    queue: str,
    job_id: str,
    task: str,
    attempt: int,
    token: str,
    level: int = logging.INFO,
    **extra: Any,
) -> None:
    """One line for one job transition (claimed, done, retry, dead, expired, ...)."""
    if not log.isEnabledFor(level):
        return
    log.log(
        level,
        "job %s %s",
        event,
        job_id,
        extra={
            "event": event,
            "queue": queue,
            "job_id": job_id,
            "task": task,
            "attempt": attempt,
            "token": token,
            **extra,
        },
    )
