"""The actions (POST only): cancel, requeue or run now (reschedule to now) a job, pause /
resume / remove / run now a schedule, pause / resume a whole queue (a partitioned queue: every
partition), quiet / stop a worker (admin/worker_stop.py). Each
one first checks the read-only switch, the CSRF token and the Origin, so a refused request
changes nothing; then redirects (303) to a page that names what was done, or that nothing was
(the call's answer decides the notice, never the button pressed)."""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from scheduler.admin.worker_stop import WorkerNotFound, ask_stop
from scheduler.client.queue import Queue
from scheduler.core.errors import BadArgument, JobNotFound, ScheduleNotFound, UnreadableRecord
from scheduler.core.ids import new_job_id
from scheduler.core.keys import check_job_id
from scheduler.dashboard.logical import PARTITION_NAME, stored_layout
from scheduler.dashboard.reasons import queue_paused_ms
from scheduler.dashboard.render import Renderer, notice_query
from scheduler.dashboard.security import SESSION_COOKIE, origin_allowed
from scheduler.dashboard.store import Store
from scheduler.schedules.recurring import check_schedule_name

MAX_FORM_FIELDS = 600  # a page of 500 selected ids and the other fields
MAX_FORM_BYTES = 100_000
MAX_KEPT = 200  # a kept query value (params.text_param's cap); a longer one is dropped
# Queue.cancel answers the state the job was in: these were cancelled, others left as they were.
CANCELLABLE = frozenset({"due", "scheduled", "held", "leased"})  # lua/cancel.lua's answers
# What Queue.reschedule answered -> the notice shown (render.NOTICES); the state words go in
# `state` of "not-moved" ("the job is leased").
RUN_NOW_NOTICES = {
    "rescheduled": "moved-now",
    "held": "not-moved-held",
    "schedule": "not-moved-schedule",
    "due": "not-moved",
    "leased": "not-moved",
    "done": "not-moved",
    "dead": "not-moved",
    "cancelled": "not-moved",
    "moving": "not-moved",  # a queue move took it out of due (admin/queue_move.py)
}
# What a schedule call answered -> the notice shown (render.NOTICES).
SCHEDULE_NOTICES = {
    "paused": "paused",
    "resumed": "resumed",
    "removed": "removed",
    "already": "already-paused",  # pause of a paused schedule
    "active": "not-paused",  # resume of an active one
    "missing": "no-schedule",
    "stale": "schedule-changed",  # resume raced a change of the definition
}

# What Queue.pause / Queue.resume answered -> the notice shown on the queue page.
QUEUE_NOTICES = {
    "paused": "queue-paused",
    "already": "queue-already-paused",
    "resumed": "queue-resumed",
    "active": "queue-not-paused",  # resume of a queue that was not paused
}

# What admin/worker_stop.ask_stop answered (and "gone": no live worker by that id) -> the notice.
WORKER_NOTICES = {"pending": "worker-pending", "already": "worker-already", "gone": "worker-gone",
                  "older": "worker-older"}  # fmt: skip


class ActionRefused(Exception):
    """An action refused before it ran (read-only, CSRF, origin): HTTP 403, nothing changed."""


class Form:
    """A posted form as text fields (a file upload is refused)."""

    def __init__(self, items: list[tuple[str, str]]) -> None:
        self._items = items

    def get(self, name: str, default: str = "") -> str:
        for k, v in self._items:
            if k == name:
                return v
        return default

    def getlist(self, name: str) -> list[str]:
        return [v for k, v in self._items if k == name]


