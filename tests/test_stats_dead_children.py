"""Children parked because a parent ended dead or cancelled are new dead jobs, counted in the
per-minute `dead` counter (`scheduler stats`' dead columns, the dashboard): they were not, so
`counts().dead` read 70 while stats said 10 had died."""

from __future__ import annotations

import redis

from scheduler import Queue
from scheduler.admin.inspection import server_now_ms, window_counts


def dead_counted(client: redis.Redis, q: Queue) -> int:
    return window_counts(client, q.keys, server_now_ms(client, q.keys))["60m"]["dead"]


def test_parked_children_count_as_dead(client: redis.Redis, q: Queue) -> None:
    failing = q.enqueue("t", 1, max_attempts=1)
    for i in range(3):
        q.enqueue("t", i, after=[failing])
    (job,) = q.claim("w", limit=5).jobs
    q.fail(job.id, job.token, ("E", "m", ""))  # its 3 children are parked with it
    cancelled = q.enqueue("t", 2, delay_ms=600_000)
    for i in range(2):
        q.enqueue("t", i, after=[cancelled])
    q.cancel(cancelled)  # 2 more parked (the cancelled one is not dead)
    q.enqueue("t", 9, after=[failing])  # its parent already dead: parked at once
    assert q.counts().dead == 7
    assert dead_counted(client, q) == 7
