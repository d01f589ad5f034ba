"""An operator's stop of a running worker (`scheduler workers quiet|stop`, the dashboard's Quiet
and Stop buttons): a STRING `worker_stop:<id>` in each queue the worker beats on, under that
queue's hash tag (so on a cluster in the slot of its beat). The worker's next presence beat
reads and deletes it (lua/worker_beat.lua) and acts on it (worker/remote_stop.py). It expires
after `ttl_ms`: a request for a worker that stopped meanwhile does not linger."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import ResponseError

from scheduler.core.claim_reply import check_worker_id
from scheduler.core.connection import UNREACHABLE
from scheduler.core.errors import BadArgument, CorruptKey, SchedulerError, edited_by_hand
from scheduler.core.keys import QueueKeys
from scheduler.core.vocabulary import STOP_VERBS

# 5 min: 60 beats at the default 5 s heartbeat; a worker reads it at its next beat.
DEFAULT_STOP_TTL_MS = 300_000
MIN_STOP_TTL_MS = 1_000  # below one beat at the default interval it would mostly go unread
MAX_STOP_TTL_MS = 86_400_000
# What ask_stop answers, for each worker asked:
ASKED = "asked"  # written: its next beat reads it
PENDING = "pending"  # a stop asked earlier and not read yet is kept (a quiet never undoes it)
ALREADY = "already"  # the worker is carrying out this stop (or a stop, for a quiet) already
# Nothing written: the worker runs a version from before operator stops (828eb42), whose beats
# never write the `stopping` field (every later beat does, '' for none): it would never read
# the request, shown as asked for ever. It stops by a signal (SIGTERM) on its host.
OLDER = "older"


class WorkerNotFound(SchedulerError, LookupError):
    """No live worker by that id on the queue (it stopped, or the id is mistyped); nothing
    was written."""


def check_stop(verb: str, ttl_ms: int) -> None:
    """BadArgument unless verb is one of STOP_VERBS and ttl_ms within the bounds."""
    if verb not in STOP_VERBS:
        raise BadArgument(f"the request must be one of {', '.join(STOP_VERBS)}, got {verb!r:.40}")
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int):
        raise BadArgument(f"ttl_ms must be an int, got {ttl_ms!r:.40}")
    if not MIN_STOP_TTL_MS <= ttl_ms <= MAX_STOP_TTL_MS:
        raise BadArgument(
            f"the request's ttl must be {MIN_STOP_TTL_MS} ms to {MAX_STOP_TTL_MS} ms, got {ttl_ms}"
        )


def ask_stop(
    client: redis.Redis,
    parts: Sequence[QueueKeys],
    worker_id: str,
    verb: str,
    ttl_ms: int = DEFAULT_STOP_TTL_MS,
    *,
    queue: str | None = None,
) -> str:
    """Ask the worker `worker_id` of a queue (`parts`: its keys, every partition's for a
    partitioned queue: a worker beats on each) to quiet or stop. Written where the worker is
    live; ASKED, PENDING, ALREADY or OLDER (see above). WorkerNotFound when it is live on none,
    BadArgument for a bad verb, ttl or id: nothing written. queue: the name to give in the
    error (a partitioned queue's own), by default the first part's."""
    check_stop(verb, ttl_ms)
    check_worker_id(worker_id)
    # Each partition read on its own: one whose node does not answer is left out while
    # another answers (the worker beats on each and reads the request on any; a cluster
    # pipeline raises for a node down, which refused the dashboard's Stop of such a queue).
    pairs: list[tuple[QueueKeys, Any, Any]] = []
    down: list[Exception] = []
    for keys in parts:
        pipe = client.pipeline(transaction=False)
        pipe.hget(keys.worker(worker_id), "stopping")
        pipe.exists(keys.worker(worker_id))
        try:  # replies as they are: an error in a pipeline's is prefixed "Command # 1 ..."
            field, exists = pipe.execute(raise_on_error=False)
        except UNREACHABLE as exc:
            down.append(exc)
            continue
        if isinstance(field, ResponseError) and edited_by_hand(field):  # still a ResponseError
            raise CorruptKey(
                f"worker {worker_id!r}: its presence hash {keys.worker(worker_id)} holds another "
                "type (edited by hand): nothing asked; delete it, the worker's next beat writes it "
                "again"
            )
        if lost := [r for r in (field, exists) if isinstance(r, UNREACHABLE)]:
            down.append(lost[0])  # a cluster pipeline answers a node down in place
            continue
        for reply in (field, exists):
            if isinstance(reply, Exception):  # a refusal (OOM, NOPERM, ...): the caller's
                raise reply
        pairs.append((keys, field, exists))
    if down and not pairs:
        raise down[0]
    live = [k for k, _, n in pairs if n]
    if not live:
        where = queue or (parts[0].queue if parts else "")
        raise WorkerNotFound(f"no live worker {worker_id!r} on queue {where!r}: it "
                             "stopped, or the id is not one `scheduler workers` lists")  # fmt: skip
    if all(s is None for _, s, n in pairs if n):
        return OLDER
    stopping = {s for _, s, _ in pairs if s in STOP_VERBS}
    if "stop" in stopping or verb in stopping:
        return ALREADY
    pipe = client.pipeline(transaction=False)
    for keys in live:
        # A quiet never replaces a request not read yet (a stop must not turn into a quiet).
        pipe.set(keys.worker_stop(worker_id), verb, px=ttl_ms, nx=verb == "quiet")
    return ASKED if any(pipe.execute()) else PENDING
