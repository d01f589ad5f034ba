"""The dashboard as one ASGI app: `create_app(url=...)` serves it with uvicorn (the CLI) or
mounts in an existing Starlette / FastAPI app (`app.mount("/scheduler", create_app(...))`), or a
Django project's ASGI router (docs/dashboard.md)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import redis
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, ResponseError
from redis.retry import Retry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from scheduler.admin.redis_cli import connection_flags
from scheduler.admin.startup import (
    KEYS_HINT,
    OPERATOR_ROLE_HINT,
    credentials_hint,
    is_permission_error,
    permission_message,
    queues_where,
)
from scheduler.client.partitioned import PartitionsNotReached
from scheduler.core.connection import UNREACHABLE, connect
from scheduler.core.errors import (
    BadArgument,
    SchedulerError,
    cluster_refusal,
    refused_for_now,
    slot_move_text,
)
from scheduler.dashboard.actions import ActionRefused
from scheduler.dashboard.dead import DeadPages
from scheduler.dashboard.pages import Pages
from scheduler.dashboard.render import HERE, Renderer
from scheduler.dashboard.security import Auth, Csrf, GuardMiddleware, origin_names
from scheduler.dashboard.store import QueueNotServed, Store


class DashboardApp(GuardMiddleware):
    """The ASGI app create_app returns; `store` is its Redis reader (tests, embedding)."""

    def __init__(
        self, app: Starlette, auth: Auth, store: Store, allowed_hosts: Collection[str] | None
    ) -> None:
        super().__init__(app, auth, allowed_hosts)
        self.store = store


def create_app(
    url: str | None = None,
    *,
    client: redis.Redis | None = None,
    queues: Sequence[str] = (),
    read_only: bool = False,
    auth: Auth | None = None,
    secret: str | None = None,
    sample_every_s: float = 0.0,
    allowed_hosts: Collection[str] | None = None,
) -> DashboardApp:
    """The dashboard app.

    Args:
        url: the Redis URL (or pass `client`, a redis-py client with decode_responses=True).
        queues: the queues it serves (with their partitions; any other answers 404);
            empty: every queue, listed from the queue index (cached for a minute).
        read_only: no actions at all (every POST is refused, no buttons shown).
        auth: credentials every request must carry; default `Auth.from_env()`
            (SCHEDULER_DASHBOARD_AUTH=user:password, SCHEDULER_DASHBOARD_TOKEN=...), and
            BadArgument when it has none. When the app is mounted behind your own
            authentication, pass `Auth()` to add none.
        secret: signs the CSRF tokens (SCHEDULER_DASHBOARD_SECRET; random per process when
            unset, so several processes behind one balancer need it set).
        sample_every_s: ignored (kept for callers): the lateness chart reads the per-minute
            start lateness that claim stores in Redis, nothing is sampled.
        allowed_hosts: the host names (no port) a request's Host header may name, else 400;
            None: any. Without auth, a loopback address alone does not stop DNS rebinding,
            so `scheduler dashboard` passes the loopback names and --host then. An action's
            Origin may name one of them other than a loopback name (a proxy's public name,
            when the proxy sends `Host: 127.0.0.1`), else it must name the request's Host.
    """
    # Fail closed: a mount counting on the environment's credentials that lost them (a deploy
    # without the secret) would serve payloads, requeue and purge to anyone who reaches it.
    if auth is None:
        auth = Auth.from_env()
        if not auth.enabled:
            raise BadArgument(
                "create_app: no credentials (SCHEDULER_DASHBOARD_AUTH=user:password or"
                " SCHEDULER_DASHBOARD_TOKEN unset): set one, or pass auth=Auth() when your own"
                " authentication guards the mount"
            )
    if client is None:
        if url is None:
            raise BadArgument("create_app needs a Redis url or a client")
        # One server or a Redis Cluster (core/connection.py). Stored bytes that are not UTF-8
        # are read as escapes (\xff), as the CLI reads them, instead of failing the page. A
        # call whose connection dropped is re-sent once, at once (every call it makes is safe
        # to receive twice): the first page after a Redis restart is not a 503. Not more, nor
        # after a timeout: with Redis down a page read every queue through redis-py's default
        # 10 re-sends with backoff (5 queues: 43 s to its 503).
        once = Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
        client = connect(url, encoding_errors="backslashreplace", default_retry=once)
    store = Store(client, queues)
    render = Renderer(Csrf(secret), read_only)
    # The health page's fix lines reach the URL's server (given a client: shown bare).
    pages = Pages(store, render, connection_flags(url, client) if url else None)
    dead = DeadPages(store, render, origin_names(allowed_hosts))

    def failed(request: Request, status: int, title: str, message: str) -> Response:
        # The JSON endpoints (the live refresh's, a script's) answer JSON, the pages a page.
        # The path within the app: mounted under a prefix, url.path starts with it.
        path = request.url.path.removeprefix(request.scope.get("root_path", ""))
        if path.startswith("/api/") or path.endswith("/api"):
            return JSONResponse({"error": title, "message": message}, status_code=status)
        return render.page(request, "error.html", status_code=status, title=title,
                           message=message)  # fmt: skip

    async def bad_input(request: Request, exc: Exception) -> Response:
        return failed(request, 400, "Bad request", str(exc))

    async def not_served(request: Request, exc: Exception) -> Response:
        return failed(request, 404, "Not found", str(exc))

    async def unreachable(request: Request, exc: Exception) -> Response:
        # A server (or the queue's cluster node) down: say so, not a bare 500. An action's
        # call may have reached Redis before its answer was lost.
        if (refusal := cluster_refusal(exc)) is not None:  # the login or CLUSTER SLOTS refused
            answer = refused_now if isinstance(refusal, ResponseError) else credentials
            return await answer(request, refusal)  # type: ignore[arg-type]
        outcome = (
            "The action's outcome is unknown: reload the page once Redis answers."
            if request.method == "POST"
            else "Reload the page once it answers."
        )
        if isinstance(exc, PartitionsNotReached) and exc.partial is None:  # a pause / resume
            outcome = "The partitions named were not changed, the others took it: press it again."
        elif (moving := slot_move_text(exc, "the queue's")) is not None:  # 'TTL exhausted'
            return failed(request, 503, "Slot being moved", f"{moving}. {outcome}")
        message = f"Redis did not answer: {type(exc).__name__}: {str(exc).rstrip('.')}. {outcome}"
        return failed(request, 503, "Redis unreachable", message)

    async def credentials(request: Request, exc: Exception) -> Response:
        # A ConnectionError to redis-py, but no retry helps: say so, not "did not answer".
        message = f"Redis refused the dashboard's credentials: {exc}; {credentials_hint(exc)}."
        return failed(request, 500, "Redis refused the login", message)

    async def refused_now(request: Request, exc: Exception) -> Response:
        # OOM, READONLY mid-failover, a slot being moved, LOADING, ...: the server ran nothing
        # of the refused call and may take it in a moment. An ACL refusal names the role the
        # dashboard needs. Any other Redis error stays a 500.
        if isinstance(exc, ResponseError) and is_permission_error(exc):
            queue = request.path_params.get("queue")  # a key's refusal: the page's queue
            where = queues_where([queue]) if isinstance(queue, str) else ""
            line = permission_message(exc, OPERATOR_ROLE_HINT, where, KEYS_HINT)
            return failed(request, 500, "Redis permission denied", line)
        if not (isinstance(exc, ResponseError) and refused_for_now(exc)):
            raise exc
        outcome = (
            "The refused call changed nothing; reload the page to see how far the action got."
            if request.method == "POST"
            else "Reload the page in a moment."
        )
        if (moving := slot_move_text(exc, "the queue's")) is not None:  # TRYAGAIN: as the CLI
            return failed(request, 503, "Slot being moved", f"{moving}. {outcome}")
        message = f"Redis refused the request for now: {type(exc).__name__}: {exc}. {outcome}"
        return failed(request, 503, "Redis busy", message)

    async def refused(request: Request, exc: Exception) -> Response:
        return PlainTextResponse(f"refused: {exc}\n", status_code=403)

    q = "/queues/{queue}"
    routes = [
        Route("/", pages.overview, name="overview"),
        Route("/api/overview", pages.api_overview),
        Route(q + "/api", pages.api_queue),
        Route(q, pages.queue, name="queue"),
        Route(q + "/pause", dead.pause_queue, methods=["POST"]),
        Route(q + "/resume", dead.resume_queue, methods=["POST"]),
        Route(q + "/jobs/{job_id}", pages.job, name="job"),
        Route(q + "/jobs/{job_id}/cancel", dead.cancel, methods=["POST"]),
        Route(q + "/jobs/{job_id}/requeue", dead.requeue, methods=["POST"]),
        Route(q + "/jobs/{job_id}/run-now", dead.run_now, methods=["POST"]),
        Route(q + "/dead", dead.dead, name="dead"),
        Route(q + "/dead/confirm", dead.confirm, methods=["POST"]),
        Route(q + "/dead/apply", dead.apply, methods=["POST"]),
        Route(q + "/schedules/{name}/{verb}", dead.schedule, methods=["POST"]),
        Route(q + "/workers/{verb}", dead.worker_stop, methods=["POST"]),
        Route("/schedules", pages.schedules, name="schedules"),
        Route("/workers", pages.workers, name="workers"),
        Route("/health", pages.health, name="health"),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={
            QueueNotServed: not_served,
            BadArgument: bad_input,
            SchedulerError: bad_input,
            ActionRefused: refused,
            **{kind: unreachable for kind in UNREACHABLE},
            AuthenticationError: credentials,
            ResponseError: refused_now,
        },
    )
    return DashboardApp(app, auth, store, allowed_hosts)
