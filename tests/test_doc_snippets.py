"""Every code sample of README.md, docs/*.md and docs/guide/*.md checked against the code, as an
app developer copies it: each ```python / ```py block compiles, its `scheduler` imports (and the
attributes it reads off them) name real things, and it runs against a private redis-server (with
REDIS_URL set to it, `redis://localhost:6379/0` in the text replaced by it, and the file's preamble
below). A block that cannot run says so just before it, `<!-- snippet: not run (reason) -->`, and
is skipped with that reason (so every skip is counted); `<!-- snippet: continues (reason) -->`
runs it in the namespace the block above left. Shell samples (```bash / ```sh / ```console /
```shell, and `scheduler ...` lines of unlabelled blocks) name real subcommands and options:
each command line is parsed by click's own command tree (scheduler.cli.main), never run.
docs/performance.md is left out: its blocks are measurement notes (none is python or shell)."""

from __future__ import annotations

import ast
import importlib
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest

from scheduler.cli.main import main
from tests.redis_server import RedisProcess

ROOT = Path(__file__).resolve().parent.parent
NOTES_ONLY = ROOT / "docs" / "performance.md"
DOCS = [
    ROOT / "README.md",
    *(p for p in sorted((ROOT / "docs").glob("*.md")) if p != NOTES_ONLY),
    *sorted((ROOT / "docs" / "guide").glob("*.md")),
]
PYTHON = {"python", "py"}
SHELL = {"bash", "sh", "console", "shell"}
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
MARKER = re.compile(r"^\s*<!-- snippet: (not run|continues) \((.+)\) -->\s*$")
ANY_MARKER = re.compile(r"<!-- snippet:")
URL_IN_TEXT = "redis://localhost:6379/0"

# What a file's samples take as already there, as its prose says (a `q` of the queue in hand...).
_QUEUE = """
import os
from scheduler import AsyncQueue, Queue, Registry, JobContext
from scheduler.core.connection import connect
client = connect(os.environ["REDIS_URL"])
q = Queue(client, "docs")
registry = Registry()
"""
PREAMBLE: dict[str, str] = {
    "README.md": _QUEUE,
    "docs/flow-control.md": _QUEUE,
    "docs/durability.md": _QUEUE
    + 'url = os.environ["REDIS_URL"]\nmy_id = "job-1"\nfrom scheduler import NotDurable\n',
    "docs/guide/schedules.md": _QUEUE
    + 'q.schedule("nightly-report", "report.build", {"tenant": 7}, cron="0 9 * * *")\n',
}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: tuple[str, str] | None  # (verb, reason) of the comment just before it

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _blocks(path: Path) -> Iterator[Block]:
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        indent, lang = opened.groups()
        end = i + 1
        while not re.match(r"^\s*```\s*$", lines[end]):
            end += 1
        body = [
            line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end]
        ]
        prev = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        found = MARKER.match(prev)
        marker = (found.group(1), found.group(2)) if found else None
        yield Block(path, i + 1, lang.lower(), "\n".join(body) + "\n", marker)
        i = end + 1


ALL = [b for p in DOCS for b in _blocks(p)]
PY = [b for b in ALL if b.lang in PYTHON]
SH = [b for b in ALL if b.lang in SHELL or b.lang == ""]


def test_blocks_found() -> None:
    """The parser sees the samples (an empty list would make every test below pass vacuously)."""
    assert len(PY) >= 20 and len([b for b in ALL if b.lang in SHELL]) >= 8
    assert all(b.lang not in PYTHON | SHELL for b in _blocks(NOTES_ONLY))


