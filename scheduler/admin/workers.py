"""The live workers of a queue, as operators see them (`scheduler workers`, the doctor, the
dashboard): read from the workers ZSET, each worker's presence hash and the stop request an
operator left for it (admin/worker_stop.py). Nothing here writes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis
from redis.exceptions import ResponseError

from scheduler.core.errors import CorruptKey, edited_by_hand
from scheduler.core.keys import QueueKeys
from scheduler.core.vocabulary import STOP_VERBS


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    queue: str
    last_seen_ms: int
    host: str
    pid: int | None
    queues: list[str]
    started_ms: int | None
    last_heartbeat_ms: int | None
    in_flight: int | None
    concurrency: int | None
    # The stop it is carrying out ('quiet' | 'stop', read from its beat), and one asked of it
    # that its next beat has yet to read (`scheduler workers quiet|stop`); None: neither.
    stopping: str | None = None
    stop_requested: str | None = None
    # False for a worker from before operator stops (828eb42): its beats never write
    # `stopping` and it never reads a request (admin/worker_stop.py OLDER): SIGTERM it.
    hears_stop: bool = True

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


def _opt_int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):  # OverflowError: a score of inf
        return None


def _queues_field(raw: str | None) -> list[str]:
    if not raw:
        return []
    if raw.startswith("["):
        try:
            data = json.loads(raw)
            return [str(x) for x in data] if isinstance(data, list) else [raw]
        except (ValueError, RecursionError):  # nested past the parser's depth: as written
            return [raw]
    return [p.strip() for p in raw.split(",") if p.strip()]


def worker_info(wid: str, queue: str, seen: Any, h: dict[str, Any], request: Any) -> WorkerInfo:
    """A live worker's row from its presence hash `h`, its score in the queue's workers set
    (`seen`) and its stop request (another type, or not a verb: none)."""
    return WorkerInfo(
        id=wid,
        queue=queue,
        last_seen_ms=_opt_int(seen) or 0,
        host=h.get("host", ""),
        pid=_opt_int(h.get("pid")),
        queues=_queues_field(h.get("queues")),
        started_ms=_opt_int(h.get("started_ms")),
        last_heartbeat_ms=_opt_int(h.get("last_heartbeat_ms")),
        in_flight=_opt_int(h.get("in_flight")),
        concurrency=_opt_int(h.get("concurrency")),
        stopping=h.get("stopping") if h.get("stopping") in STOP_VERBS else None,
        stop_requested=request if request in STOP_VERBS else None,
        hears_stop="stopping" in h,
    )


def live_workers(
    client: redis.Redis, keys: QueueKeys, limit: int = -1
) -> tuple[list[WorkerInfo], list[str]]:
    """(live workers, ids whose hash has expired) of the newest `limit` entries (-1: all). A
    worker's hash expires when it stops heart-beating: its presence is liveness."""
    members: list[Any] = client.zrange(  # BYSCORE REV: the ACL roles have ZRANGE, not ZREVRANGE
        keys.workers, "+inf", "-inf", desc=True, byscore=True, offset=0, num=limit, withscores=True
    )
    if not members:
        return [], []
    pipe = client.pipeline(transaction=False)
    for wid, _ in members:
        pipe.hgetall(keys.worker(str(wid)))
        pipe.get(keys.worker_stop(str(wid)))
    replies: list[Any] = pipe.execute(raise_on_error=False)
    for (wid, _), reply in zip(members, replies[0::2], strict=True):
        if isinstance(reply, ResponseError) and edited_by_hand(reply):
            raise CorruptKey(  # still a ResponseError, as callers caught before
                f"worker {str(wid)!r}: its presence hash {keys.worker(str(wid))} holds another "
                "type (edited by hand); delete it, the worker's next beat writes it again"
            )
        if isinstance(reply, Exception):
            raise reply  # the caller's error, as before
    # A request edited by hand into another type: no request (the worker reads none either).
    asked = [r if r in STOP_VERBS else None for r in replies[1::2]]
    live: list[WorkerInfo] = []
    gone: list[str] = []
    for (wid, seen), h, request in zip(members, replies[0::2], asked, strict=True):
        if not h:
            gone.append(str(wid))
            continue
        live.append(worker_info(str(wid), keys.queue, seen, h, request))
    return live, gone
