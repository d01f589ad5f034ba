"""Rendering: the Jinja2 environment (autoescape always on: payloads, task names and errors are
attacker-controlled text), the display filters, and the CSRF session each page carries."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from scheduler.core.errors import BadArgument
from scheduler.core.keys import check_job_id
from scheduler.core.safety import clean
from scheduler.dashboard.security import SESSION_COOKIE, Csrf

HERE = Path(__file__).resolve().parent
# Only ASCII digits: str.isdigit() also accepts '²' and other digits int() refuses.
_COUNT = re.compile(r"[0-9]{1,9}")
# Characters of one stored value a page shows: a producer may store megabytes in any field
# (a hand-written hash is not checked at enqueue), which must not become a page of megabytes.
CELL_SHOWN = 2_000  # a table cell, a name, an id
BLOCK_SHOWN = 100_000  # a payload, result or progress on the job page
# The last error and each error history entry's message and traceback: fail stores at most
# 2,000 + 8,000 characters (core/fail_reply.py), so a worker's are whole; ten hand-written
# entries at BLOCK_SHOWN each made a page of 2.4 million characters (9.6 MB escaped).
ENTRY_SHOWN = 10_000


def fmt_time(ms: int | None, tz: str = "UTC") -> str:
    if ms is None:
        return "-"
    try:
        zone = ZoneInfo(tz or "UTC")
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a directory, a long name
        zone = ZoneInfo("UTC")
    try:
        at = datetime.fromtimestamp(ms / 1000, tz=UTC).astimezone(zone)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return at.strftime("%Y-%m-%d %H:%M:%S %Z")


def fmt_duration(ms: int | None) -> str:
    """Compact and signed-free: 850ms, 12.3s, 4m05s, 2h03m, 3d04h."""
    if ms is None:
        return "-"
    ms = abs(int(ms))
    if ms < 1_000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    s = ms // 1000
    if s < 3_600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86_400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86_400}d{(s % 86_400) // 3600:02d}h"


def pretty_json(text: str | None) -> str:
    """Stored JSON re-indented for reading; anything else shown as it is (escaped later)."""
    if text is None:
        return "-"
    if len(text) > BLOCK_SHOWN:  # cut when shown anyway: not worth parsing megabytes
        return text
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False, sort_keys=True)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than it parses
        return text


def shown(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how many more are stored."""
    if len(text) <= limit:
        return text
    more = len(text) - limit
    return f"{text[:limit]} … ({more} more characters not shown: scheduler jobs show --json)"


def _clean(text: Any, limit: int = CELL_SHOWN) -> str:
    # Control characters (terminal escapes, bidi overrides) made visible; HTML escaping is
    # Jinja's autoescape, which runs on the result. Cut first: a stored value may be huge.
    return clean(shown(text if isinstance(text, str) else str(text), limit), keep_newlines=True)


def url_part(text: Any) -> str:
    # One path segment: '/', '?', '#' and '%' encoded too (Jinja's urlencode keeps '/'), so a
    # stored name cannot move a link or a form's action to another route.
    return quote(str(text), safe="")


def is_job_id(text: Any) -> bool:
    """A job id an action takes (core/keys.py); a hand-written index entry may be anything."""
    try:
        check_job_id(text)
    except BadArgument:
        return False
    return True


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every template, whatever its extension
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        time=fmt_time, duration=fmt_duration, pretty=pretty_json, clean=_clean, url_part=url_part
    )
    env.globals["BLOCK"] = BLOCK_SHOWN  # `|clean(BLOCK)`: the job page's long values
    env.globals["ENTRY"] = ENTRY_SHOWN  # `|clean(ENTRY)`: its errors
    env.tests["job_id"] = is_job_id  # `id is job_id`: an index entry an action may name
    return env


