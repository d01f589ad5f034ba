"""Jobs written as the version before spec records wrote them (every job one hash): the copy of
that version's enqueue in tests/fixtures/enqueue_v1.lua, run with the queue's keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis

from scheduler import Queue
from scheduler.core.codec import new_job_id

OLD_ENQUEUE = (Path(__file__).parent / "fixtures" / "enqueue_v1.lua").read_text()


def old_enqueue(
    q: Queue,
    client: redis.Redis,
    task: str,
    payload_json: str = "null",
    *,
    delay_ms: int = 0,
    max_attempts: int = 5,
    backoff: str = "1000,2.0,3600000,0.25",
    timeout_ms: int = 0,
    job_id: str | None = None,
) -> str:
    """One job as the old enqueue.lua wrote it (hash job:<id> with task, payload, state,
    run_at_ms, enqueued_ms, attempts, max_attempts, backoff[, timeout_ms]); returns its id."""
    jid = job_id or new_job_id()
    k = q.keys
    args: list[Any] = [jid, task, payload_json, "in", delay_ms, max_attempts, backoff]
    args += [timeout_ms, "", 1000]
    keys = [k.prefix, k.due, k.leased, k.dead, k.wake]
    flags = client.eval(OLD_ENQUEUE, len(keys), *keys, 1, *args)
    assert flags[0] == "c", flags
    assert client.exists(k.spec(jid)) == 0 and client.hget(k.job(jid), "task") == task
    return jid
