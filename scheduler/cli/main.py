"""The `scheduler` command. Sub-commands live in their own modules and register here, each
module imported only when one of its commands runs (or the command list is shown): a worker
process does not import the admin commands, the doctor, rich's tables or the dashboard, about
half of the whole CLI's import time (docs/performance.md section 49). `scheduler --help` lists
the commands from SUMMARIES and imports none of them."""

from __future__ import annotations

import importlib

import click

from scheduler.core.exits import EXIT_CODES_HELP

# Command name -> the module under scheduler.cli whose register() adds it: running one command
# imports its own module only (`scheduler stats` not the dead-letter or doctor commands). A
# name not in it is looked for in every module (click's error then lists every command).
# tests/test_cli_lazy.py checks this table against every module's own commands.
LAZY = {
    "worker": "worker", "demo": "worker",
    "stats": "admin", "workers": "admin", "keys": "admin",
    "jobs": "jobs", "enqueue": "jobs",
    "dead": "dead",
    "doctor": "doctor",
    "pause": "pausing", "resume": "pausing",
    "queue": "pausing",  # cli/queue_move.py's group, which pausing's register() adds
    "schedules": "schedules",
    "dashboard": "dashboard",
}  # fmt: skip
MODULES = tuple(dict.fromkeys(LAZY.values()))  # the order of registration
# What `scheduler --help` shows of each command: the first sentence of its help, so the list
# costs no import of the commands (they take ~0.4 s: the worker's runtime, rich, the admin
# modules). tests/test_import_cost.py checks it against the commands' own help.
SUMMARIES = {
    "dashboard": "Serve the web dashboard: queues, jobs, dead letters, schedules, workers, health.",
    "dead": "Jobs parked for a human: list them, requeue them with a fresh attempt budget, or"
    " purge them for good; `retention` shows or sets the opt-in limits (off by default).",
    "demo": "Watch the scheduler at work in ~15 s: on-time, delayed, failing and crashing jobs.",
    "doctor": "Check stored state against the invariants (each job in exactly one of due,"
    " leased, dead, or done with an expiry; no job hash without a place; no id without a hash;"
    " state matching membership; no lease lapsed long ago; payloads decodable) and the server"
    " settings that break the scheduler's promises.",
    "enqueue": "Add a job; prints its id.",
    "jobs": "List jobs by state, show everything about one job, reschedule or cancel jobs.",
    "keys": "The key names of a queue, ready to paste into redis-cli, with their types and sizes"
    " (of each partition, for a partitioned queue).",
    "pause": "Pause a queue: no worker claims its jobs until `scheduler resume`.",
    "queue": "Whole-queue operations.",
    "resume": "Resume a paused queue: workers claim again at once.",
    "schedules": "Recurring schedules: list, add (or redefine), pause, resume, remove, run now.",
    "stats": "Per queue: due now, scheduled later, leased, dead (and moving: being moved by"
    " `queue move`), the oldest overdue job and how late it is, and done / fail / new dead"
    " counts in the current clock minute and the last 5 and 60 (each counting the current one).",
    "worker": "Run handlers from REGISTRY (module:attribute, a"
    " scheduler.worker.registry.Registry).",
    "workers": "Live worker processes (`scheduler workers` is `workers list`); `workers quiet`"
    " and `workers stop` ask one to stop.",
}


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
        if cmd_name not in self.commands and cmd_name in LAZY:
            self.register(LAZY[cmd_name])
        if cmd_name not in self.commands:  # unknown: click's error lists every command
            self.register_all()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self.register_all()
        return super().list_commands(ctx)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing, a command not loaded yet standing in as its summary."""
        names = sorted(set(SUMMARIES) | set(self.commands))
        commands = [self.commands.get(n) or click.Command(n, help=SUMMARIES[n]) for n in names]
        shown = [(n, c) for n, c in zip(names, commands, strict=True) if not c.hidden]
        if shown:
            limit = formatter.width - 6 - max(len(n) for n, _ in shown)
            with formatter.section("Commands"):
                formatter.write_dl([(n, c.get_short_help_str(limit)) for n, c in shown])


@click.group(
    cls=_Main, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES_HELP
)
@click.version_option(package_name="scheduler")
def main() -> None:
    """Redis-backed job scheduler: run workers, inspect and repair queues."""
