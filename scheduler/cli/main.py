"""The `scheduler` command. Sub-commands live in their own modules and register here."""

from __future__ import annotations

import click

from scheduler.cli import admin, dashboard, schedules, worker


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="scheduler")
def main() -> None:
    """Redis-backed job scheduler: run workers, inspect and repair queues."""


worker.register(main)
admin.register(main)
schedules.register(main)
dashboard.register(main)
