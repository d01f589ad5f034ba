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
    root = logging.getLogger("scheduler")
    for old in root.handlers:  # set up again (in-process): no dup of stderr left open
        if isinstance(old, _Handler) and old.owned:
            with contextlib.suppress(Exception):
                old.stream.close()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    return logging.getLogger(LOGGER)


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
