"""The package layout follows the layers in docs/architecture.md: a module imports only its own
layer or the ones below it, and no flat module is left beside the subpackages."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "scheduler"

# Layer of each subpackage (docs/architecture.md, "Layers"); the driver sits in core/ but is
# layer 3 because it runs the operations' requests.
LAYER_BY_PREFIX = {
    "scheduler._spawn": 0,
    "scheduler._spawn_cluster": 0,
    "scheduler._lazy": 0,  # the lazy `__getattr__`s of the package and its subpackages
    "scheduler.core.scripts": 3,
    "scheduler.core": 1,
    "scheduler.operations": 2,
    "scheduler.schedules": 2,
    "scheduler.client": 4,
    "scheduler.admin": 4,
    "scheduler.worker": 5,
    "scheduler.dashboard": 5,
    "scheduler.cli": 6,
    "scheduler.__main__": 6,  # `python -m scheduler`: the CLI
}


def layer_of(module: str) -> int | None:
    for prefix in sorted(LAYER_BY_PREFIX, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return LAYER_BY_PREFIX[prefix]
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("scheduler"):
            # `from scheduler.core import codec` imports the module scheduler.core.codec
            names += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names if a.name.startswith("scheduler")]
    return names


def test_every_module_belongs_to_a_layer_and_no_flat_module_is_left() -> None:
    modules = [module_name(p) for p in PACKAGE.rglob("*.py")]
    assert "scheduler.client.queue" in modules  # the walk found the package
    unplaced = [m for m in modules if m != "scheduler" and layer_of(m) is None]
    assert unplaced == []


def test_imports_point_only_to_the_same_or_a_lower_layer() -> None:
    upward: list[str] = []
    for path in PACKAGE.rglob("*.py"):
        me = module_name(path)
        mine = layer_of(me)
        if mine is None:  # scheduler/__init__.py re-exports the public API from any layer
            continue
        for target in imported_modules(ast.parse(path.read_text())):
            theirs = layer_of(target)
            if theirs is not None and theirs > mine:
                upward.append(f"{me} (layer {mine}) imports {target} (layer {theirs})")
    assert upward == []


def test_the_architecture_note_names_every_subpackage() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    subpackages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert "core" in subpackages
    missing = [s for s in subpackages if f"scheduler/{s}/" not in doc]
    assert missing == []


def test_the_console_script_points_at_the_cli_main() -> None:
    from scheduler.cli.main import main

    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'scheduler = "scheduler.cli.main:main"' in pyproject
    assert callable(main)


def test_no_two_classes_in_the_package_share_a_name() -> None:
    # e.g. the worker's Redis retry delay and the public job Backoff were both `Backoff`
    seen: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                seen.setdefault(node.name, []).append(module_name(path))
    assert "Backoff" in seen and "RetryDelay" in seen
    assert {name: mods for name, mods in seen.items() if len(mods) > 1} == {}


def test_the_task_and_schedule_name_rules_are_written_once() -> None:
    from scheduler.core import codec

    sources = "".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    assert sources.count(codec.TASK_RE.pattern) == 1
    # the schedule code checks names with codec's rules (it kept copies of both before)
    recurring = (PACKAGE / "schedules" / "recurring.py").read_text()
    assert "codec.SCHEDULE_NAME_RE" in recurring
    assert codec.SCHEDULE_NAME_RE.pattern not in recurring
