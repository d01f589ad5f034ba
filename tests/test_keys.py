"""Key schema: one hash tag per queue (one cluster slot), and no user input escapes it."""

from __future__ import annotations

import pytest
import redis
from redis.crc import key_slot

from scheduler import BadArgument, Queue
from scheduler.core.keys import QueueKeys


def slot(key: str) -> int:
    return key_slot(key.encode())


def test_every_key_of_a_queue_is_in_one_slot(q: Queue, client: redis.Redis) -> None:
    jid = q.enqueue("t", {"a": 1}, key="user-key {with} braces")
    q.claim("w", limit=1)
    q.enqueue("t", None, delay_ms=10_000)
    keys = list(client.scan_iter(match=q.keys.pattern()))
    assert len(keys) >= 5 and q.keys.job(jid) in keys
    assert {slot(k) for k in keys} == {slot(q.keys.due)}


@pytest.mark.parametrize("name", ["", "a{b", "a}b", "a:b", "a b", "x" * 65, "é"])
def test_unsafe_queue_names_are_refused(name: str) -> None:
    with pytest.raises(BadArgument):
        QueueKeys(name)


def test_queues_do_not_share_keys(client: redis.Redis) -> None:
    a, b = QueueKeys("alpha"), QueueKeys("alpha-2")
    assert not a.due.startswith(b.prefix) and not b.due.startswith(a.prefix)
    assert a.prefix == "sched:{alpha}:"
