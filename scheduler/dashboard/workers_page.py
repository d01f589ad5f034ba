"""/workers: the live workers of one page of queues (?offset=, as the overview pages them),
WORKERS_SHOWN entries of their workers sets at a time (?from=), each worker of a partitioned
queue counted once: three pipelines a server (workers_read.py), whatever the number of
queues, and the presence hashes of the page's own entries only, never every worker."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from scheduler.dashboard.params import int_param, worker_id_ok
from scheduler.dashboard.store import WORKERS_LISTED, WORKERS_SHOWN
from scheduler.dashboard.workers_read import Found, Share, read_page

if TYPE_CHECKING:
    from scheduler.dashboard.pages import Pages


def workers_page(pages: Pages, request: Request) -> Response:
    start = int_param(request, "from", 0, 0, 10**9)
    shares: dict[str, Share] = {}

    def prepare(names: list[str]) -> None:
        shares.update(read_page(pages.store, names, start, WORKERS_SHOWN, WORKERS_LISTED))

    def read(name: str) -> Found:  # not prepared: its node failed a moment ago (_each)
        share = shares.get(name)
        return share.found() if share is not None else ([], 0, False, [])

    found, missing, page = pages._paged(request, read, prepare)
    missing += [f"queue {name} {u}" for name, (_, _, _, unread) in found for u in unread]
    rows = [w for _, (ws, _, _, _) in found for w in ws]
    for w in rows:  # a member written by hand may be megabytes: no id for a form then
        w["actionable"] = worker_id_ok(w["id"])
    cut = any(more for _, (_, _, more, _) in found)
    entries = sum(n for _, (_, n, _, _) in found)
    # One TIME (not a counts script), on a node that answered.
    now_ms = pages.store.now_ms(found[0][0] if found else None)
    return pages.render.page(request, "workers.html", workers=rows, now_ms=now_ms, cut=cut,
                             listed=WORKERS_LISTED, unreachable=missing, start=start,
                             shown=WORKERS_SHOWN, entries=entries, **page)  # fmt: skip
