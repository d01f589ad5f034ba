"""`scheduler queue move`: move the waiting jobs of one queue into another, plain or
partitioned on either side (scheduler/admin/queue_move.py; docs/cluster.md, "Outgrowing one
Redis")."""

from __future__ import annotations

import click
from rich.table import Table

from scheduler.admin.queue_move import MOVE_PER_CALL, MoveRefused, MoveReport, move_queue
from scheduler.cli.common import (
    EXIT_CODES_HELP,
    EXIT_FINDINGS,
    AdminGroup,
    Refused,
    _check_queue,
    cell,
    connect,
    console,
    emit_json,
    json_option,
    markup_safe,
    url_option,
)
from scheduler.cli.queue_config import priority_aging
from scheduler.core.safety import safe

_WHY = {
    "leased": "running: finishes here (keep a worker on the source until it drains)",
    "held": "set aside by flow control (a concurrency key, a rate, parents not done)",
    "flow": "a priority, flow keys, parents or children: enqueue it again on the destination",
    "schedule": "a schedule's run (--skip-schedules): redefine the schedule on the destination",
    "dead": "dead-lettered: requeue or purge it here",
    "unreadable": "its record cannot be read: `scheduler doctor`",
    "conflict": "the destination holds another job under its id (enqueue it there anew) or "
    "its idempotency key (below: keep one of the two)",
    "moving": "a move the other way is bringing it here: it stays (rerun that one if stopped)",
}


def register(main: click.Group) -> None:
    main.add_command(queue)
    queue.add_command(priority_aging)  # scheduler/cli/queue_config.py


@click.group(cls=AdminGroup, epilog=EXIT_CODES_HELP)
def queue() -> None:
    """Whole-queue operations."""


@queue.command(epilog=EXIT_CODES_HELP)
@url_option
@click.option("--from", "source", required=True, callback=_check_queue, help="Source queue.")
@click.option(
    "--to",
    "dest",
    required=True,
    callback=_check_queue,
    help="Destination queue (a partitioned one is created first: PartitionedQueue.create).",
)
@click.option(
    "--dry-run", is_flag=True, help="Print what would move and what stays; write nothing."
)
@click.option(
    "--batch",
    type=click.IntRange(1, MOVE_PER_CALL),
    default=500,
    show_default=True,
    help="Jobs per step (each step is three short scripts).",
)
@click.option(
    "--skip-schedules",
    is_flag=True,
    help="Move even when the source has schedules: their pending runs stay there.",
)
@json_option
def move(
    url: str, source: str, dest: str, dry_run: bool, batch: int, skip_schedules: bool, as_json: bool
) -> None:
    """Move the waiting jobs of --from into --to, with the same ids, run times, payloads and
    attempts. Running, dead and flow-controlled jobs stay and are counted by reason. Each job
    moves once: an interrupted move is finished by running the command again. Exits 1 after
    the report when a job's idempotency key names another job in --to (both ids listed)."""
    client = connect(url)
    try:
        report = move_queue(
            client, source, dest, batch=batch, dry_run=dry_run, skip_schedules=skip_schedules
        )
    except MoveRefused as exc:
        raise Refused(safe(exc)) from None
    except KeyboardInterrupt:  # its lock is released (run()); "Aborted!" said nothing more
        raise Refused(
            "interrupted: run the same command again to finish (jobs taken wait in the source's "
            "`moving` set, in no queue's due, until then)"
        ) from None
    if as_json:
        emit_json(report.as_dict())
    else:
        _print(report)
    if report.conflicts.count:  # two jobs of one key: a person decides which one runs
        raise click.exceptions.Exit(EXIT_FINDINGS)


def _print(report: MoveReport) -> None:
    verb = "would move" if report.dry_run else "moved"
    table = Table(title=f"{report.source} -> {report.dest}")
    for col in ("jobs", "count", "why"):
        table.add_column(col)
    table.add_row(verb, str(report.moved), cell("waiting jobs, same ids and run times"))
    if report.keys:
        table.add_row("keys", str(report.keys), cell("idempotency keys naming them, copied"))
    if report.resumed:
        table.add_row("resumed", str(report.resumed), cell("an interrupted move's, sent again"))
    if report.already:  # resumed ones its put had written before the stop: done now
        table.add_row("already", str(report.already), cell("the destination had them already"))
    for reason, n in report.stays.items():
        if n:
            table.add_row(f"stays: {reason}", str(n), cell(_WHY[reason]))
    console().print(table)
    found, dest = report.conflicts, markup_safe(report.dest)
    if found.count:  # ids are stored text: escaped for the markup line
        console().print(f"{found.count} job(s) whose idempotency key names another job in {dest}:")
        for jid, other, where in found.listed:
            both = "stays in the source" if where == "source" else "moved: both wait there"
            console().print(f"  {markup_safe(jid)} ({both}); the key names {markup_safe(other)}")
        if found.count > len(found.listed):
            console().print(f"  ... and {found.count - len(found.listed)} more, not listed")
