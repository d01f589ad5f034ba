"""heartbeat's lease_ms defaults as claim's does (one constant): a manual loop that gives
neither keeps one lease length, on Queue and AsyncQueue alike."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from scheduler import AsyncQueue, Queue
from scheduler.core.connection import connect_async
from scheduler.core.limits import DEFAULT_LEASE_MS
from tests.conftest import Clock

T0 = 1_000_000


@pytest.mark.parametrize("cls", [Queue, AsyncQueue])
def test_claim_and_heartbeat_share_one_default(cls: type[Queue] | type[AsyncQueue]) -> None:
    for method in (cls.claim, cls.heartbeat):
        assert inspect.signature(method).parameters["lease_ms"].default == DEFAULT_LEASE_MS


def test_heartbeat_without_lease_ms_extends_by_the_default(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    clock.set_ms(T0)
    jid = q.enqueue("t")
    (job,) = q.claim("w").jobs
    assert q.get_job(jid).lease_until_ms == T0 + DEFAULT_LEASE_MS
    clock.set_ms(T0 + 10_000)
    until, statuses = q.heartbeat([(jid, job.token)])
    assert statuses == {jid: "held"}
    assert until == T0 + 10_000 + DEFAULT_LEASE_MS
    assert q.get_job(jid).lease_until_ms == until


def test_async_heartbeat_without_lease_ms(redis_url: str, tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    clock.set_ms(T0)

    async def main() -> tuple[int, dict[str, str]]:
        aq = AsyncQueue(connect_async(redis_url), q.name, _clock="test")
        try:
            jid = await aq.enqueue("t")
            (job,) = (await aq.claim("w")).jobs
            clock.set_ms(T0 + 5_000)
            return await aq.heartbeat([(jid, job.token)])
        finally:
            await aq.aclose()

    until, statuses = asyncio.run(main())
    assert list(statuses.values()) == ["held"]
    assert until == T0 + 5_000 + DEFAULT_LEASE_MS
