"""`scheduler doctor [--fix]`: the invariant checker's command line (scheduler/admin/doctor.py)."""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any

import click
from rich.console import Console
from rich.text import Text

from scheduler.admin import doctor as checks
from scheduler.admin.doctor_checks import unreadable_layout
from scheduler.admin.health import NODE_BACK, NODE_UNREACHABLE
from scheduler.admin.redis_cli import connection_flags, fix_line, with_url
from scheduler.cli.common import (
    DEFAULT_URL,
    EXIT_FINDINGS,
    EXIT_UNREACHABLE,
    AdminCommand,
    Duration,
    cell,
    connect,
    console,
    emit_json,
    json_option,
    physical_queues,
    queues_option,
    resolve_queues,
    url_option,
)
from scheduler.core.connection import UNREACHABLE, is_cluster
from scheduler.core.safety import redact


def register(main: click.Group) -> None:
    main.add_command(doctor)


class _Shown:
    """How a finding's commands are shown: each `redis-cli` given the flags that reach the
    checked server (a node's own for a cluster node's finding), each `scheduler ...` its
    `--url` unless the pasted line reads the same server without it (REDIS_URL, the default);
    a URL holding a password is shown redacted: pasted, it is refused, never run elsewhere."""

    def __init__(self, url: str, client: Any) -> None:
        self.flags = connection_flags(url, client)
        # The server a pasted line without --url reaches: REDIS_URL's, else the default.
        same = url == (os.environ.get("REDIS_URL") or DEFAULT_URL)
        self.url_arg = None if same else shlex.quote(redact(url))

    def line(self, text: str, node: str | None) -> str:
        return with_url(fix_line(text, self.flags, node), self.url_arg)

    def json(self, i: checks.Issue) -> dict[str, Any]:
        return {**i.to_json(), "fix": self.line(i.fix, i.node),
                "redis_cli": [self.line(c, i.node) for c in i.redis_cli()]}  # fmt: skip


def _print(out: Console, title: str, issues: list[checks.Issue], shown: _Shown) -> None:
    """One block per finding; commands on their own unwrapped lines, ready to paste (_Shown).
    Ids and messages quote stored data: escaped, never read as markup."""
    out.print(f"[bold]{title}[/]")
    for i in issues:
        style = "red" if i.severity == "error" else "yellow"
        job = f" job {i.job_id}" if i.job_id else ""
        # A Text, not markup: an escaped id ending in '\' was shown with one '\' more.
        line = Text.assemble((i.severity, style), f" {i.queue or 'server'} ", (i.code, "bold"))
        out.print(line + cell(f"{job}: {i.message}"))
        out.print(cell(f"  fix: {shown.line(i.fix, i.node)}"), soft_wrap=True)
        if i.next_run is not None:  # it parked a schedule's pending run: the next one is due
            out.print(cell(f"  the schedule's next run is armed: {i.next_run}"), soft_wrap=True)
        if i.repair:
            # One line per command, each cleaned whole: a stored id holding '\n' must not
            # end the '# runs ...' comment and put a line of its own into a pasted shell.
            steps = (cell(f"    {shown.line(c, i.node)}") for c in i.redis_cli())
            out.print("  what --fix runs:", *steps, sep="\n", soft_wrap=True)


