"""What a start-up imports, not how long it takes: `import scheduler` loads no submodule, a
producer's `from scheduler import Queue` (and Registry) loads neither the worker's runtime, the
asyncio client nor the dashboard (nor croniter, until a cron is parsed), `scheduler --help`
imports no command's module and a command's --help only its own module. Every
public name still resolves, to the object its own module defines, and the lazy tables agree
with what the type checker and the docs read (the `if TYPE_CHECKING:` imports)."""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

import scheduler
from scheduler.cli import main as cli_main

ROOT = Path(__file__).resolve().parent.parent
# Loaded only by the worker, the asyncio API, the dashboard or the CLI.
HEAVY = ("scheduler.worker.runtime", "scheduler.worker.claiming", "scheduler.worker.execution",
         "scheduler.worker.core", "scheduler.worker.metrics", "scheduler.client.aio",
         "scheduler.dashboard", "scheduler.cli", "prometheus_client")  # fmt: skip


def _loaded_after(code: str) -> list[str]:
    """The modules in sys.modules after `code` runs in a new interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=True)  # fmt: skip
    return list(json.loads(done.stdout.splitlines()[-1]))


def test_import_scheduler_loads_no_submodule_and_no_redis() -> None:
    loaded = _loaded_after("import scheduler")
    assert [m for m in loaded if m.startswith(("scheduler.", "redis"))] == []


@pytest.mark.parametrize("names", ["Queue", "Queue, Registry, Job, JobNotFound, RetryLater"])
def test_a_producer_does_not_load_the_worker_runtime_or_the_asyncio_client(names: str) -> None:
    loaded = set(_loaded_after(f"from scheduler import {names}"))
    assert "scheduler.client.queue" in loaded
    assert sorted(loaded & set(HEAVY)) == []


def test_the_worker_package_loads_its_runtime_on_first_use_of_worker() -> None:
    loaded = set(_loaded_after("from scheduler.worker import WorkerSettings, registry"))
    assert "scheduler.worker.runtime" not in loaded
    loaded = set(_loaded_after("from scheduler.worker import Worker"))
    assert "scheduler.worker.runtime" in loaded


def test_the_asyncio_names_still_import_in_a_fresh_process() -> None:
    loaded = set(_loaded_after(
        "from scheduler import AsyncQueue, Registry, open_queue_async\n"
        "import scheduler.worker\n"
        "assert scheduler.worker.Worker.__name__ == 'Worker'"
    ))  # fmt: skip
    assert {"scheduler.client.aio", "scheduler.worker.runtime"} <= loaded


def test_every_public_name_resolves_to_its_own_modules_object() -> None:
    homes = scheduler._HOMES
    assert sorted(homes) == sorted(scheduler.__all__)
    for name in scheduler.__all__:
        assert getattr(scheduler, name) is getattr(importlib.import_module(homes[name]), name)
    assert set(scheduler.__all__) <= set(dir(scheduler))
    assert "importlib" not in dir(scheduler) and "_HOMES" not in dir(scheduler)


def test_the_type_checkers_imports_name_the_same_homes() -> None:
    """The `if TYPE_CHECKING:` block (what mypy and the docs build read) and the lazy table."""
    tree = ast.parse((ROOT / "scheduler/__init__.py").read_text())
    guarded = next(n for n in tree.body if isinstance(n, ast.If)
                   and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING")  # fmt: skip
    seen = {a.name: imp.module for imp in guarded.body if isinstance(imp, ast.ImportFrom)
            for a in imp.names}  # fmt: skip
    assert seen == scheduler._HOMES


def test_an_unknown_name_is_an_attribute_error() -> None:
    assert not hasattr(scheduler, "NoSuchThing")
    with pytest.raises(ImportError):
        exec("from scheduler import NoSuchThing", {})
    assert scheduler.core.errors.JobNotFound is scheduler.JobNotFound  # the old side effect


def test_the_help_imports_no_command_module() -> None:
    loaded = _loaded_after(
        "from scheduler.cli.main import main\n"
        "try:\n    main(['--help'], prog_name='scheduler')\nexcept SystemExit:\n    pass"
    )
    assert [m for m in loaded if m.startswith("scheduler.cli.") and m != "scheduler.cli.main"] == []
    assert "redis" not in loaded and "rich" not in loaded


@pytest.mark.parametrize("columns", ["40", "80", "200"])
def test_the_help_without_the_commands_is_the_help_with_them(columns: str) -> None:
    def help_text(setup: str) -> str:
        code = f"from scheduler.cli.main import main\n{setup}\nmain(['--help'], prog_name='x')"
        env = {**os.environ, "COLUMNS": columns}
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=60).stdout  # fmt: skip

    lazy, whole = help_text(""), help_text("main.register_all()")
    assert "  worker " in lazy and "Exit codes" in lazy
    assert lazy == whole


def test_the_summaries_are_the_commands_own_first_sentences() -> None:
    group = click.Group("probe")
    for module in cli_main.MODULES:
        importlib.import_module(f"scheduler.cli.{module}").register(group)
    shown = {n: c for n, c in group.commands.items() if not c.hidden}
    assert sorted(cli_main.SUMMARIES) == sorted(shown)
    for name, command in shown.items():
        summary = click.Command(name, help=cli_main.SUMMARIES[name])
        assert summary.get_short_help_str(10_000) == command.get_short_help_str(10_000), name


def test_the_exit_code_help_is_built_once() -> None:
    """The help's exit-code table is core/exits.py's one text, not a copy kept equal."""
    from scheduler.cli import common
    from scheduler.core import exits

    assert cli_main.main.epilog is exits.EXIT_CODES_HELP  # what `scheduler --help` ends with
    assert common.EXIT_CODES_HELP is exits.EXIT_CODES_HELP


def _loaded_by_cli(*args: str) -> set[str]:
    return set(_loaded_after(
        "from scheduler.cli.main import main\n"
        f"try:\n    main({list(args)!r}, prog_name='scheduler')\nexcept SystemExit:\n    pass"
    ))  # fmt: skip


# Each command's --help loads its own module (what its run needs too), not another command's:
# an operator's `scheduler stats` does not pay for the dead-letter, doctor or jobs commands,
# and `scheduler worker --help` (or a typo in its flags) not for the worker's runtime.
@pytest.mark.parametrize(("command", "not_loaded"), [
    ("stats", ("scheduler.cli.dead", "scheduler.cli.doctor", "scheduler.cli.jobs",
               "scheduler.cli.pausing", "scheduler.admin.doctor")),
    ("keys", ("scheduler.cli.dead", "scheduler.cli.doctor", "scheduler.cli.jobs")),
    ("dead", ("scheduler.cli.admin", "scheduler.cli.doctor", "scheduler.admin.doctor")),
    ("doctor", ("scheduler.cli.admin", "scheduler.cli.dead", "scheduler.cli.jobs")),
    ("pause", ("scheduler.cli.admin", "scheduler.cli.dead", "scheduler.cli.doctor")),
    ("worker", ("scheduler.worker.runtime", "scheduler.cli.worker_start",
                "scheduler.cli.worker_pool_start", "scheduler.cli.admin")),
])  # fmt: skip
def test_a_commands_help_loads_its_own_module_not_the_others(
    command: str, not_loaded: tuple[str, ...]
) -> None:
    loaded = _loaded_by_cli(command, "--help")
    assert f"scheduler.cli.{cli_main.LAZY[command]}" in loaded
    assert sorted(loaded & set(not_loaded)) == []


def test_a_producer_loads_croniter_at_the_first_cron_parsed() -> None:
    assert "croniter" not in _loaded_after("from scheduler import Queue")
    loaded = _loaded_after(
        "from scheduler.schedules.cron_slots import check_cron\ncheck_cron('0 9 * * *', 'UTC')"
    )
    assert "croniter" in loaded
