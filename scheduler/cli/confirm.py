"""The question a command asks before a change it cannot undo (`--yes` skips it). A run without a
terminal is never left hanging or told only "Aborted!": stdin at EOF (cron, </dev/null) and an
open pipe no one writes to (ssh -T, a CI step, a supervisor) are refused, exit 1, nothing
changed, saying to pass --yes; an answer on a pipe (`yes | scheduler dead purge`) is taken."""

from __future__ import annotations

import os
import select
import sys
import time
from typing import IO

import click

from scheduler.cli.common import Refused
from scheduler.core.safety import safe

# How long stdin, when not a terminal, has to deliver its answer line: `yes |` or a heredoc
# answers at once; a pipe that never does is refused then rather than waited on forever.
ANSWER_WAIT_S = 10
_ANSWER_MAX_BYTES = 64  # a longer line is no y/n answer: a stream, not a reply
_YES = ("y", "yes")


def confirm(question: str, *, action: str) -> None:
    """Returns once `question` is answered yes (asked on stderr: stdout holds the answer only,
    one JSON object with --json); otherwise Refused, saying why, and `--yes` to `action`."""
    stdin = sys.stdin
    fd = _fileno(stdin)
    if stdin is not None and (fd is None or stdin.isatty()):  # a person; CliRunner's input
        try:
            yes = click.confirm(question, err=True)
        except click.Abort:  # EOF (or Ctrl-C) at the prompt: no answer came
            raise Refused(_no_answer(stdin.isatty(), action)) from None
    elif fd is None:  # no stdin at all (closed fd 0)
        raise Refused(_no_answer(False, action))
    else:
        click.echo(f"{question} [y/N]: ", nl=False, err=True)
        answer = _line(fd, action).strip()
        click.echo(safe(answer), err=True)  # the prompt's line ended, as a terminal's Enter
        yes = answer.lower() in _YES
    if not yes:
        raise Refused("declined: nothing changed")


def _no_answer(tty: bool, action: str) -> str:
    if tty:
        return "no answer: nothing changed"
    return f"no answer (stdin is not a terminal): pass --yes to {action}"


def _fileno(stream: IO[str] | None) -> int | None:
    try:
        return stream.fileno() if stream is not None else None
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation: a BytesIO
        return None


def _line(fd: int, action: str) -> str:
    """One line read from stdin (not a terminal) within ANSWER_WAIT_S, a byte at a time: what
    follows it is left unread. EOF ends a line that has something in it."""
    deadline = time.monotonic() + ANSWER_WAIT_S
    got = bytearray()
    while len(got) <= _ANSWER_MAX_BYTES:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            click.echo(err=True)
            raise Refused(
                f"no answer on stdin within {ANSWER_WAIT_S} s (not a terminal): "
                f"pass --yes to {action}"
            )
        byte = os.read(fd, 1)
        if byte in (b"", b"\n"):
            if not byte and not got:
                click.echo(err=True)
                raise Refused(_no_answer(False, action))
            break
        got += byte
    return got.decode(errors="replace")
