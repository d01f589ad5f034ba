"""The `scheduler` command. Sub-commands live in their own modules and register here, each
module imported only when one of its commands runs (or the command list is shown): a worker
process does not import the admin commands, the doctor, rich's tables or the dashboard, about
half of the whole CLI's import time (docs/performance.md section 49)."""

from __future__ import annotations

import importlib

import click

# Command name -> the module under scheduler.cli whose register() adds it; any other name is
# looked for in `admin` (stats, workers, keys, jobs, enqueue, dead, doctor, pause, resume,
# queue). tests/test_cli_lazy.py checks this table against every module's own commands.
LAZY = {"worker": "worker", "demo": "worker", "schedules": "schedules", "dashboard": "dashboard"}
MODULES = ("worker", "admin", "schedules", "dashboard")  # the order of registration


class _Main(click.Group):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.registered: set[str] = set()

    def register(self, module: str) -> None:
        if module not in self.registered:
            self.registered.add(module)
            importlib.import_module(f"scheduler.cli.{module}").register(self)

    def register_all(self) -> None:
        for module in MODULES:
            self.register(module)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            self.register(LAZY.get(cmd_name, "admin"))
        if cmd_name not in self.commands:  # unknown: click's error lists every command
            self.register_all()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self.register_all()
        return super().list_commands(ctx)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self.register_all()  # admin's register() adds the exit codes to the epilog
        super().format_help(ctx, formatter)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="scheduler")
def main() -> None:
    """Redis-backed job scheduler: run workers, inspect and repair queues."""