def test_markers_are_well_formed() -> None:
    """Each `<!-- snippet: ... -->` comment is one of the two forms and sits right before a python
    block (a typo'd marker would otherwise leave its block unmarked or mark nothing)."""
    marked = {(b.path, b.line) for b in PY if b.marker}
    for path in DOCS:
        lines = path.read_text().splitlines()
        for n, line in enumerate(lines, 1):
            if not ANY_MARKER.search(line):
                continue
            assert MARKER.match(line), f"{path.name}:{n}: malformed marker {line!r}"
            after = next(k for k in range(n, len(lines)) if lines[k].strip()) + 1
            assert (path, after) in marked, f"{path.name}:{n}: marker not before a python block"


# -- python ----------------------------------------------------------------------------------
def _resolve(module: str, name: str | None) -> object:
    mod = importlib.import_module(module)
    if name is None:
        return mod
    if hasattr(mod, name):
        return getattr(mod, name)
    return importlib.import_module(f"{module}.{name}")


def _imported(tree: ast.Module) -> dict[str, object]:
    """The names a block binds from `scheduler...` imports, each resolved (raising if not real)."""
    bound: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "scheduler":
            assert node.module is not None and node.level == 0
            for alias in node.names:
                assert alias.name != "*", "a star import names nothing to check"
                bound[alias.asname or alias.name] = _resolve(node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "scheduler":
                    _resolve(alias.name, None)
                    bound[alias.asname or "scheduler"] = _resolve(alias.name.split(".")[0], None)
    return bound


@pytest.mark.parametrize("block", PY, ids=[b.name for b in PY])
def test_python_block_compiles_and_imports_resolve(block: Block) -> None:
    tree = ast.parse(block.code, block.name)
    bound = _imported(tree)
    for node in ast.walk(tree):  # `JobContext.for_test`: the attribute of an imported name
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
        ):
            owner = bound[node.value.id]
            assert hasattr(owner, node.attr), f"{block.name}: {node.value.id}.{node.attr}"


def _chain(block: Block) -> list[Block]:
    """The block, after the blocks it continues (each run again: the test's order is free)."""
    same = [b for b in PY if b.path == block.path]
    chain = [block]
    while chain[0].marker and chain[0].marker[0] == "continues":
        i = same.index(chain[0])
        assert i > 0, f"{block.name}: continues no block before it"
        chain.insert(0, same[i - 1])
    assert not chain[0].marker, f"{block.name} continues a block that is not run"
    return chain


