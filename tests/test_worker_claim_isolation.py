"""A worker on several queues whose claim on ONE of them keeps failing (its cluster node is
down, say) goes on claiming from the others: the failing queue sits out a growing delay of its
own, and its jobs are done once its claims answer again. Its unanswered claim is replayed with
the same nonce (never claimed twice under a fresh one). One private redis-server."""

from __future__ import annotations

import asyncio
import types
import uuid
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from scheduler import Queue
from scheduler.core.connection import connect_async
from scheduler.core.models import ClaimBatch
from scheduler.worker import EXIT_OK, Worker, WorkerSettings
from scheduler.worker import claiming as claiming_module
from scheduler.worker.registry import Registry
from tests.fixtures.polling import poll
from tests.redis_server import RedisProcess

JOBS_PER_QUEUE = 5
registry = Registry()


@registry.task(name="isolation-noop")
async def noop(payload: object, ctx: object) -> None:
    return None


# "first": the round starts at the failing queue (the old code's steady state once any round
# reached it); "second": it comes right after a healthy one.
@pytest.mark.parametrize("start", ["first", "second"])
def test_one_queue_failing_its_claims_does_not_stop_the_others(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch, start: str
) -> None:
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    prefix = "iso-" + uuid.uuid4().hex[:8]
    queues = [Queue(admin, f"{prefix}-p{i}") for i in range(4)]
    bad_i = 1
    jobs = {q.name: [q.enqueue("isolation-noop", None) for _ in range(JOBS_PER_QUEUE)]
            for q in queues}  # fmt: skip
    first = bad_i if start == "first" else bad_i - 1
    monkeypatch.setattr(claiming_module, "random", types.SimpleNamespace(randrange=lambda n: first))

    def all_done(q: Queue) -> bool:
        return all(q.status(j) == "done" for j in jobs[q.name])

    async def main() -> tuple[int, list[tuple[str, bool]]]:
        client = connect_async(module_server.url)
        names = tuple(q.name for q in queues)
        w = Worker(client, registry, WorkerSettings(queues=names, concurrency=4, grace_s=0))
        aq = w._by_name[queues[bad_i].name].aq
        real = aq.claim
        failing = True
        calls: list[tuple[str, bool]] = []  # (nonce, raised) per claim of the bad queue

        async def flaky(*args: Any, **kwargs: Any) -> ClaimBatch:
            calls.append((kwargs["nonce"], failing))
            if failing:
                raise RedisConnectionError("the bad queue's node is down")
            return await real(*args, **kwargs)

        monkeypatch.setattr(aq, "claim", flaky)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            healthy = [q for i, q in enumerate(queues) if i != bad_i]
            await poll(lambda: all(all_done(q) for q in healthy), "the healthy queues' jobs")
            # the bad queue was retried, not given up on, and none of its jobs ran
            await poll(lambda: len(calls) >= 2, "the bad queue's claim retried")
            assert not any(queues[bad_i].status(j) == "done" for j in jobs[queues[bad_i].name])
            failing = False
            await poll(lambda: all_done(queues[bad_i]), "the bad queue's jobs once it answers")
        finally:
            w.request_stop()
            code = await task
            await client.aclose()
        return code, calls

    try:
        code, calls = asyncio.run(main())
    finally:
        for q in queues:
            for key in admin.scan_iter(match=q.keys.pattern()):
                admin.delete(key)
        admin.close()
    assert code == EXIT_OK
    # every failed call and the first answered one carry one nonce: the lost call is replayed
    upto_answer = [nonce for nonce, raised in calls[: [r for _, r in calls].index(False) + 1]]
    assert len(upto_answer) >= 3 and len(set(upto_answer)) == 1
