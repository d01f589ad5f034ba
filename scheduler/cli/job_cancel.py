"""`scheduler jobs cancel`: withdraw jobs by id, or every waiting job of a state (and task) at
once, e.g. after a bad deploy enqueued thousands of wrong ones (lua/cancel.lua, one script
call per job, pipelined; --state: a page at a time as it is read, job_select.py). The outcome
does not depend on the order the jobs are met in: each is cancelled before any job it waits
for (`children_first`, `batches`), so a parent's cancel never parks a job the command cancels;
a waiting job it leaves out is parked, as Queue.cancel does."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click
import redis
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from scheduler.cli.common import (
    EXIT_FAILED,
    EXIT_UNREACHABLE,
    AdminCommand,
    BadInput,
    Unreachable,
    connect,
    console,
    emit_json,
    json_option,
    queue_option,
    require_queue,
    url_option,
)
from scheduler.cli.confirm import confirm
from scheduler.cli.job_select import Selection, batches, children_first, count, select
from scheduler.cli.job_where import by_holding, silent_partition
from scheduler.client.partitioned import PartitionedQueue, not_answering, open_queue, unread
from scheduler.client.partitioned_partial import never_sent
from scheduler.client.queue import Queue
from scheduler.core import codec
from scheduler.core.errors import BadArgument, edited_by_hand
from scheduler.core.keys import check_job_id
from scheduler.core.safety import safe
from scheduler.core.scripts import run_sync
from scheduler.operations.requests import Op, Script, ScriptPipeline

_BATCH = 200  # cancels per pipeline (one progress step each)
_NAMED = 10  # refused jobs named in the text output (--json: all)
WAITING = ("due", "scheduled", "held")
# What cancel.lua answers: the state before. These were cancelled by this call; an id already
# cancelled (a re-run of the command) counts as cancelled too.
_CANCELLED = frozenset({*WAITING, "leased", "cancelled"})


def check_ids(_: click.Context, __: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    """A click callback: each job id checked (`dead ... --id` takes any id: check_dead_ids)."""
    try:
        return tuple(check_job_id(v) for v in value)
    except BadArgument as exc:
        raise click.BadParameter(str(exc)) from None


def _cancel_op(q: Queue, ids: Sequence[str]) -> Op[list[str]]:
    ttl = str(q.ops.settings.result_ttl_ms)
    replies = yield ScriptPipeline([Script("cancel", [i, ttl]) for i in ids])
    return [codec.s(r) for r in replies]


def _cancel_each(
    q: Queue, ids: Sequence[str], was_in: dict[str, str], refused: dict[str, str]
) -> None:
    """Cancel `ids`, a script call each in one pipeline: each one's state before into `was_in`,
    or why its call was refused into `refused` when a key of it was edited by hand into another
    type (its record a string: cancel.lua raises before writing); the others go on (a
    ScriptPipeline raises the first error alone). Any other error raises, once the answers of
    the calls that ran are in."""
    ttl = str(q.ops.settings.result_ttl_ms)
    calls = [(q._script_keys, Script("cancel", [i, ttl])) for i in ids]
    stop: BaseException | None = None
    for job_id, reply in zip(ids, run_sync(q.client, q._scripts.drive(calls)), strict=True):
        if not isinstance(reply, BaseException):
            was_in[job_id] = codec.s(reply)
        elif isinstance(reply, redis.ResponseError) and edited_by_hand(reply):
            refused[job_id] = safe(reply)
        else:
            stop = stop or reply
    if stop is not None:
        raise stop


@contextmanager
def unanswered_change_nothing(q: Queue | PartitionedQueue, queue: str, what: str) -> Iterator[None]:
    """Around a command's reading of every partition of `q` before it changes any (cancel
    --state, dead requeue / purge): an error of a partition's node not answering (or refusing
    for now) becomes Unreachable (exit 3) saying nothing was `what` and naming each partition
    that does not answer now (one cheap call a node). Any other error (a plain queue's, a login
    refused, every partition answering now) is left as it is."""
    try:
        yield
    except Exception as exc:
        if not isinstance(q, PartitionedQueue) or isinstance(exc, redis.AuthenticationError):
            raise
        if not not_answering(exc):
            raise
        try:
            names = unread(q.parts, q.run_answering(lambda p: p.ops.counts()))
        except Exception:  # none answers now (or another error): the first error says it
            names = []
        if not names:
            raise
        why = "every partition is read before any change, and these do not answer"
        again = "run it again once they do"
        listed = "; ".join(names)
        raise Unreachable(safe(f"nothing {what} in {queue!r}: {why} ({again}): {listed}")) from None


@click.command("cancel", cls=AdminCommand)
@url_option
@queue_option
@json_option
@click.argument("job_ids", metavar="[ID]...", nargs=-1, callback=check_ids)
@click.option("--state", type=click.Choice(WAITING), help="Cancel every job in this state.")
@click.option("--task", help="With --state: only the jobs of this task.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (with --state).")
def cancel_jobs(
    url: str, queue: str, as_json: bool, job_ids: tuple[str, ...], state: str | None,
    task: str | None, yes: bool,
) -> None:  # fmt: skip
    """Cancel jobs that have not finished: the IDs given, or with --state every job waiting
    in that state (due now, scheduled later, held by flow control), of --task only if given
    (asks first unless --yes; a schedule's pending runs are left: pause the schedule). A
    running job's worker learns it at its next heartbeat. Prints each id's state before
    (--state: counts); exit 1 when an id was missing or already done or dead, or one was
    refused for a key of it edited by hand into another type (named; the others go on).

    --state reads the jobs a page at a time and cancels each page as it is read (held: a
    job others wait for at the end), so its memory does not grow with the queue; asking
    first, it counts them, then cancels those up to the last one counted. Stopped by an
    error midway, it prints what it did to the jobs read up to then (the later ones unread).

    Whatever the order of the IDs or of the jobs in their state: each job this command
    cancels is cancelled before any job it waits for (after=), so none of them is parked by
    its parent's cancel; a waiting job it leaves out (another state or task, an id not given)
    is parked as dead, 'parent cancelled: <id>', when a job it waits for is cancelled.

    --state of a partitioned queue with a partition's node down as it starts (each is asked
    first): nothing is cancelled, and the partitions that do not answer are named (exit 3).
    IDs: those of the other partitions are cancelled and printed, each of that partition
    named (exit 3): 'unknown whether cancelled' for the one whose cancel was sent when it
    stopped answering (it may have run)."""
    if bool(job_ids) == bool(state):
        raise BadInput("give job ids, or --state (not both)")
    if task is not None and not state:
        raise BadInput("--task goes with --state")
    client = connect(url)
    require_queue(client, queue)
    q = open_queue(client, queue)
    if job_ids:
        groups, left_out = by_holding(q, job_ids)  # each where it is (job_where.py)
        was_in: dict[str, str] = {}
        # The ids of a partition whose node does not answer (or maybe there: none that
        # answered has them), named.
        silent: list[str] = [safe(w) for w in left_out.values()]
        unknown: list[str] = []  # one whose cancel was sent when it stopped: it may have run
        refused: dict[str, str] = {}  # id -> why (a key of it edited by hand): the others go on
        stop: Exception | None = None  # another error: what was done is printed, then it
        for part, ids in groups:
            sent = None
            try:
                for sent in children_first(part, ids):
                    try:
                        was_in[sent] = part._run(_cancel_op(part, [sent]))[0]
                    except redis.ResponseError as exc:  # its key edited by hand: the next go on
                        if not edited_by_hand(exc):
                            raise
                        refused[sent] = safe(exc)
                sent = None
            except Exception as exc:  # its node down: the other partitions' ids go on
                named = {i: silent_partition(part, queue, i, exc) for i in ids
                         if i not in was_in and i not in refused}  # fmt: skip
                if None in named.values():
                    stop = exc
                    break
                if sent in named and not never_sent(exc, part.client):
                    unknown.append(str(named.pop(sent)))
                silent += [n for n in named.values() if n is not None]
        given = list(dict.fromkeys(job_ids))
        before = {i: was_in[i] for i in given if i in was_in}
        left = [i for i in given if stop and i not in was_in and i not in refused]
        if as_json:
            extra: dict[str, Any] = {"unreachable": silent, "unknown": unknown,
                                     "refused": refused, "unconfirmed": left}  # fmt: skip
            emit_json({"queue": queue, "jobs": before, **{k: v for k, v in extra.items() if v}})
        else:
            for job_id in given:
                if job_id in refused:
                    click.echo(f"{job_id}: not cancelled (refused: {refused[job_id]})")
                elif job_id in before:
                    word = "cancelled" if before[job_id] in _CANCELLED else "not cancelled"
                    click.echo(f"{job_id}: {word} (was {before[job_id]})")
        for words in unknown:
            click.echo(f"unknown whether cancelled: {words} (see jobs show)", err=True)
        for words in silent:
            click.echo(f"not cancelled: {words}", err=True)
        if left:  # the first may have been cancelled as the error came
            click.echo(f"stopped by the error below before: {', '.join(left)}", err=True)
        if stop is not None:
            raise stop
        if silent or unknown:
            raise SystemExit(EXIT_UNREACHABLE)
        if refused or any(was not in _CANCELLED for was in before.values()):
            raise SystemExit(EXIT_FAILED)
        return
    assert state is not None
    parts = q.parts if isinstance(q, PartitionedQueue) else [q]
    with unanswered_change_nothing(q, queue, "cancelled"):  # a node down: named, exit 3
        chosen = [select(p, state, task) for p in parts]  # each partition's clock: all answer
        asked = None if yes else sum(count(s) for s in chosen)
    what = f"{state} job(s)" + (f" of task {task!r}" if task else "")
    if asked:
        confirm(f"Cancel {asked} {what} of queue {queue!r}?", action="cancel them")
    matched, counts, refused, stop = _cancel_all(queue, chosen, asked)
    done = sum(n for was, n in counts.items() if was in _CANCELLED)
    # Not answered: after the error that stopped it (the last batch sent may have run).
    unanswered = matched - sum(counts.values()) - len(refused)
    moved = matched - done - len(refused) - unanswered  # claimed, finished, gone meanwhile
    if as_json:
        extra = {"refused": refused} if refused else {}
        extra |= {"asked": asked} if asked is not None else {}  # counted when it asked
        if stop is not None:
            extra |= {"stopped": safe(stop), "unconfirmed": unanswered}
        emit_json({"queue": queue, "state": state, "task": task, "matched": matched,
                   "cancelled": done, "before": counts, **extra})  # fmt: skip
    elif not matched and stop is None:
        click.echo(f"no {what} in {queue!r}: nothing to cancel")
    else:
        notes = [f"{asked} when asked"] if asked not in (None, matched) else []
        notes += [f"{moved} had moved on: {counts}"] if moved else []
        notes += [f"{len(refused)} refused, a key of each edited by hand"] if refused else []
        if stop is not None:  # the jobs after the last page read are not counted
            notes.append(f"{unanswered} unconfirmed, later ones unread: stopped by the error below")
        why = f" ({'; '.join(notes)})" if notes else ""
        click.echo(f"cancelled: {done} of {matched} {what} in {queue!r}{why}")
        for job_id, words in list(refused.items())[:_NAMED]:
            click.echo(f"not cancelled: {job_id}: {words}", err=True)
        if len(refused) > _NAMED:
            click.echo(f"... and {len(refused) - _NAMED} more refused (--json names all)", err=True)
    if stop is not None:
        raise stop
    if refused:
        raise SystemExit(EXIT_FAILED)


def _cancel_all(
    queue: str, chosen: list[Selection], total: int | None
) -> tuple[int, dict[str, int], dict[str, str], Exception | None]:
    """Each selection cancelled a page at a time as it is read (job_select.batches): how many
    were read, each one's state before its cancel counted, why each refused one was
    (_cancel_each), the error that stopped it midway (None: every job's cancel answered)."""
    matched = 0
    counts: dict[str, int] = {}
    refused: dict[str, str] = {}
    progress = Progress(
        TextColumn("cancelling [progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console(stderr=True),
        transient=True,
    )
    with progress:
        step = progress.add_task(queue, total=total)
        try:
            for sel in chosen:
                for page in batches(sel):
                    matched += len(page)
                    for at in range(0, len(page), _BATCH):
                        chunk, was_in = page[at : at + _BATCH], dict[str, str]()
                        try:
                            _cancel_each(sel.q, chunk, was_in, refused)
                        finally:  # a node down, ...: what was done is said first
                            for was in was_in.values():
                                counts[was] = counts.get(was, 0) + 1
                        progress.advance(step, len(chunk))
        except Exception as exc:
            return matched, counts, refused, exc
    return matched, counts, refused, None
