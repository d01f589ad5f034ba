"""scheduler/cli/confirm.py, the question before a change that cannot be undone: an answer line
on a pipe is taken (`yes | scheduler dead purge`), nothing after it read; a pipe that is at EOF,
stays silent or streams no answer is refused saying to pass --yes; a person at a terminal is
told what happened ("declined", "no answer"), never only "Aborted!"."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler import Queue
from scheduler.cli import confirm as confirm_mod
from scheduler.cli.common import Refused
from scheduler.cli.confirm import confirm
from scheduler.core import exits

SCHEDULER = str(Path(sys.executable).parent / "scheduler")


@pytest.fixture
def pipe(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, int]]:
    """stdin a pipe: (its read end, the write end the test answers on)."""
    r, w = os.pipe()
    reader = os.fdopen(r, "r")
    monkeypatch.setattr(sys, "stdin", reader)
    yield r, w
    reader.close()
    with contextlib.suppress(OSError):  # closed by the test
        os.close(w)


def refusal(action: str = "go") -> str:
    with pytest.raises(Refused) as info:
        confirm("Go?", action=action)
    return info.value.message


@pytest.mark.parametrize("answer", [b"y\n", b"YES\n", b" yes \n"])
def test_a_yes_line_on_a_pipe_is_taken_and_what_follows_left_unread(
    pipe: tuple[int, int], answer: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    r, w = pipe
    os.write(w, answer + b"next")
    confirm("Go?", action="go")
    assert os.read(r, 100) == b"next"
    assert capsys.readouterr().err.splitlines() == [f"Go? [y/N]: {answer.decode().strip()}"]


def test_a_last_line_without_a_newline_is_an_answer(pipe: tuple[int, int]) -> None:
    os.write(pipe[1], b"y")  # printf y | ...
    os.close(pipe[1])
    confirm("Go?", action="go")


@pytest.mark.parametrize("answer", [b"n\n", b"\n", b"no\n", b"maybe\n"])
def test_anything_but_yes_declines(pipe: tuple[int, int], answer: bytes) -> None:
    os.write(pipe[1], answer)
    assert refusal() == "declined: nothing changed"


def test_a_pipe_at_eof_says_to_pass_yes(pipe: tuple[int, int]) -> None:
    os.close(pipe[1])
    assert refusal("purge them") == "no answer (stdin is not a terminal): pass --yes to purge them"


def test_a_silent_open_pipe_is_refused_after_the_wait(
    pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write end stays open and nothing comes: refused when the wait is over (none here)."""
    monkeypatch.setattr(confirm_mod, "ANSWER_WAIT_S", 0)
    message = refusal()
    assert message == "no answer on stdin within 0 s (not a terminal): pass --yes to go"


def test_a_stream_without_a_line_end_is_no_answer_and_not_read_on(pipe: tuple[int, int]) -> None:
    r, w = pipe
    os.write(w, b"y" * 1000)  # `cat /dev/zero |`-like: no reply, and no waiting for one
    assert refusal() == "declined: nothing changed"
    assert len(os.read(r, 2000)) == 1000 - confirm_mod._ANSWER_MAX_BYTES - 1


def test_no_stdin_at_all_is_no_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", None)
    assert refusal() == "no answer (stdin is not a terminal): pass --yes to go"


def on_a_terminal(args: list[str], typed: bytes) -> tuple[int, str]:
    """Run with stdin, stdout and stderr a pty on which `typed` is typed."""
    main_fd, tty_fd = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")}
    proc = subprocess.Popen([SCHEDULER, *args], stdin=tty_fd, stdout=tty_fd, stderr=tty_fd,
                            env=dict(env, NO_COLOR="1"))  # fmt: skip
    os.close(tty_fd)
    os.write(main_fd, typed)  # the line discipline holds it until the prompt reads
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
        code = proc.wait(timeout=60)
    return code, out.decode(errors="replace")


@pytest.mark.parametrize(
    ("typed", "said"),
    [(b"n\n", "declined: nothing changed"), (b"\x04", "no answer: nothing changed")],  # ^D: EOF
)
def test_a_person_at_a_terminal_is_told_what_happened(
    redis_url: str, q: Queue, typed: bytes, said: str
) -> None:
    q.enqueue("t", 1)
    code, out = on_a_terminal(["jobs", "cancel", "--state", "due", "-q", q.name, "--url",
                               redis_url], typed)  # fmt: skip
    assert code == exits.EXIT_FAILED, out
    assert "Cancel 1 due job(s)" in out and said in out, out
    assert "--yes" not in out and "Aborted" not in out, out
    assert q.counts().due == 1


def test_yes_at_a_terminal_goes_on(redis_url: str, q: Queue) -> None:
    q.enqueue("t", 1)
    code, out = on_a_terminal(["jobs", "cancel", "--state", "due", "-q", q.name, "--url",
                               redis_url], b"y\n")  # fmt: skip
    assert code == exits.EXIT_OK, out
    assert "cancelled: 1 of 1" in out and q.counts().due == 0
