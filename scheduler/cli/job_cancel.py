"""`scheduler jobs cancel`: withdraw jobs by id, or every waiting job of a state (and task) at
once, e.g. after a bad deploy enqueued thousands of wrong ones (lua/cancel.lua, one script
call per job, pipelined). The outcome does not depend on the order the jobs are met in: each
is cancelled before any job it waits for (`children_first`), so a parent's cancel never parks
a job the command cancels; a waiting job it leaves out is parked, as Queue.cancel does."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import click
import redis
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from scheduler.admin.inspection import server_now_ms
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
from scheduler.cli.job_where import by_holding, silent_partition
from scheduler.client.partitioned import PartitionedQueue, not_answering, open_queue, unread
from scheduler.client.partitioned_partial import never_sent
from scheduler.client.queue import Queue
from scheduler.core import codec
from scheduler.core.errors import BadArgument
from scheduler.core.keys import OCCURRENCE_PREFIX, check_job_id
from scheduler.core.safety import safe
from scheduler.operations.requests import Op, Script, ScriptPipeline

_BATCH = 200  # cancels per pipeline (one progress step each)
_PAGE = 1_000  # ids read per ZRANGE while selecting
WAITING = ("due", "scheduled", "held")
# What cancel.lua answers: the state before. These were cancelled by this call; an id already
# cancelled (a re-run of the command) counts as cancelled too.
_CANCELLED = frozenset({*WAITING, "leased", "cancelled"})


def check_ids(_: click.Context, __: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    """A click callback: each job id checked (dead.py's --id too)."""
    try:
        return tuple(check_job_id(v) for v in value)
    except BadArgument as exc:
        raise click.BadParameter(str(exc)) from None


def _cancel_op(q: Queue, ids: Sequence[str]) -> Op[list[str]]:
    ttl = str(q.ops.settings.result_ttl_ms)
    replies = yield ScriptPipeline([Script("cancel", [i, ttl]) for i in ids])
    return [codec.s(r) for r in replies]


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


def children_first(q: Queue, ids: Sequence[str]) -> list[str]:
    """`ids` (once each) ordered so that each comes before every job it waits for, directly or
    through jobs left out of `ids`: cancelled first, none is parked by a later parent's cancel
    (lib/flow.lua parks a waiting child and its own). Otherwise in the order given. Reads each
    job's `flow:children:<id>` SET and those of their waiting descendants, a page per round
    trip; one not a SET (edited by hand) counts as no children."""
    kids: dict[str, list[str]] = {}
    frontier = list(dict.fromkeys(ids))
    while frontier:
        for at in range(0, len(frontier), _PAGE):
            page = frontier[at : at + _PAGE]
            pipe = q.client.pipeline(transaction=False)
            for i in page:
                pipe.smembers(f"{q.keys.prefix}flow:children:{i}")
            for i, got in zip(page, pipe.execute(raise_on_error=False), strict=True):
                kids[i] = [] if isinstance(got, Exception) else sorted(str(c) for c in got)
        frontier = list(dict.fromkeys(c for i in frontier for c in kids[i] if c not in kids))
    wanted, seen, out = set(ids), set[str](), list[str]()
    for root in dict.fromkeys(ids):  # depth first, a job after its descendants (no recursion)
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(kids[root]))]
        while stack:
            node, rest = stack[-1]
            nxt = next((c for c in rest if c not in seen), None)
            if nxt is None:
                stack.pop()
                if node in wanted:
                    out.append(node)
            else:
                seen.add(nxt)
                stack.append((nxt, iter(kids.get(nxt, ()))))
    return out