@pytest.mark.parametrize("block", PY, ids=[b.name for b in PY])
def test_python_block_runs(
    block: Block, module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    if block.marker and block.marker[0] == "not run":
        pytest.skip(f"{block.name} not run: {block.marker[1]}")
    monkeypatch.setenv("REDIS_URL", module_server.url)
    module_server.client().flushall()  # a private server: each sample starts on an empty one
    rel = str(block.path.relative_to(ROOT))
    ns: dict[str, Any] = {"__name__": "doc_snippet"}
    exec(compile(PREAMBLE.get(rel, ""), f"{rel} (preamble)", "exec"), ns)
    for step in _chain(block):
        code = step.code.replace(URL_IN_TEXT, module_server.url)
        try:
            exec(compile(code, step.name, "exec"), ns)
        except Exception as exc:
            raise AssertionError(
                f"{step.name} does not run ({type(exc).__name__}: {exc}); fix the sample, or mark"
                " it `<!-- snippet: not run (reason) -->` if it cannot run on its own"
            ) from exc
    for name, fn in list(ns.items()):  # a sample test (`def test_total()`): run it as pytest would
        if name.startswith("test_") and callable(fn) and f"def {name}(" in block.code:
            fn()


# -- shell -----------------------------------------------------------------------------------
def _command_lines(block: Block) -> Iterator[str]:
    """The `scheduler ...` command lines of a shell block (console: the `$ ` lines only)."""
    joined = block.code.replace("\\\n", " ")
    for raw in joined.splitlines():
        line = raw.strip()
        if block.lang == "console" or line.startswith("$ "):
            if not line.startswith("$ "):
                continue  # output
            line = line[2:]
        if line.startswith("scheduler ") or line == "scheduler":
            yield line


SH_LINES = [(b, line) for b in SH for line in _command_lines(b)]


def test_shell_lines_found() -> None:
    assert len(SH_LINES) >= 15


@pytest.mark.parametrize("block, line", SH_LINES, ids=[f"{b.name}:{ln[:40]}" for b, ln in SH_LINES])
def test_shell_command_parses(block: Block, line: str) -> None:
    """The subcommand path exists and click accepts the options and arguments as written."""
    args = shlex.split(line, comments=True)[1:]
    cmd: click.Command = main
    path = ["scheduler"]
    ctx = main.make_context("scheduler", [], resilient_parsing=True)
    while isinstance(cmd, click.Group) and args and not args[0].startswith("-"):
        sub = cmd.get_command(ctx, args[0])
        assert sub is not None, f"{block.name}: no command `{' '.join(path)} {args[0]}`"
        path.append(args.pop(0))
        cmd = sub
    try:
        cmd.make_context(" ".join(path), list(args), parent=ctx)
    except click.UsageError as exc:
        raise AssertionError(f"{block.name}: `{line}`: {exc.format_message()}") from exc


# -- commands named in the prose -------------------------------------------------------------
INLINE = re.compile(r"`(scheduler [^`]+)`")
OPTION = re.compile(r"^\[?(--?[A-Za-z][\w-]*)")
NOT_BUILT = {"scheduler demo --dashboard"}  # docs/dashboard.md says it is not built


def _inline_commands() -> Iterator[tuple[str, str]]:
    for path in DOCS:
        prose = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for found in INLINE.finditer(prose):
            line = " ".join(found.group(1).split())
            if line not in NOT_BUILT:
                yield path.name, line


INLINE_LINES = list(_inline_commands())


def test_inline_commands_name_real_subcommands_and_options() -> None:
    """`scheduler ...` in the prose is often a synopsis (`NAME`, `[--task T]`, `a|b`), so only
    the names are checked: each subcommand (every alternative of `a|b`) and each option exists."""
    assert len(INLINE_LINES) >= 50
    wrong = []
    for where, line in INLINE_LINES:
        tokens = line.replace("\\|", "|").split()[1:]
        cmd: click.Command = main
        ctx = main.make_context("scheduler", [], resilient_parsing=True)
        while isinstance(cmd, click.Group) and tokens and tokens[0][0].isalpha():
            names = tokens.pop(0).split("|")
            found = [cmd.get_command(ctx, n) for n in names]
            if None in found:
                wrong.append(f"{where}: `{line}`: no subcommand {names}")
            if len(names) > 1 or None in found:
                break
            assert found[0] is not None
            cmd = found[0]
        else:
            known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
            known |= {"--help", "-h"}
            for token in tokens:
                opt = OPTION.match(token)
                if opt and opt.group(1) not in known:
                    wrong.append(f"{where}: `{line}`: no option {opt.group(1)}")
    assert not wrong, "\n".join(wrong)


def test_readme_command_table_names_every_subcommand() -> None:
    """README's table of commands ("| command | what it answers |") names each subcommand of the
    admin groups, so a new one cannot be missing from the place a newcomer looks (`schedules run`
    was). `workers list` is `scheduler workers` itself."""
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| command | what it answers |") :].split("\n\n", 1)[0]
    cells = [row.split(" | ")[0].replace("\\|", "|") for row in table.splitlines()[2:]]
    named = set()
    for cell in cells:
        for found in re.finditer(r"`scheduler (\w+) ([\w|]+)", cell):
            named |= {(found.group(1), sub) for sub in found.group(2).split("|")}
    ctx = main.make_context("scheduler", [], resilient_parsing=True)
    missing = []
    for group in ("jobs", "dead", "schedules", "workers"):
        cmd = main.get_command(ctx, group)
        assert isinstance(cmd, click.Group)
        missing += [f"{group} {s}" for s in cmd.commands if (group, s) not in named]
    assert missing == ["workers list"]