@click.command(cls=AdminCommand)
@url_option
@queues_option
@json_option
@click.option(
    "--fix", is_flag=True, help="Repair what is safe (never deletes a job that has a hash)."
)
@click.option(
    "--stale-lease",
    "stale_lease_ms",
    type=Duration(),
    default=f"{checks.DEFAULT_STALE_LEASE_MS // 60_000}m",
    show_default=True,
    help="Report leases that lapsed longer ago than this.",
)
@click.option("--no-server", is_flag=True, help="Skip the server-settings checks.")
@click.option("--strict", is_flag=True, help="Warnings count as findings for the exit code.")
def doctor(
    url: str,
    queues: tuple[str, ...],
    as_json: bool,
    fix: bool,
    stale_lease_ms: int,
    no_server: bool,
    strict: bool,
) -> None:
    """Check stored state against the invariants (each job in exactly one of due, leased, dead,
    or done with an expiry; no job hash without a place; no id without a hash; state matching
    membership; no lease lapsed long ago; payloads decodable) and the server settings that break
    the scheduler's promises. Each finding comes with the command that fixes it; --fix repairs
    what is safe. Exits 1 when errors (with --strict: any finding) remain."""
    # surrogateescape: undecodable bytes become findings, and --fix writes keys back exactly.
    client = connect(url, encoding_errors="surrogateescape")
    # A partitioned queue is checked partition by partition (each an ordinary queue); one
    # whose partition record cannot be read is a finding, and its own keys are checked.
    damaged: dict[str, str] = {}
    down: list[str] = []  # cluster nodes the discovery could not scan: "host:port: error"
    names = physical_queues(client, resolve_queues(client, queues, down), damaged)
    fixed: list[checks.Issue] = []
    remaining: list[checks.Issue] = [] if no_server else checks.check_server_settings(client)
    if no_server:  # else the server check names every node that does not answer
        remaining += [_node_down(*u.split(": ", 1)) for u in down]
    remaining += [unreadable_layout(queue, why) for queue, why in damaged.items()]
    for name in names:
        try:
            if fix:
                report = checks.repair_queue(client, name, stale_lease_ms=stale_lease_ms)
                fixed += report.fixed
                remaining += report.remaining
            else:
                remaining += checks.check_queue(client, name, stale_lease_ms=stale_lease_ms)
        except UNREACHABLE as exc:
            if not is_cluster(client):
                raise  # the one server: exit 3 (AdminCommand)
            remaining.append(_queue_down(name, exc))
    failing = [i for i in remaining if strict or i.severity == "error"]
    shown = _Shown(url, client)
    if as_json:
        emit_json(
            {
                "queues": names,
                "fixed": [shown.json(i) for i in fixed],
                "findings": [shown.json(i) for i in remaining],
                "ok": not failing,
            }
        )
    else:
        out = console()
        if fixed:
            _print(out, "repaired", fixed, shown)
        if remaining:
            _print(out, "findings", remaining, shown)
        # Orphans (in no place: no worker saw them) re-armed into due, apart from the rest.
        rearmed = sum(i.rearms for i in fixed)
        to_rearm = sum(i.rearms for i in remaining)
        armed = sum(i.next_run is not None for i in fixed)
        out.print(
            f"checked {len(names)} queue(s)"
            + ("" if no_server else " and the server")
            + f": {len(fixed)} repaired"
            + (f" ({rearmed} re-armed: back in due)" if rearmed else "")
            + (f" ({armed} schedule run(s) parked: next run armed)" if armed else "")
            + f", {len(remaining)} finding(s) remain"
            + (f" ({to_rearm} to re-arm: --fix puts them back in due)" if to_rearm else "")
        )
    if any(i.code in (NODE_DOWN, QUEUE_DOWN) for i in remaining):
        sys.exit(EXIT_UNREACHABLE)  # a cluster node did not answer: the check is not whole
    if failing:
        sys.exit(EXIT_FINDINGS)


NODE_DOWN, QUEUE_DOWN = NODE_UNREACHABLE, "queue-unreachable"


def _node_down(node: str, error: str) -> checks.Issue:
    return checks.Issue(NODE_DOWN, "error", f"node {node}: does not answer ({error}): its queues "
                        "were not checked", NODE_BACK, node=node)  # fmt: skip


def _queue_down(name: str, exc: Exception) -> checks.Issue:
    return checks.Issue(QUEUE_DOWN, "error", f"its node does not answer ({exc}): not checked",
                        NODE_BACK, queue=name)  # fmt: skip
