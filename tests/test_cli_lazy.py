"""The `scheduler` command imports a command's module only when that command runs: a worker
process does not import the admin commands, the doctor or the dashboard. The name -> module
table (`scheduler.cli.main.LAZY`) must name every command's own module, or the command would
be found only after every module is loaded (or, in a fresh process, not at all)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from scheduler.cli import main as cli_main


@pytest.mark.parametrize("module", cli_main.MODULES)
def test_every_command_is_found_through_the_table(module: str) -> None:
    group = click.Group("probe")
    importlib.import_module(f"scheduler.cli.{module}").register(group)
    assert group.commands, module
    for name in group.commands:
        assert cli_main.LAZY.get(name) == module, name
    # and the table names no command of this module that its register() does not add
    assert sorted(n for n, m in cli_main.LAZY.items() if m == module) == sorted(group.commands)


def _fresh(*args: str) -> list[str]:
    """The heavy modules loaded by `scheduler <args>` in a new interpreter."""
    code = (
        "import sys, json\n"
        "from scheduler.cli.main import main\n"
        f"main({list(args)!r}, standalone_mode=False)\n"
        "heavy = ('scheduler.cli.admin', 'scheduler.admin.doctor', 'scheduler.cli.dead',\n"
        "         'scheduler.dashboard', 'scheduler.cli.schedules', 'scheduler.cli.worker')\n"
        "print(json.dumps([m for m in heavy if m in sys.modules]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    return list(json.loads(done.stdout.splitlines()[-1]))


def test_a_worker_command_loads_only_the_worker_module() -> None:
    assert _fresh("worker", "--help") == ["scheduler.cli.worker"]


def test_an_admin_command_loads_its_own_module_and_not_the_dashboard() -> None:
    loaded = _fresh("doctor", "--help")
    assert "scheduler.admin.doctor" in loaded and "scheduler.dashboard" not in loaded
    assert "scheduler.cli.worker" not in loaded
    assert "scheduler.cli.admin" not in loaded and "scheduler.cli.dead" not in loaded


def test_the_command_list_and_its_exit_codes_are_whole() -> None:
    out = CliRunner().invoke(cli_main.main, ["--help"])
    assert out.exit_code == 0
    for name in ("worker", "demo", "doctor", "dead", "schedules", "dashboard", "queue", "keys"):
        assert f"  {name} " in out.output, name
    assert "Exit codes" in out.output


def test_an_unknown_command_is_refused_after_every_module_is_asked() -> None:
    out = CliRunner().invoke(cli_main.main, ["dashbord"])
    assert out.exit_code == 2 and "No such command 'dashbord'" in out.output
