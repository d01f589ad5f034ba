"""Every module under scheduler/ stays under ~300 lines (issue 14), and docs/architecture.md names
every one of them (so a newcomer finds where a change belongs). An exception is listed below
with its reason and a ceiling on its lines outside docstrings, and is dropped once the module
is back under 300."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_LINES = 300
DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
MODULES = sorted(p for p in (ROOT / "scheduler").rglob("*.py") if p.name != "__init__.py")
# path under scheduler/ -> (ceiling on its lines outside docstrings, why it may pass MAX_LINES)
EXCEPTIONS: dict[str, tuple[int, str]] = {
    "client/queue.py": (
        MAX_LINES,
        "the public sync API: one thin method per operation, each"
        " documented (arguments, returns, errors); the code alone fits",
    ),
    "client/aio.py": (MAX_LINES, "the public asyncio API, client/queue.py's twin, same docstrings"),
    "client/partitioned.py": (
        MAX_LINES,
        "the public partitioned API: each method documented (the API reference leaves out"
        " one without a docstring); the code alone fits",
    ),
}


def _rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT / "scheduler").as_posix()


def _lines(path: pathlib.Path) -> int:
    return len(path.read_text().splitlines())


def _code_lines(path: pathlib.Path) -> int:
    """Lines outside the module's, classes' and functions' docstrings."""
    text = path.read_text()
    doc: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if not isinstance(node, DOCUMENTED) or not body:
            continue
        first = body[0]
        value = first.value if isinstance(first, ast.Expr) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            doc.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return len(text.splitlines()) - len(doc)


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_module_is_under_300_lines(path: pathlib.Path) -> None:
    if _rel(path) in EXCEPTIONS:
        assert _code_lines(path) <= EXCEPTIONS[_rel(path)][0]
    else:
        assert _lines(path) <= MAX_LINES


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