def _waiting(q: Queue, state: str, task: str | None) -> list[str]:
    """The ids of `q`'s jobs in `state` now (of `task`), read by rank pages (O(log N) each,
    not an offset walk). A job moving meanwhile (claimed, enqueued) may be left out."""
    key = q.keys.flow_held if state == "held" else q.keys.due
    first, end = 0, int(q.client.zcard(key))
    if state != "held":
        now_ms = server_now_ms(q.client, q.keys)
        split = int(q.client.zcount(key, "-inf", now_ms))  # due now: scores up to the clock
        first, end = (0, split) if state == "due" else (split, end)
    out: list[str] = []
    for start in range(first, end, _PAGE):
        page = [str(i) for i in q.client.zrange(key, start, min(start + _PAGE, end) - 1)]
        # A schedule's pending run is left: cancelling it arms the next (pause the schedule).
        page = [i for i in page if not i.startswith(OCCURRENCE_PREFIX)]
        if task is not None:
            page = [j.id for j in q._run(q.ops.get_jobs(page)) if j.task == task]
        out += page
    return out


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
    (--state: counts); exit 1 when an id was missing or already done or dead.

    Whatever the order of the IDs or of the jobs in their state: each job this command
    cancels is cancelled before any job it waits for (after=), so none of them is parked by
    its parent's cancel; a waiting job it leaves out (another state or task, an id not given)
    is parked as dead, 'parent cancelled: <id>', when a job it waits for is cancelled.

    --state of a partitioned queue with a partition's node down: nothing is cancelled, and
    the partitions that do not answer are named (exit 3). IDs: those of the other partitions
    are cancelled and printed, each of that partition named (exit 3): 'unknown whether
    cancelled' for the one whose cancel was sent when it stopped answering (it may have run)."""
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
        for part, ids in groups:
            sent = None
            try:
                for sent in children_first(part, ids):
                    was_in[sent] = part._run(_cancel_op(part, [sent]))[0]
                sent = None
            except Exception as exc:  # its node down: the other partitions' ids go on
                named = {i: silent_partition(part, queue, i, exc) for i in ids if i not in was_in}
                if None in named.values():
                    raise
                if sent in named and not never_sent(exc, part.client):
                    unknown.append(str(named.pop(sent)))
                silent += [n for n in named.values() if n is not None]
        before = {i: was_in[i] for i in dict.fromkeys(job_ids) if i in was_in}
        if as_json:
            extra = {k: v for k, v in (("unreachable", silent), ("unknown", unknown)) if v}
            emit_json({"queue": queue, "jobs": before, **extra})
        else:
            for job_id, was in before.items():
                word = "cancelled" if was in _CANCELLED else "not cancelled"
                click.echo(f"{job_id}: {word} (was {was})")
        for words in unknown:
            click.echo(f"unknown whether cancelled: {words} (see jobs show)", err=True)
        for words in silent:
            click.echo(f"not cancelled: {words}", err=True)
        if silent or unknown:
            raise SystemExit(EXIT_UNREACHABLE)
        if any(was not in _CANCELLED for was in before.values()):
            raise SystemExit(EXIT_FAILED)
        return
    assert state is not None
    parts = q.parts if isinstance(q, PartitionedQueue) else [q]
    # A due or scheduled job waits for no job (a waiting one is held): only held ones need
    # ordering, children first (see the help above).
    order = children_first if state == "held" else (lambda _, ids: list(ids))
    with unanswered_change_nothing(q, queue, "cancelled"):  # a node down: named, exit 3
        selected = [(p, i) for p in parts for i in order(p, _waiting(p, state, task))]
    what = f"{state} job(s)" + (f" of task {task!r}" if task else "")
    if selected and not yes:
        click.confirm(f"Cancel {len(selected)} {what} of queue {queue!r}?", abort=True, err=True)
    counts = _cancel_all(queue, selected)
    done = sum(n for was, n in counts.items() if was in _CANCELLED)
    if as_json:
        emit_json({"queue": queue, "state": state, "task": task, "matched": len(selected),
                   "cancelled": done, "before": counts})  # fmt: skip
    elif not selected:
        click.echo(f"no {what} in {queue!r}: nothing to cancel")
    else:
        moved = len(selected) - done  # claimed, finished or gone since they were selected
        why = f" ({moved} had moved on: {counts})" if moved else ""
        click.echo(f"cancelled: {done} of {len(selected)} {what} in {queue!r}{why}")


def _cancel_all(queue: str, selected: list[tuple[Queue, str]]) -> dict[str, int]:
    """Each job's state before its cancel, counted."""
    counts: dict[str, int] = {}
    progress = Progress(
        TextColumn("cancelling [progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console(stderr=True),
        transient=True,
    )
    with progress:
        step = progress.add_task(queue, total=len(selected))
        for at in range(0, len(selected), _BATCH):
            chunk = selected[at : at + _BATCH]
            by_part: dict[int, tuple[Queue, list[str]]] = {}
            for part, job_id in chunk:
                by_part.setdefault(id(part), (part, []))[1].append(job_id)
            for part, ids in by_part.values():
                for was in part._run(_cancel_op(part, ids)):
                    counts[was] = counts.get(was, 0) + 1
            progress.advance(step, len(chunk))
    return counts