# A redirect after an action names one of these and a count; free text from the URL is never
# shown (it would let a link put words on the operator's screen), and a notice shows only with
# the signature of the session that acted (a link cannot claim that anything was done).
NOTICES = {
    "requeued": "Requeued {n} dead job(s).",
    "purged": "Purged {n} dead job(s).",
    "not-requeued": "Nothing requeued: the job is {state}, not a dead letter.",
    "cancelled": "Cancelled the job (it was {state}).",
    "not-cancelled": "Nothing cancelled: the job was already {state}.",
    "moved-now": "Moved the job's run time to now: a worker takes it at its next claim.",
    "moved-now-paused": "Moved the job's run time to now; the queue is paused: it runs once the"
    " queue is resumed.",
    "not-moved": "Nothing changed: the job is {state}.",
    # A released job goes back at its own run time (lua/lib/flow.lua), not at the release.
    "not-moved-held": "Nothing changed: flow control holds the job (a key limit, a rate window"
    " or its parents); it runs when released, or at its own run time if that is later.",
    "not-moved-schedule": "Nothing changed: a schedule's run keeps its schedule's time.",
    "paused": "Paused the schedule.",
    "resumed": "Resumed the schedule.",
    "removed": "Removed the schedule.",
    "already-paused": "Nothing changed: the schedule was already paused.",
    "not-paused": "Nothing changed: the schedule was not paused.",
    "no-schedule": "Nothing changed: there is no such schedule (removed meanwhile?).",
    "ran-now": "Ran the schedule now: this job is its extra run, due now (the schedule's own"
    " next run is unchanged); a worker takes it at its next claim.",
    "ran-now-paused": "Ran the schedule now: this job is its extra run, due now (the schedule's"
    " own next run is unchanged); the queue is paused: it runs once the queue is resumed.",
    "schedule-changed": "Nothing changed: the schedule was changed meanwhile; try again.",
    "queue-paused": "Paused the queue: workers claim none of its jobs until it is resumed.",
    "queue-already-paused": "Nothing changed: the queue was already paused.",
    "queue-resumed": "Resumed the queue: workers claim its jobs again.",
    "queue-not-paused": "Nothing changed: the queue was not paused.",
    "worker-quiet": "Quiet requested: at its next beat the worker claims no more jobs; it stops"
    " once the jobs it holds end.",
    "worker-stop": "Stop requested: at its next beat the worker stops as on SIGTERM (its grace"
    " period for the running jobs, then those left are released to run elsewhere).",
    "worker-pending": "Nothing changed: a stop asked of the worker earlier is not read yet.",
    "worker-already": "Nothing changed: the worker is stopping already.",
    "worker-gone": "Nothing asked: no live worker by that id (it stopped meanwhile?).",
    "worker-older": "Nothing asked: the worker runs an older version, which reads no stop"
    " request; stop it with SIGTERM on its host.",
}
STATES = {"due", "scheduled", "held", "leased", "done", "dead", "cancelled", "moving", "missing"}


def _notice_words(fields: Mapping[str, str]) -> str:
    return "|".join(fields.get(k, "") for k in ("notice", "n", "state"))


def notice_query(csrf: Csrf, request: Request, notice: str, **extra: str | int) -> str:
    """The query of the redirect after an action: the notice, its words, their signature."""
    fields = {"notice": notice, **{k: str(v) for k, v in extra.items()}}
    fields["sig"] = csrf.sign(request.cookies.get(SESSION_COOKIE) or "", _notice_words(fields))
    return urlencode(fields)  # a state comes from Redis: encoded


def notice_text(request: Request, csrf: Csrf) -> str:
    q = request.query_params
    template = NOTICES.get(q.get("notice", ""))
    if template is None:
        return ""
    if not csrf.signed(request.cookies.get(SESSION_COOKIE), _notice_words(q), q.get("sig")):
        return ""
    raw_n = request.query_params.get("n", "0")
    n = int(raw_n) if _COUNT.fullmatch(raw_n) else 0
    state = request.query_params.get("state", "")
    return template.format(n=n, state=state if state in STATES else "?")


def page_query(request: Request) -> str:
    """The page's query but the notice's fields: its forms' actions carry it, so an action's
    redirect lands on the same tab, filter or offset (Actions._kept)."""
    items = request.query_params.multi_items()
    return urlencode([(k, v) for k, v in items if k not in ("notice", "n", "sig")])


class Renderer:
    """Renders a template with what every page needs: the base path (the app may be mounted
    under a prefix), the read-only flag and the CSRF token of the browser's session."""

    def __init__(self, csrf: Csrf, read_only: bool) -> None:
        self.env = environment()
        self.csrf = csrf
        self.read_only = read_only

    def session(self, request: Request) -> tuple[str, bool]:
        """(session id, new?): a browser without the cookie gets one with this response."""
        sid = request.cookies.get(SESSION_COOKIE)
        if sid and 16 <= len(sid) <= 64:
            return sid, False
        return Csrf.new_session(), True

    def page(self, request: Request, template: str, status_code: int = 200, **ctx: Any) -> Response:
        sid, new = self.session(request)
        html = self.env.get_template(template).render(
            base=request.scope.get("root_path", ""),
            read_only=self.read_only,
            csrf=self.csrf.token(sid),
            nav=template.split(".")[0],
            notice=notice_text(request, self.csrf),
            page_query=page_query(request),
            **ctx,
        )
        response = HTMLResponse(html, status_code=status_code)
        if new:
            # Lax, not Strict: a link followed from another site (an alert, a chat) arrives
            # without a Strict cookie, and the new one set here broke every open tab's CSRF
            # token. A cross-site POST still carries no Lax cookie (docs/security.md).
            response.set_cookie(
                SESSION_COOKIE,
                sid,
                httponly=True,
                samesite="lax",
                secure=request.url.scheme == "https",  # never sent back over plain http then
                path=request.scope.get("root_path", "") or "/",
            )
        return response
