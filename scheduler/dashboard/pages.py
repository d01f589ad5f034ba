"""The read-only pages (GET): overview, queue, job, schedules, workers, health, and the JSON
the live refresh polls. Nothing here writes job state."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

from redis.exceptions import ResponseError
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from scheduler.admin.health import (
    at_node,
    check_server,
    read_server,
    server_nodes,
    unreachable_finding,
)
from scheduler.admin.redis_cli import fix_line
from scheduler.client.job_listing import listing_ops
from scheduler.core.connection import UNREACHABLE
from scheduler.core.errors import (
    BadArgument,
    JobNotFound,
    SchedulerError,
    edited_by_hand,
    slot_move_text,
)
from scheduler.core.keys import check_job_id
from scheduler.core.models import JobState
from scheduler.dashboard import batch
from scheduler.dashboard.history import BUCKET_MS, merge_max
from scheduler.dashboard.logical import once_per_partition, unread_why
from scheduler.dashboard.params import DEFAULT_LIMIT, int_param, text_param
from scheduler.dashboard.reasons import (
    CAN_CANCEL,
    flow_reasons,
    flow_settings,
    queue_paused_ms,
    why_not_running,
)
from scheduler.dashboard.render import Renderer
from scheduler.dashboard.schedule_view import page_rows, queue_schedule_rows
from scheduler.dashboard.store import QUEUE_RETRY_S, Store
from scheduler.dashboard.workers_page import workers_page
from scheduler.operations import browsing
from scheduler.operations.inspecting import LISTABLE

T = TypeVar("T")
SERVER_FACTS = (
    "redis_version",
    "used_memory_human",
    "maxmemory_human",
    "maxmemory_policy",
    "aof_enabled",
    "rdb_last_bgsave_status",
    "rdb_changes_since_last_save",
)
# A hand-written job hash may hold any number of fields and history entries: the page shows
# this many (a worker keeps 10 entries; a job has ~30 fields).
ERRORS_SHOWN = 10
FIELDS_SHOWN = 100
SCHEDULES_SHOWN = 500  # rows of /schedules, a page of queues: a set is a key anyone may fill
# Queues read a page (?offset=) of the overview, /workers, /health and /schedules: anyone holding
# the app role can create queues (one per tenant); an overview row is a counts script and 60
# stats hashes, polled every 3 s.
OVERVIEW_SHOWN = 200


def error_entries(history: list[Any]) -> list[dict[str, Any]]:
    """The error history, newest first: only its objects (the stored list may be written by
    hand and hold anything; the template reads each entry's fields)."""
    return [e for e in reversed(history) if isinstance(e, dict)][:ERRORS_SHOWN]


class Pages:
    def __init__(self, store: Store, render: Renderer, cli_flags: list[str] | None = None) -> None:
        self.store = store
        self.render = render
        self.cli_flags = cli_flags or []  # a fix's redis-cli reaches the app's server (its URL)

    def _paged(
        self,
        request: Request,
        read: Callable[[str], T],
        prepare: Callable[[list[str]], object] | None = None,
    ) -> tuple[list[tuple[str, T]], list[str], dict[str, int]]:
        """`read` of one page of the queues by name (OVERVIEW_SHOWN from ?offset=): only those
        are read, never every queue then cut. Also what could not be read (_each) and the
        page's place: total (queues listed), offset, limit. `prepare(names)` first: the reads
        of the whole page at once (a pipeline a server), which `read` then hands out."""
        offset = int_param(request, "offset", 0, 0, 10**9)
        names = self.store.queue_names()  # first: the discovery sets store.unreachable
        shown = names[offset:][:OVERVIEW_SHOWN]
        if prepare is not None:
            prepare(shown)
        found, missing = self._each(read, shown)
        return found, missing, {"total": len(names), "offset": offset, "limit": OVERVIEW_SHOWN}

    def _each(
        self, read: Callable[[str], T], names: list[str]
    ) -> tuple[list[tuple[str, T]], list[str]]:
        """`read` of each of `names`, and what could not be read: a cluster node the queue
        discovery could not scan, a queue whose node does not answer. The other queues are
        shown (one node down must not blank the page); when none answers, the error
        propagates (the app's 503). A cluster queue that failed is not asked again for
        QUEUE_RETRY_S: redis-py's retries of a dead node cost 3-4 s a request."""
        out: list[tuple[str, T]] = []
        missing = [
            f"node {u} did not answer (its queues are not listed)" for u in self.store.unreachable
        ]
        last: Exception | None = None
        for name in names:
            failed = self.store.failed_recently(name)
            if failed is not None:
                missing.append(f"queue {name}: {failed} (asked again within {QUEUE_RETRY_S:.0f}s)")
                continue
            try:
                out.append((name, read(name)))
            except UNREACHABLE as exc:
                missing.append(f"queue {name}: {unread_why(exc)}")
                last = exc
                if not slot_move_text(exc):  # a node down; a slot on the move: asked again
                    self.store.failed(name, exc)
            except ResponseError as exc:  # its slot being moved, its node loading, ...
                if edited_by_hand(exc):  # one queue's key: shown as `stats` shows it, a row
                    missing.append(f"queue {name}: a key edited by hand ({exc}): see doctor")
                    continue
                if (why := unread_why(exc)) is None:
                    raise
                missing.append(f"queue {name}: {why}")  # asked again
                last = exc
            except SchedulerError as exc:  # its partition record edited by hand: one row
                missing.append(f"queue {name}: {exc}")
        if last is not None and not out:
            raise last
        return out, missing

    def _summaries(self, request: Request) -> dict[str, Any]:
        """One page of the overview's rows: OVERVIEW_SHOWN queues by name from ?offset=, only
        those read (never every queue's counts, then cut), and how many there are."""
        at_once = batch.ahead("summary", batch.summaries, self.store)  # Store.queue_summary's
        found, missing, page = self._paged(request, self.store.queue_summary, at_once)
        missing += [f"queue {name} {u}" for name, row in found for u in row["unread_partitions"]]
        return {"queues": [row for _, row in found], "unreachable": missing, **page}

    def overview(self, request: Request) -> Response:
        return self.render.page(request, "overview.html", **self._summaries(request))

    def api_overview(self, request: Request) -> Response:
        page = self._summaries(request)
        rows = page["queues"]
        # The worst shown queue's, per minute (a start lateness recorded by each claim): this
        # page's queues only (OVERVIEW_SHOWN of them), named, as the page's chart says.
        page["lateness_queues"] = [r["queue"] for r in rows]
        page["late_p99_ms"] = merge_max([r["late_p99_ms"] for r in rows])
        page["late_max_ms"] = merge_max([r["late_max_ms"] for r in rows])
        return JSONResponse({**page, "lateness_bucket_ms": BUCKET_MS})

    def api_queue(self, request: Request) -> Response:
        name = request.path_params["queue"]
        return JSONResponse(self.store.queue_summary(name, minutes=1))

    def queue(self, request: Request) -> Response:
        name = request.path_params["queue"]
        view = self.store.view(name)
        state = request.query_params.get("state", "due")
        if state not in LISTABLE:
            raise BadArgument(f"state must be one of {', '.join(LISTABLE)}")
        offset = int_param(request, "offset", 0, 0, 10**9)
        limit = int_param(request, "limit", DEFAULT_LIMIT, 1, browsing.MAX_PAGE)
        job_id, task = text_param(request, "id", 128), text_param(request, "task")
        if job_id is not None:
            check_job_id(job_id)
            base = request.scope.get("root_path", "")
            return RedirectResponse(f"{base}/queues/{name}/jobs/{job_id}", status_code=303)
        summary = self.store.queue_summary(name, minutes=1)
        unread = list(summary["unread_partitions"])  # partitions left out, named on the page
        next_offset: int | None
        scanned = None
        cut: list[str] = []  # partitions whose filtered scan stopped short (view.filtered)
        if task is not None:
            jobs, scanned, next_offset, cut = view.filtered(unread, state, offset, limit, task=task)
        elif view.partitioned:
            jobs, more = view.merged_page(state, summary["now_ms"], offset, limit, unread=unread)
            next_offset = offset + limit if more else None
        else:
            # One more than the page: "more" only when there is more (not on a last full page).
            q = view.parts[0]  # its records read up to their payloads: the rows show none
            jobs = self.store.run(
                q, listing_ops(q).list_jobs(state, offset=offset, limit=limit + 1)
            )
            next_offset = offset + limit if len(jobs) > limit else None
            jobs = jobs[:limit]
        now_ms = summary["now_ms"]  # the held tab: each job's hold, as its page says it
        held_by = {j.id: flow_reasons(j, now_ms)[:1] for j in jobs} if state == "held" else {}
        return self.render.page(
            request,
            "queue.html",
            q=summary,
            held_by=held_by,
            state=state,
            states=LISTABLE,
            jobs=jobs,
            offset=offset,
            limit=limit,
            next_offset=next_offset,
            # A filtered page's offset is a scan position: back means to the first page.
            prev_offset=(0 if scanned is not None else max(offset - limit, 0)) if offset else None,
            task=task or "",
            scanned=scanned,
            scan_cut=cut,
            unreachable=once_per_partition(unread),
        )

    def job(self, request: Request) -> Response:
        name, job_id = request.path_params["queue"], request.path_params["job_id"]
        check_job_id(job_id)
        q = self.store.view(name).holder(job_id)
        try:
            job = q.get_job(job_id)
        except JobNotFound:
            return self.render.page(
                request, "missing.html", status_code=404, queue=name, job_id=job_id
            )
        now_ms = self.store.now_ms(q.name)  # one TIME, not the counts script
        workers, claiming = self.store.live_workers(name)  # bounded: not the whole ZSET
        paused_ms = queue_paused_ms(q) if job.state in (JobState.DUE, JobState.HELD) else None
        history = job.errors  # parsed once: a hand-written one may be long
        token = job.token or ""
        fence = token.split("-", 1)[0] if token else ""
        lease_left = None
        if job.state == JobState.LEASED and job.lease_until_ms is not None:
            lease_left = job.lease_until_ms - now_ms
        return self.render.page(
            request,
            "job.html",
            queue=name,
            job=job,
            now_ms=now_ms,
            fence=fence,
            lease_left_ms=lease_left,
            reasons=why_not_running(job, now_ms, workers, paused_ms, claiming),
            flow=flow_settings(job),
            errors=error_entries(history),
            errors_cut=len(history) if len(history) > ERRORS_SHOWN else 0,
            fields=sorted(job.fields.items())[:FIELDS_SHOWN],
            fields_cut=len(job.fields) if len(job.fields) > FIELDS_SHOWN else 0,
            can_cancel=job.state in CAN_CANCEL,
            can_requeue=job.state == JobState.DEAD,
            # A waiting job's time can be moved to now; a schedule's run keeps its slot's time
            # until its first claim (then it waits out a retry: lua/reschedule.lua).
            can_run_now=job.state == JobState.SCHEDULED
            and not (job.id.startswith("schedule:") and not job.attempts),
        )

    def schedules(self, request: Request) -> Response:
        rows: list[dict[str, Any]] = []

        def read(name: str) -> tuple[int, list[str]]:
            found, n, unread = queue_schedule_rows(self.store, name, SCHEDULES_SHOWN - len(rows))
            rows.extend(found)
            return n, unread

        at_once = batch.ahead("schedules", partial(page_rows, shown=SCHEDULES_SHOWN), self.store)
        read_, missing, page = self._paged(request, read, at_once)
        total = sum(n for _, (n, _) in read_)
        missing += [f"queue {name} {u}" for name, (_, unread) in read_ for u in unread]
        cut = total if total > len(rows) else 0
        return self.render.page(request, "schedules.html", schedules=rows, cut=cut,
                                unreachable=missing, **page)  # fmt: skip

    def workers(self, request: Request) -> Response:
        return workers_page(self, request)

    def health(self, request: Request) -> Response:
        findings, facts = [], []
        for node in server_nodes(self.store.client):  # every primary of a cluster
            try:
                info, config = read_server(self.store.client, node)
            except UNREACHABLE as exc:
                if node is None:  # the one server: the app's 503
                    raise
                findings += at_node(node, [unreachable_finding(exc)])
                continue
            findings += at_node(node, check_server(info, config))
            at = f"{node.name} " if node is not None else ""
            facts += [(at + k, info.get(k, "-")) for k in SERVER_FACTS]
            facts.append((at + "save (config)", config.get("save", "not readable")))
            facts.append((at + "appendfsync (config)", config.get("appendfsync", "not readable")))
        at_once = batch.ahead("counts", batch.counts, self.store)  # Store.counts's
        found, missing, page = self._paged(request, self.store.counts, at_once)
        missing += [f"queue {name} {u}" for name, (_, unread) in found for u in unread]
        lapsed = [(n, c.lapsed) for n, (c, _) in found]
        findings = [replace(f, fix=fix_line(f.fix, self.cli_flags, f.node)) for f in findings]
        return self.render.page(request, "health.html", findings=findings, facts=facts,
                                lapsed=lapsed, unreachable=missing, **page)  # fmt: skip
