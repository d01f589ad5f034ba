"""NOSCRIPT that a SCRIPT LOAD does not cure (a flush racing every load): the driver's second
resend is EVAL with the script's text (scheduler/core/scripts.py), on the sync and asyncio
clients, single calls and pipelines (an enqueue_many of 1,500 is two script calls; with WAIT:
tests/faults/test_durability.py). The loads are made no-ops here, so every EVALSHA answers
NOSCRIPT and only EVAL can store the jobs. A private server: SCRIPT FLUSH is not for a shared
one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from redis.exceptions import NoScriptError

from scheduler import AsyncQueue, JobSpec, Queue
from scheduler.worker.execution import classify
from tests.redis_server import RedisProcess


async def _no_load_async(self: Any, script: Any) -> str:
    return "0" * 40


def test_sync_enqueue_and_bulk_with_wait_go_through_eval(
    module_server: RedisProcess, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = redis.Redis.from_url(module_server.url)
    c.script_flush()
    monkeypatch.setattr(redis.Redis, "script_load", lambda self, script: "0" * 40)
    q = Queue(c, queue_name)
    one = q.enqueue("t", {"n": 1})
    many = q.enqueue_many([JobSpec("t", {"n": i}) for i in range(1_500)])
    assert c.zcard(q.keys.due) == 1_501 and q.get_job(one).payload() == {"n": 1}
    assert len(set(many)) == 1_500
    c.close()


def test_asyncio_enqueue_goes_through_eval(
    module_server: RedisProcess, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        c = aredis.Redis.from_url(module_server.url)
        await c.script_flush()
        monkeypatch.setattr(aredis.Redis, "script_load", _no_load_async)
        q = AsyncQueue(c, queue_name)
        job = await q.enqueue("t", {"n": 1})
        await q.enqueue_many([JobSpec("t", {"n": i}) for i in range(1_500)])
        assert await c.zcard(q.keys.due) == 1_501
        assert (await q.get_job(job)).payload() == {"n": 1}
        await c.aclose()

    asyncio.run(main())


def test_a_user_without_eval_gets_the_noscript_not_a_permission_error(
    module_server: RedisProcess, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/security.md's roles have EVALSHA, not EVAL: when the last resort is refused so, the
    call raises its NOSCRIPT, which the worker retries (a NOPERM stops it with exit 5)."""
    admin = redis.Redis.from_url(module_server.url)
    admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "noeval", "on", ">pw", "resetkeys", "~*", "+@all", "-eval"
    )
    try:
        c = redis.Redis(unix_socket_path=module_server.socket, username="noeval", password="pw")
        admin.script_flush()
        monkeypatch.setattr(redis.Redis, "script_load", lambda self, script: "0" * 40)
        with pytest.raises(NoScriptError):
            Queue(c, queue_name).enqueue("t", {"n": 1})
        assert classify(NoScriptError("NOSCRIPT")) == "transient"
        assert admin.zcard(Queue(admin, queue_name).keys.due) == 0
        c.close()
    finally:
        admin.execute_command("ACL", "DELUSER", "noeval")  # type: ignore[no-untyped-call]
