"""`scheduler dead list`'s page: its jobs read back, and its text: one block per dead job, and
one per entry whose record was deleted by hand (counted in the total, so shown too, with the
command that removes it); the partitions a listing could not read (dead list, schedules list,
stats -q); the check of `dead ... --id` and its selection; the outcome of `dead requeue | purge`."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

import click

from scheduler.cli.common import (
    DEFAULT_URL,
    EXIT_UNREACHABLE,
    Refused,
    cell,
    console,
    emit_json,
    fmt_attempts,
    fmt_ms,
    markup_safe,
)
from scheduler.client.job_listing import listing_ops
from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.partitioned_ids import dead_where
from scheduler.client.partitioned_merge import group_ids, jobs_in_order
from scheduler.client.queue import Queue
from scheduler.core.errors import BadArgument
from scheduler.core.models import Job
from scheduler.core.safety import clean, redact
from scheduler.operations.dead_letters import check_id_list


def check_dead_ids(
    _: click.Context, __: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    """A click callback for `dead ... --id`: any id the API takes (check_id_list), not only the
    job-id alphabet: the dead list may hold an id no API would make (doctor's fixes name it)."""
    try:
        return tuple(check_id_list(value))
    except BadArgument as exc:
        raise click.BadParameter(str(exc)) from None


id_option = click.option(
    "--id", "ids", multiple=True, callback=check_dead_ids, help="Only this job (repeatable)."
)


def page_jobs(
    q: Queue | PartitionedQueue, page: Sequence[tuple[int, str]], payload: bool
) -> list[Job]:
    """The page's jobs, in order, through the one reader of job records (hash and spec); a
    partitioned queue's each from the partition that listed it (an id written to a partition's
    own queue need not route there: shown as gone, or its node down failed the listing).
    Without `payload` (the text shows none) each spec record is read up to its payload."""
    if not isinstance(q, PartitionedQueue):
        return q._run(listing_ops(q, payload).get_jobs([i for _, i in page]))
    parts = group_ids(page).items()
    reads = [(q.parts[k], listing_ops(q.parts[k], payload).get_jobs(g)) for k, g in parts]
    return jobs_in_order(page, q._run_many(reads))


def unread_field(not_read: Sequence[str]) -> dict[str, list[str]]:
    """--json's `unreachable` ('partition <name>: <error>' each) when a partition was not read."""
    return {"unreachable": list(not_read)} if not_read else {}


def exit_unread(not_read: Sequence[str]) -> None:
    """A partitioned queue's partitions whose node did not answer (left out of what was
    printed): named on stderr, `not read: partition <name>: <error>`, and exit 3
    (EXIT_UNREACHABLE: what was shown is not all there, as `stats` and `workers` with a cluster
    node down). Nothing left out: nothing happens."""
    for u in not_read:
        click.echo(clean(f"not read: {u}"), err=True)
    if not_read:
        sys.exit(EXIT_UNREACHABLE)


def print_dead(
    queue: str,
    total: int | None,
    more: bool,
    rows: Sequence[dict[str, Any]],
    gone: Sequence[str],
    now_ms: int,
    url: str,
) -> None:
    # One block per job, not a table: six columns cannot fit 80 columns without folding words
    # by character; a block wraps by word at any width and greps well in a pipe.
    out = console()
    if total is not None:
        out.print(f"dead jobs in {markup_safe(repr(queue))}: {total} match")
    else:
        tail = ", more follow (--offset)" if more else ""
        shown = len(rows) + len(gone)
        out.print(f"dead jobs in {markup_safe(repr(queue))}: {shown} shown{tail}")
    for r in rows:
        age = fmt_ms(now_ms - r["dead_ms"]) if r["dead_ms"] is not None else "-"
        err = f"{r['last_error_type']}: {r['last_error']}" if r["last_error_type"] else "-"
        head = f"{r['id']}  {r['task']}  {fmt_attempts(r)}"
        out.print(cell(f"{head}  dead for {age}"), style="bold")
        out.print(cell(f"  reason: {r['dead_reason'] or '-'}"))
        out.print(cell(f"  last error: {err}"))
    for job_id in gone:
        out.print(cell(f"{job_id}  record gone"), style="bold")
        out.print(cell("  its hash and spec were deleted by hand (task, payload, error lost)"))
        out.print(cell(f"  {_purge_line(queue, job_id, url)} removes the entry"), soft_wrap=True)


def _purge_line(queue: str, job_id: str, url: str) -> str:
    """The command that drops one entry, ready to paste: each value one shell word, and the
    --url unless the line reaches the same server without it (REDIS_URL's, else the default),
    redacted as doctor's lines are (pasted with a password shown as ***, it is refused)."""
    line = f"scheduler dead purge --id {shlex.quote(job_id)} -q {shlex.quote(queue)}"
    same = url == (os.environ.get("REDIS_URL") or DEFAULT_URL)
    return line if same else f"{line} --url {shlex.quote(redact(url))}"


def select_at(
    q: Queue | PartitionedQueue,
    task: str | None,
    error_type: str | None,
    older_than_ms: int | None,
    ids: Sequence[str],
    *,
    refuse: bool = True,
) -> dict[str, int]:
    """The --id ids that are dead and match every filter, each -> its partition
    (partitioned_ids.dead_where); one that is not refuses (refuse=False: left out)."""
    where = dead_where(q, ids, task=task, error_type=error_type, older_than_ms=older_than_ms)
    missing = [i for i in ids if i not in where]
    if missing and refuse:
        raise Refused(f"not on the dead list of {q.name!r} (or filtered out): {', '.join(missing)}")
    return where


def print_bulk(verb: str, queue: str, matched: int, done: int, as_json: bool) -> None:
    """The outcome of `dead requeue | purge` (`verb`: requeued, purged). A job no longer dead
    (requeued, or its id taken again) or no longer matching is skipped, not an error; purge
    removes an entry whose job keys are gone, requeue skips it. One acted on that was not
    counted (a score written by hand) counts as matched."""
    matched = max(matched, done)
    result: dict[str, Any] = {"queue": queue, "action": verb, "matched": matched, "done": done}
    result["skipped"] = matched - done
    if as_json:
        emit_json(result)
    elif not matched:
        click.echo("no dead jobs match: nothing to do")
    else:
        why = f" ({result['skipped']} skipped: {_SKIPPED[verb]})" if result["skipped"] else ""
        click.echo(f"{verb}: {done} of {matched} dead job(s) in {queue!r}{why}")


# Why a selected id was not acted on (purge_dead.lua / requeue_dead.lua skip it).
_SKIPPED = {"requeued": "no longer dead, or no job left to run", "purged": "no longer dead"}
