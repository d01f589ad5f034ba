"""The doctor's checks of a queue's worker keys edited by hand: the workers index of another
type (no worker is listed), and a worker's presence hash of another type (`scheduler workers`,
`workers stop` and the dashboard refuse it by name: admin/workers.py live_workers)."""

from __future__ import annotations

import shlex

import redis

from scheduler.admin.doctor_model import Issue
from scheduler.admin.inspection import iter_chunks
from scheduler.core.keys import QueueKeys


def worker_key_issues(client: redis.Redis, keys: QueueKeys) -> list[Issue]:
    workers_type = str(client.type(keys.workers))
    if workers_type == "none":
        return []
    if workers_type != "zset":
        msg = f"{keys.workers} is a {workers_type}, not the workers index: no worker is listed"
        how = f"redis-cli DEL {shlex.quote(keys.workers)} (workers add themselves again)"
        return [Issue("wrong-type", "warning", msg, how, keys.queue)]
    out: list[Issue] = []
    for ids in iter_chunks([str(w) for w in client.zrange(keys.workers, 0, -1)], 1000):
        pipe = client.pipeline(transaction=False)
        for w in ids:
            pipe.type(keys.worker(w))
        for w, t in zip(ids, pipe.execute(), strict=True):
            if str(t) not in ("hash", "none"):
                msg = f"{keys.worker(w)} is a {t}, not worker {w!r}'s presence hash"
                how = f"redis-cli DEL {shlex.quote(keys.worker(w))} (its next beat writes it)"
                out.append(Issue("wrong-type", "warning", msg, how, keys.queue))
    return out
