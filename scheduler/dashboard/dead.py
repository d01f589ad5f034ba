"""The dead letters page: filter by task, error type and age; requeue or purge the selected
ones or all matching, after a confirmation page that states the count.

The page itself is O(page): no filter is a ZRANGE page, an age filter a BYSCORE page (the dead
ZSET's score is dead_ms), a task / error type filter a bounded scan that resumes from where
the last page stopped. Only an action on "all matching" with a task / error filter walks every
dead letter, and only after the operator asked for it (POST): a page at a time, as `scheduler
dead requeue | purge` by filter (operations/dead_bulk.py), so its memory does not grow with the
dead set (it held every matching id: 150-340 B a dead job).

"All matching" is fixed when the confirmation page counts it: that page carries the highest
dead_ms it counted (`upto_ms`) and the count, and the apply counts again with the same cutoff
before it changes anything, then acts below it: a job that dies while the operator reads the
page is not acted on; should more match anyway (a hand-written score, clocks of several cluster
nodes), nothing is done and the page says so."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import urlencode

from redis.exceptions import ResponseError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from scheduler.client.job_listing import listing_ops
from scheduler.client.queue import Queue
from scheduler.core.errors import BadArgument
from scheduler.core.keys import check_job_id
from scheduler.core.models import Job
from scheduler.dashboard.actions import Actions, Form
from scheduler.dashboard.logical import View, once_per_partition
from scheduler.dashboard.params import DEFAULT_LIMIT, int_param
from scheduler.operations import browsing
from scheduler.operations.dead_bulk import dead_act, dead_count
from scheduler.operations.dead_letters import dead_converted
from scheduler.operations.inspecting import wrong_type
from scheduler.operations.requests import Op

_AGE = re.compile(r"([0-9]{1,9})\s*(s|m|h|d)")
_FORM_INT = re.compile(r"[0-9]{1,15}")  # ASCII digits: '²'.isdigit() is True too
_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
T = TypeVar("T")


def parse_age_ms(text: str) -> int | None:
    """'90s', '15m', '2h', '7d' -> ms; '' -> None."""
    text = text.strip()
    if not text:
        return None
    m = _AGE.fullmatch(text)
    if not m:
        raise BadArgument(f"age must look like 90s, 15m, 2h or 7d, got {text[:40]!r}")
    return int(m.group(1)) * _UNIT_MS[m.group(2)]


@dataclass(frozen=True)
class DeadFilter:
    task: str | None
    error_type: str | None
    older_than: str

    @classmethod
    def read(cls, get: Any) -> DeadFilter:
        def text(name: str) -> str | None:
            value = str(get(name) or "").strip()
            if len(value) > 200:
                raise BadArgument(f"{name} is longer than 200 characters")
            return value or None

        f = cls(text("task"), text("error_type"), text("older_than") or "")
        parse_age_ms(f.older_than)  # refused here, before anything is read or changed
        return f

    @property
    def by_record(self) -> bool:
        return self.task is not None or self.error_type is not None

    def max_dead_ms(self, now_ms: int) -> int | None:
        age = parse_age_ms(self.older_than)
        return None if age is None else now_ms - age

    def as_dict(self) -> dict[str, str]:
        return {
            "task": self.task or "",
            "error_type": self.error_type or "",
            "older_than": self.older_than,
        }

    def shown(self) -> dict[str, str]:
        """The fields set: the query of the page an action's redirect and its confirmation's
        Cancel go back to (the page the operator was working through)."""
        return {k: v for k, v in self.as_dict().items() if v}


def _jobs_died_before(q: Queue, max_dead_ms: int, offset: int, limit: int) -> Op[list[Job]]:
    ids = yield from browsing.dead_ids_before(q.keys, max_dead_ms, offset, limit)
    return (yield from listing_ops(q).get_jobs(ids))  # the rows show no payload


def _on_dead(q: Queue, op: Op[T]) -> Op[T]:
    """`op` once an old dead LIST is converted; the dead set edited by hand into another type
    is the dead page's typed error (a 400 naming `scheduler doctor`), not a bare 500."""
    try:
        yield from dead_converted()
        return (yield from op)
    except ResponseError as exc:
        raise wrong_type(exc, "dead", q.name) from None


