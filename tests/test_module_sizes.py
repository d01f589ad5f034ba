"""Every module under scheduler/ stays under ~300 lines (issue 14), and docs/architecture.md names
every one of them (so a newcomer finds where a change belongs). An exception is listed below
with its reason and its own ceiling, and is dropped once the module is back under 300."""

from __future__ import annotations

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_LINES = 300
MODULES = sorted(p for p in (ROOT / "scheduler").rglob("*.py") if p.name != "__init__.py")
# path under scheduler/ -> (ceiling, why it may pass MAX_LINES)
EXCEPTIONS: dict[str, tuple[int, str]] = {
    "client/queue.py": (
        560,
        "the public sync API: one thin method per operation, each with its"
        " documented arguments, returns and errors (~234 lines without docstrings)",
    ),
    "client/aio.py": (560, "the public asyncio API, the twin of client/queue.py, same docstrings"),
    "worker/registry.py": (
        380,
        "Registry + JobContext grew with task handles (issue 14 time box:"
        " not yet split; ~304 lines without docstrings)",
    ),
}


def _rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT / "scheduler").as_posix()


def _lines(path: pathlib.Path) -> int:
    return len(path.read_text().splitlines())


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_module_is_under_300_lines(path: pathlib.Path) -> None:
    ceiling = EXCEPTIONS.get(_rel(path), (MAX_LINES, ""))[0]
    assert _lines(path) <= ceiling


def test_every_exception_is_still_needed_and_exists() -> None:
    sizes = {_rel(p): _lines(p) for p in MODULES}
    stale = [name for name in EXCEPTIONS if sizes.get(name, 0) <= MAX_LINES]
    assert stale == []


def test_the_walk_covers_every_package_folder() -> None:
    folders = {p.parent.name for p in MODULES}
    assert {"admin", "cli", "client", "core", "operations", "schedules", "worker"} <= folders


def test_architecture_names_every_module() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    missing = [_rel(p) for p in MODULES if f"`{p.name}`" not in doc]
    assert missing == []
