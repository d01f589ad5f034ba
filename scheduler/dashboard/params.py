"""A page's query parameters read strictly: a bad one is a 400 (BadArgument) naming it, before
anything is read from Redis; and the ids a page may put in a form."""

from __future__ import annotations

import re

from starlette.requests import Request

from scheduler.core.claim_reply import check_worker_id
from scheduler.core.errors import BadArgument

DEFAULT_LIMIT = 50  # jobs a page of a queue or its dead letters shows
# Only ASCII digits: str.isdigit() also accepts '²' and other digits int() refuses.
_WHOLE = re.compile(r"[0-9]{1,12}")


def int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name, "")
    if raw == "":
        return default
    if not _WHOLE.fullmatch(raw) or not lo <= int(raw) <= hi:
        raise BadArgument(f"{name} must be a whole number in [{lo}, {hi}]")
    return int(raw)


def text_param(request: Request, name: str, max_len: int = 200) -> str | None:
    value = request.query_params.get(name, "").strip()
    if len(value) > max_len:
        raise BadArgument(f"{name} is longer than {max_len} characters")
    return value or None


def worker_id_ok(worker_id: str) -> bool:
    """An id ask_stop takes (a worker's, 1-200 characters): the Quiet / Stop buttons carry it."""
    try:
        check_worker_id(worker_id)
    except BadArgument:
        return False
    return True