async def _urlencoded(request: Request) -> list[tuple[str, str]]:
    """The urlencoded form (what the pages post), read with a size cap; no multipart, so no
    extra dependency and no file upload path."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise ActionRefused("a form post (application/x-www-form-urlencoded) is expected")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise ActionRefused("the form is too large")
    try:
        return parse_qsl(body.decode(), keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
    except (UnicodeDecodeError, ValueError):
        raise ActionRefused("the form could not be read") from None


class Actions:
    def __init__(self, store: Store, render: Renderer, origin_names: frozenset[str]) -> None:
        self.store = store
        self.render = render
        self.origin_names = origin_names  # security.origin_names: Origins trusted by name

    async def form(self, request: Request) -> Form:
        """The request's form, once every guard passed (else ActionRefused)."""
        if self.render.read_only:
            raise ActionRefused("the dashboard is read-only (started with --read-only)")
        origin = request.headers.get("origin")
        host = request.headers.get("host")
        if origin is not None and not origin_allowed(origin, host, self.origin_names):
            raise ActionRefused("cross-origin request refused")
        form = Form(await _urlencoded(request))
        if not self.render.csrf.valid(request.cookies.get(SESSION_COOKIE), form.get("csrf")):
            raise ActionRefused("missing or invalid CSRF token: reload the page and try again")
        return form

    def _back(self, request: Request, path: str, notice: str, **extra: str | int) -> Response:
        base = request.scope.get("root_path", "")
        query = notice_query(self.render.csrf, request, notice, **extra)
        return RedirectResponse(f"{base}{path}?{query}", status_code=303)

    @staticmethod
    def _kept(request: Request, *names: str) -> dict[str, str]:
        """The query of the page acted from (its tab, filter, offset), which its forms' action
        URLs carry: the redirect lands there again. Only `names`, as text a page reads (a
        hand-made value is refused by the page, not here)."""
        got = ((k, request.query_params.get(k, "")) for k in names)
        return {k: v for k, v in got if v and len(v) <= MAX_KEPT}

    async def cancel(self, request: Request) -> Response:
        name, job_id = request.path_params["queue"], check_job_id(request.path_params["job_id"])
        await self.form(request)

        def run() -> str:
            try:
                return self.store.view(name).holder(job_id).cancel(job_id)
            except JobNotFound:  # gone meanwhile (its record expired, purged): a stale page
                return "missing"

        state = await run_in_threadpool(run)
        notice = "cancelled" if state in CANCELLABLE else "not-cancelled"
        return self._back(request, f"/queues/{name}/jobs/{job_id}", notice, state=state)

    async def run_now(self, request: Request) -> Response:
        name, job_id = request.path_params["queue"], check_job_id(request.path_params["job_id"])
        await self.form(request)

        def run() -> tuple[str, bool]:
            view = self.store.view(name)
            try:  # a job due already keeps its place ('due'): a stale page's button
                q = view.holder(job_id)
                answer = str(view.drive(q, q.ops.run_now(job_id)))
            except JobNotFound:  # gone meanwhile (purged, expired)
                return "missing", False
            # Moved in a paused queue (partition): no claim takes it until a resume.
            return answer, answer == "rescheduled" and queue_paused_ms(q) is not None

        answer, paused = await run_in_threadpool(run)
        notice = RUN_NOW_NOTICES.get(answer, "not-moved" if answer == "missing" else None)
        if notice is None:  # an answer this version does not know: claim nothing
            raise BadArgument(f"the job could not be moved: the call answered {answer!r}")
        notice = "moved-now-paused" if paused else notice
        return self._back(request, f"/queues/{name}/jobs/{job_id}", notice, state=answer)

    async def requeue(self, request: Request) -> Response:
        name, job_id = request.path_params["queue"], check_job_id(request.path_params["job_id"])
        await self.form(request)

        def run() -> tuple[int, str]:
            q = self.store.view(name).holder(job_id)
            n = q.requeue_dead([job_id])
            try:  # nothing requeued: say what the job is (held, due, ...: a stale page's button)
                return n, "dead" if n else str(q.status(job_id))
            except JobNotFound:
                return n, "missing"

        n, state = await run_in_threadpool(run)
        path = f"/queues/{name}/jobs/{job_id}"
        if not n:
            return self._back(request, path, "not-requeued", state=state)
        return self._back(request, path, "requeued", n=n)

    async def schedule(self, request: Request) -> Response:
        name, sched = request.path_params["queue"], request.path_params["name"]
        verb = request.path_params["verb"]
        self.store.served(name)  # 404 for a queue not served, whatever the rest
        await self.form(request)
        if verb not in ("pause", "resume", "remove", "run"):
            raise BadArgument("the action must be pause, resume, remove or run")
        sched = check_schedule_name(sched)
        if verb == "run":
            return await self._run_schedule(request, name, sched)

        def run() -> str:
            return str(getattr(self._holder(name, sched), f"{verb}_schedule")(sched))

        answer = await run_in_threadpool(run)
        notice = SCHEDULE_NOTICES.get(answer)
        if notice is None:  # an answer this version does not know: claim nothing
            raise BadArgument(f"the schedule could not be {verb}d: the call answered {answer!r}")
        return self._back(request, "/schedules", notice, **self._kept(request, "offset"))

    def _holder(self, name: str, sched: str) -> Queue:
        """The queue holding schedule `sched` of queue `name`: a partitioned queue's logical
        name is its schedule's partition (as the CLI's), a partition or plain queue itself."""
        view = self.store.view(name)  # UnreadableRecord (a 400): its layout edited by hand
        return view.parts[0] if view.pq is None else view.pq._sched(sched)

    async def _run_schedule(self, request: Request, name: str, sched: str) -> Response:
        """Queue.run_schedule_now in the schedule's queue (its partition); to the new job's
        page, which says so."""

        def run() -> tuple[str, str, bool]:
            q = self._holder(name, sched)
            try:
                job_id = q.run_schedule_now(sched, job_id=self._run_id(q.name))
            except ScheduleNotFound:  # removed meanwhile (a stale page)
                return q.name, "", False
            return q.name, job_id, queue_paused_ms(q) is not None  # its run waits for a resume

        part, job_id, paused = await run_in_threadpool(run)
        if not job_id:
            return self._back(request, "/schedules", "no-schedule", **self._kept(request, "offset"))
        notice = "ran-now-paused" if paused else "ran-now"
        return self._back(request, f"/queues/{part}/jobs/{job_id}", notice)

    def _run_id(self, name: str) -> str | None:
        """In partition k of a partitioned queue, an id tagged `p<k>.` as PartitionedQueue
        tags it, so the logical queue finds the job by its id; else None (the client's). A
        logical queue's record edited by hand (unreadable, another type) tags nothing: its
        damage does not block a run in a queue named like its partition."""
        m = PARTITION_NAME.match(name)
        try:
            layout = stored_layout(self.store.client, m.group(1)) if m is not None else None
        except UnreadableRecord:
            return None
        names = layout.names if layout is not None else ()
        return f"p{names.index(name)}.{new_job_id()}" if name in names else None

    async def pause_queue(self, request: Request) -> Response:
        return await self._pause_or_resume(request, "pause")

    async def resume_queue(self, request: Request) -> Response:
        return await self._pause_or_resume(request, "resume")

    async def _pause_or_resume(self, request: Request, verb: str) -> Response:
        name = request.path_params["queue"]
        await self.form(request)

        def run() -> str:
            view = self.store.view(name)  # BadArgument for an invalid name
            if verb == "resume":
                return view.resume()  # writes nothing unless it was paused
            if not self.store.known(name):  # a pause would write a stray key of a typo
                raise BadArgument(f"no queue named {name!r} (it has no keys): nothing paused")
            return view.pause()

        answer = await run_in_threadpool(run)
        notice = QUEUE_NOTICES.get(answer)
        if notice is None:  # an answer this version does not know: claim nothing
            raise BadArgument(f"the queue could not be {verb}d: the call answered {answer!r}")
        kept = self._kept(request, "state", "task", "offset", "limit")  # the tab shown
        return self._back(request, f"/queues/{name}", notice, **kept)

    async def worker_stop(self, request: Request) -> Response:
        """Quiet or stop one worker of the queue (the form's `worker` id): the request its next
        beat reads, as `scheduler workers quiet|stop` writes it."""
        name, verb = request.path_params["queue"], request.path_params["verb"]
        worker_id = (await self.form(request)).get("worker")

        def run() -> str:
            parts = [q.keys for q in self.store.view(name).parts]
            try:
                return ask_stop(self.store.client, parts, worker_id, verb, queue=name)
            except WorkerNotFound:  # stopped meanwhile (a stale page), or a forged id
                return "gone"

        answer = await run_in_threadpool(run)
        notice = WORKER_NOTICES.get(answer, f"worker-{verb}")
        return self._back(request, "/workers", notice, **self._kept(request, "offset", "from"))
