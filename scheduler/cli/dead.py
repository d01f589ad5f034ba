"""`scheduler dead list | requeue | purge | retention`: the dead-letter list, with filters
(`retention` lives in dead_retention.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Literal

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from scheduler.admin.inspection import iter_chunks, server_now_ms
from scheduler.cli.common import (
    EXIT_CODES_HELP,
    AdminGroup,
    Duration,
    F,
    connect,
    console,
    emit_json,
    json_option,
    queue_option,
    require_queue,
    url_option,
)
from scheduler.cli.confirm import confirm
from scheduler.cli.dead_retention import retention
from scheduler.cli.dead_view import (
    exit_unread,
    id_option,
    page_jobs,
    print_bulk,
    print_dead,
    select_at,
    unread_field,
)
from scheduler.cli.job_cancel import unanswered_change_nothing
from scheduler.cli.jobs import job_json
from scheduler.client.partitioned import PartitionedQueue, open_queue, requeue_order, unread
from scheduler.client.partitioned_merge import merge_scored
from scheduler.client.partitioned_partial import read_every
from scheduler.client.queue import Queue
from scheduler.core.keys import QueueKeys
from scheduler.operations.dead_bulk import dead_act, dead_plan
from scheduler.operations.dead_letters import dead_listing
from scheduler.operations.requests import Op

_BATCH = 100  # ids per script call in bulk operations (one progress step each)
_SKIP, _PAGE = "Skip this many matching jobs first.", "Print at most this many jobs."


def register(main: click.Group) -> None:
    main.add_command(dead)


@click.group(cls=AdminGroup, epilog=EXIT_CODES_HELP)
def dead() -> None:
    """Jobs parked for a human: list them, requeue them with a fresh attempt budget, or purge
    them for good; `retention` shows or sets the opt-in limits (off by default). Filters
    combine (all must match); no filter selects every dead job."""


dead.add_command(retention)


def filter_options(f: F) -> F:
    for opt in reversed(
        [
            click.option("--task", help="Only jobs of this task."),
            click.option("--error-type", help="Only jobs whose last error has this type."),
            click.option(
                "--older-than",
                "older_than_ms",
                type=Duration(),
                help="Only jobs dead for longer than this: 30m, 2h, 7d.",
            ),
            id_option,
        ]
    ):
        f = opt(f)
    return f


def _listing(
    q: Queue | PartitionedQueue,
    task: str | None,
    error_type: str | None,
    older_than_ms: int | None,
    want: int,
    not_read: list[str],
) -> tuple[list[tuple[int, str]], int | None]:
    """The newest `want` matches as (partition, id) (each partition's first `want`, merged,
    one driver call a node; one whose node does not answer is named into `not_read`) and the
    total when it is known without a scan."""
    args: dict[str, Any] = {"task": task, "error_type": error_type, "older_than_ms": older_than_ms}
    if isinstance(q, PartitionedQueue):
        each = q.run_answering(lambda p: dead_listing(p.keys, limit=want, **args))
        not_read += unread(q.parts, each)
        per = [([], 0) if isinstance(r, BaseException) else r for r in each]
    else:
        per = [q._run(dead_listing(q.keys, limit=want, **args))]
    chosen = merge_scored("dead", [found for found, _ in per], 0, want)  # newest first
    totals = [n for _, n in per]
    return chosen, None if None in totals else sum(n for n in totals if n is not None)


@dead.command("list")
@url_option
@queue_option
@json_option
@filter_options
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True, help=_SKIP)
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True, help=_PAGE)
def list_dead(
    url: str,
    queue: str,
    as_json: bool,
    task: str | None,
    error_type: str | None,
    older_than_ms: int | None,
    ids: tuple[str, ...],
    offset: int,
    limit: int,
) -> None:
    """Dead jobs, newest first: why each died and its last error. Reads the page it prints
    (with --task / --error-type, as far as the page's matches go: the total is then not
    counted, `more` says whether others follow). A partitioned queue's partition whose node
    does not answer is named (`not read: ...` on stderr, --json's `unreachable`) and the
    others' dead jobs listed, exit 3."""
    client = connect(url)
    require_queue(client, queue)
    q = open_queue(client, queue)  # a partitioned queue: merged, newest first
    total: int | None
    not_read: list[str] = []  # partitions whose node does not answer: named, exit 3
    if ids:
        at = select_at(q, task, error_type, older_than_ms, ids)  # read where each is dead
        selected = list(at)
        page, total = [(at[i], i) for i in selected[offset : offset + limit]], len(selected)
        more = offset + limit < total
    else:
        # Without a total (a record filter), one beyond the page tells whether more follow.
        beyond = int(task is not None or error_type is not None)
        want = offset + limit + beyond
        found, total = _listing(q, task, error_type, older_than_ms, want, not_read)
        page = found[offset : offset + limit]
        more = len(found) > offset + limit if total is None else offset + limit < total
    now_ms = server_now_ms(client, QueueKeys(queue))  # the queue's node: its scripts' clock
    jobs = page_jobs(q, page, as_json)  # the text shows no payload: --json does
    rows = [job_json(j, now_ms) for j in jobs]
    # Ids whose hash and spec were deleted by hand: counted in the total, so listed too.
    stored = {j.id for j in jobs}
    gone = [i for _, i in page if i not in stored]
    if as_json:
        paged = {"offset": offset, "limit": limit, "jobs": rows, "gone": gone}
        emit_json({"queue": queue, "total": total, "more": more, **paged, **unread_field(not_read)})
    else:
        print_dead(queue, total, more, rows, gone, now_ms, url)
    exit_unread(not_read)


Run = Callable[[Callable[[int], None]], int]  # the action: advance(n) per step; how many done


def _by_id(
    q: Queue | PartitionedQueue, verb: str, flt: dict[str, Any], ids: Sequence[str], yes: bool
) -> tuple[int, Run]:
    """--id: the ids given that match (to requeue: each parent first), acted on in chunks, each
    read again first (selected before the confirmation) but the first one with --yes."""
    selected = list(select_at(q, ids=ids, **flt))
    if verb == "requeued":
        selected = requeue_order(q, selected)
    action = q.requeue_dead if verb == "requeued" else q.purge_dead

    def run(advance: Callable[[int], None]) -> int:
        done = 0
        for n, chunk in enumerate(iter_chunks(selected, _BATCH)):
            again = chunk if yes and n == 0 else list(select_at(q, ids=chunk, refuse=False, **flt))
            done += action(again)
            advance(len(chunk))
        return done

    return len(selected), run


def _by_filter(q: Queue | PartitionedQueue, verb: str, flt: dict[str, Any]) -> tuple[int, Run]:
    """The filters' matches, counted now and acted on a page at a time once confirmed
    (operations/dead_bulk.py), never all in memory: each partition's below its own cutoff,
    read from its node's clock."""
    parts = q.parts if isinstance(q, PartitionedQueue) else [q]
    task, error_type = flt["task"], flt["error_type"]

    def plan(p: Queue) -> Op[tuple[int, int]]:
        return dead_plan(p.keys, flt["older_than_ms"], task, error_type)

    if isinstance(q, PartitionedQueue):  # every partition counted before any change
        plans = read_every("dead_ids", parts, q.run_answering(plan), list)
    else:
        plans = [q._run(plan(q))]
    how: Literal["requeue", "purge"] = "requeue" if verb == "requeued" else "purge"

    def run(advance: Callable[[int], None]) -> int:
        return sum(
            p._run(dead_act(p.ops, how, cutoff, task, error_type, advance))
            for p, (cutoff, n) in zip(parts, plans, strict=True)
            if n
        )

    return sum(n for _, n in plans), run


def _bulk(
    verb: str,
    url: str,
    queue: str,
    as_json: bool,
    flt: dict[str, Any],
    ids: Sequence[str],
    yes: bool,
) -> None:
    client = connect(url)
    require_queue(client, queue)
    q = open_queue(client, queue)  # a partitioned queue: each id in its partition
    with unanswered_change_nothing(q, queue, verb):  # a node down: named, exit 3
        matched, run = _by_id(q, verb, flt, ids, yes) if ids else _by_filter(q, verb, flt)
    if not matched:
        print_bulk(verb, queue, 0, 0, as_json)
        return
    if not yes:
        ask = {"requeued": "Requeue", "purged": "Delete for good"}.get(verb, verb)
        ask += f" {matched} dead job(s) of queue {queue!r}?"
        confirm(ask, action=f"{verb.removesuffix('d')} them")  # requeue / purge
    progress = Progress(
        TextColumn(f"{verb} [progress.description]{{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console(stderr=True),
        transient=True,
    )
    with progress:
        step = progress.add_task(queue, total=matched)
        done = run(partial(progress.advance, step))
    print_bulk(verb, queue, matched, done, as_json)


_yes = click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")


@dead.command("requeue")
@url_option
@queue_option
@json_option
@filter_options
@_yes
def requeue_dead(
    url: str,
    queue: str,
    as_json: bool,
    task: str | None,
    error_type: str | None,
    older_than_ms: int | None,
    ids: tuple[str, ...],
    yes: bool,
) -> None:
    """Move matching dead jobs back to due now, with a fresh attempt budget. They are counted
    first (the count the question states): one that dies afterwards is left. Each parent goes
    before its parked children. A partitioned queue with a partition's node down: nothing is
    requeued, those partitions named (exit 3)."""
    flt = {"task": task, "error_type": error_type, "older_than_ms": older_than_ms}
    _bulk("requeued", url, queue, as_json, flt, ids, yes)


@dead.command("purge")
@url_option
@queue_option
@json_option
@filter_options
@_yes
def purge_dead(
    url: str,
    queue: str,
    as_json: bool,
    task: str | None,
    error_type: str | None,
    older_than_ms: int | None,
    ids: tuple[str, ...],
    yes: bool,
) -> None:
    """Delete matching dead jobs for good (asks first unless --yes). They are counted first
    (the count the question states): one that dies afterwards is left. A partitioned queue
    with a partition's node down: nothing is purged, those partitions named (exit 3)."""
    flt = {"task": task, "error_type": error_type, "older_than_ms": older_than_ms}
    _bulk("purged", url, queue, as_json, flt, ids, yes)
