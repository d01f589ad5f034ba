"""A stale head in a concurrency key's hold set (flow:ckheld:<key>: an id no longer held, left
by a hand edit): when the key's last lease ended, the script let one held job go (the ended
job's limit) and took the stale head for it, so the real held jobs stayed held with the key
empty, until some other lease of the key ended (none might). The walk that lets held jobs go
now drops stale heads first, as the FIFO check already did (the doctor also reports them:
tests/test_doctor_ckheld_stale.py)."""

from __future__ import annotations

import redis

from scheduler import JobState, Queue
from tests.test_doctor_ckheld_stale import HELD, _stale_head


def test_the_keys_last_lease_ending_lets_the_real_held_job_go(
    q: Queue, client: redis.Redis
) -> None:
    a, x, y = _stale_head(q, client)
    q.complete(a, q.get_job(a).token or "", None)
    assert q.status(x) == JobState.DUE  # before: HELD, the ghost let go in its stead
    assert [str(m) for m in client.zrange(q.keys.prefix + HELD, 0, -1)] == [y]
    assert [j.id for j in q.claim("w", limit=5).jobs] == [x]
    assert [j.id for j in q.claim("w", limit=5).jobs] == [y]  # 2 of its limit of 3