def _nothing() -> Op[int]:
    """The action of a part none of whose dead letters matched at the count."""
    yield from ()
    return 0


def _unseen(n: int) -> None:
    """dead_act's progress: the dashboard shows none (the notice gives the count done)."""


def _form_int(form: Form, name: str) -> int | None:
    raw = form.get(name)
    if raw == "":
        return None
    if not _FORM_INT.fullmatch(raw):
        raise BadArgument(f"{name} must be a whole number")
    return int(raw)


class DeadPages(Actions):
    def dead(self, request: Request) -> Response:
        name = request.path_params["queue"]
        view = self.store.view(name)
        f = DeadFilter.read(request.query_params.get)
        offset = int_param(request, "offset", 0, 0, 10**9)
        limit = int_param(request, "limit", DEFAULT_LIMIT, 1, browsing.MAX_PAGE)
        counts, _, unread = view.counts_and_paused()  # partitions left out: named on the page
        max_dead_ms = f.max_dead_ms(counts.now_ms)
        scanned = None
        next_offset: int | None
        cut: list[str] = []  # partitions whose filtered scan stopped short (view.filtered)
        if f.by_record:
            jobs, scanned, next_offset, cut = view.filtered(
                unread, "dead", offset, limit, task=f.task, error_type=f.error_type,
                max_dead_ms=max_dead_ms,
            )  # fmt: skip
            total = None
        elif view.partitioned:
            jobs, more = view.merged_page(
                "dead", counts.now_ms, offset, limit, max_dead_ms, unread=unread
            )
            next_offset = offset + limit if more else None
            total = counts.dead
            if max_dead_ms is not None:
                cutoff = max_dead_ms
                total = sum(
                    view.read_each(lambda q: browsing.dead_count_before(q.keys, cutoff), 0, unread)
                )
        elif max_dead_ms is not None:
            q = view.parts[0]
            jobs = self.store.run(q, _jobs_died_before(q, max_dead_ms, offset, limit))
            total = self.store.run(q, browsing.dead_count_before(q.keys, max_dead_ms))
            next_offset = offset + limit if offset + limit < total else None
        else:
            q = view.parts[0]
            jobs = self.store.run(q, listing_ops(q).list_jobs("dead", offset=offset, limit=limit))
            total = counts.dead
            next_offset = offset + limit if offset + limit < total else None
        return self.render.page(
            request,
            "dead.html",
            queue=name,
            jobs=jobs,
            now_ms=counts.now_ms,
            filters=f.as_dict(),
            total=total,
            scanned=scanned,
            scan_cut=cut,
            offset=offset,
            limit=limit,
            next_offset=next_offset,
            # A filtered page's offset is a scan position: back means to the first page.
            prev_offset=(0 if scanned is not None else max(offset - limit, 0)) if offset else None,
            unreachable=once_per_partition(unread),
        )

    def _selection(self, name: str, form: Form) -> tuple[str, str, DeadFilter, list[str]]:
        # The dead page's buttons post `do=<action>:<scope>`; the confirmation page both fields.
        action, _, scope = form.get("do", "").partition(":")
        if not form.get("do"):
            action, scope = form.get("action", ""), form.get("scope", "")
        if action not in ("requeue", "purge"):
            raise BadArgument("action must be requeue or purge")
        if scope not in ("selected", "matching"):
            raise BadArgument("scope must be selected or matching")
        f = DeadFilter.read(form.get)
        ids = [check_job_id(i) for i in form.getlist("ids")] if scope == "selected" else []
        if scope == "selected" and not 1 <= len(ids) <= browsing.MAX_PAGE:
            raise BadArgument("select between 1 and 500 dead letters")
        self.store.view(name)  # the queue name is checked before anything is counted
        return action, scope, f, ids

    def _cutoff(self, name: str, f: DeadFilter) -> int:
        """The highest dead_ms "all matching" takes now: the age filter's, else the ms before
        the server's now (a job dying after this read is not counted)."""
        age = parse_age_ms(f.older_than) or 0
        return self.store.now_ms(name) - max(age, 1)

    def _counts(self, view: View, f: DeadFilter, cutoff: int) -> list[int]:
        """How many dead letters of each part match `f` at or below `cutoff` (dead_count: a
        ZCOUNT, with a task / error filter a scan that counts), every part in one driver call."""
        return view.run_each(
            lambda q: _on_dead(q, dead_count(q.keys, cutoff, f.task, f.error_type))
        )

    def _matching_count(self, name: str, f: DeadFilter, cutoff: int) -> int:
        return sum(self._counts(self.store.view(name), f, cutoff))

    def _act(
        self,
        name: str,
        verb: Literal["requeue", "purge"],
        f: DeadFilter,
        cutoff: int,
        confirmed: int | None,
    ) -> int:
        """Requeue or purge "all matching" at or below `cutoff`, a page at a time (dead_act),
        after a count of every part, so that nothing is done when more match than the
        confirmation stated or a part does not answer. A form without the confirmation's count
        (a script) is counted by ZCOUNT alone (no scan): it only tells which parts hold any."""
        view = self.store.view(name)
        counted = f if confirmed is not None else DeadFilter(None, None, f.older_than)
        counts = self._counts(view, counted, cutoff)
        if confirmed is not None and sum(counts) > confirmed:
            raise BadArgument(
                f"{sum(counts)} dead letters match now, the confirmation stated "
                f"{confirmed}: nothing was done; confirm again from the dead letters page"
            )
        todo = {q.name for q, n in zip(view.parts, counts, strict=True) if n}

        def act(q: Queue) -> Op[int]:  # a request at least: _run_many asks each for one first
            if q.name not in todo:
                return _on_dead(q, _nothing())
            return _on_dead(q, dead_act(q.ops, verb, cutoff, f.task, f.error_type, _unseen))

        return sum(view.run_each(act)) if todo else 0

    async def confirm(self, request: Request) -> Response:
        name = request.path_params["queue"]
        form = await self.form(request)
        action, scope, f, ids = self._selection(name, form)
        upto_ms = None
        if scope == "selected":
            count = len(ids)
        else:
            upto_ms = await run_in_threadpool(self._cutoff, name, f)
            count = await run_in_threadpool(self._matching_count, name, f, upto_ms)
        return self.render.page(
            request,
            "confirm.html",
            queue=name,
            action=action,
            scope=scope,
            ids=ids,
            filters=f.as_dict(),
            back=urlencode(f.shown()),
            count=count,
            upto_ms=upto_ms,
        )

    async def apply(self, request: Request) -> Response:
        name = request.path_params["queue"]
        form = await self.form(request)
        action, scope, f, ids = self._selection(name, form)

        # From the confirmation page: the cutoff it counted with and the count it stated.
        upto_ms, confirmed = _form_int(form, "upto_ms"), _form_int(form, "count")

        def run() -> int:
            if scope == "matching":
                cutoff = self._cutoff(name, f) if upto_ms is None else upto_ms
                verb: Literal["requeue", "purge"] = "requeue" if action == "requeue" else "purge"
                return self._act(name, verb, f, cutoff, confirmed)
            view = self.store.view(name)
            return view.requeue_dead(ids) if action == "requeue" else view.purge_dead(ids)

        n = await run_in_threadpool(run)
        notice = "requeued" if action == "requeue" else "purged"
        return self._back(request, f"/queues/{name}/dead", notice, n=n, **f.shown())
