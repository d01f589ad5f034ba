"""A checkout of an older commit for the tests that run a previous version beside this one
(rolling deploys): a detached git worktree, removed after the block."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.workers.procs import ROOT


@contextmanager
def old_worktree(rev: str, prefix: str) -> Iterator[Path]:
    """The tree of `rev` in a new temporary directory whose name starts with `prefix`; skips the
    test when git cannot make it (a shallow clone without that commit, no git)."""
    where = Path(tempfile.mkdtemp(prefix=prefix)) / "tree"
    made = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev],
        capture_output=True, text=True,
    )  # fmt: skip
    if made.returncode != 0:
        shutil.rmtree(where.parent, ignore_errors=True)
        pytest.skip(f"git cannot make a worktree of {rev}: {made.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)],
                       capture_output=True)  # fmt: skip
        shutil.rmtree(where.parent, ignore_errors=True)
