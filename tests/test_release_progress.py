"""A graceful stop's release sends first the progress its runs set since their last heartbeat
(worker/progress_sends.py sent_ahead, reporting.py _release): in the same round trip, nothing
more for a run with none unsent, fenced by the run's token (a stale run's is refused), and
carried again by the next try when its call failed. The user-side view (the progress kept, a
debounced enqueue not replacing the job) is in test_review_debounce_progress.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from scheduler import JobContext, Queue, Registry
from scheduler.core.connection import connect_async
from scheduler.worker import Worker, WorkerSettings, progress_sends
from tests.conftest import Clock

T0 = 1_000_000


class _Ops:
    def progress(self, items: list[tuple[str, str, Any]]) -> tuple[str, list[Any]]:
        return ("progress", items)


_BY_NAME: Any = {qn: SimpleNamespace(script_keys=[qn], ops=_Ops()) for qn in ("a", "b")}


def _run(queue: str, job_id: str, progress: str | None) -> Any:
    ctx = SimpleNamespace(_progress=progress, _progress_sent=None)
    job = SimpleNamespace(id=job_id, token="t-" + job_id)
    return SimpleNamespace(queue=queue, job=job, ctx=ctx, finished=True)


class _Send:
    """The round trip: records each call's items; answers 'ok' each, or raises / fails some."""

    def __init__(self) -> None:
        self.sent: list[list[Any]] = []
        self.raise_next: BaseException | None = None
        self.fail_progress = False

    async def __call__(self, items: Any) -> list[Any]:
        self.sent.append(list(items))
        if self.raise_next is not None:
            exc, self.raise_next = self.raise_next, None
            raise exc
        return [
            redis.ConnectionError("lost") if self.fail_progress and op[0] == "progress" else "ok"
            for _, op in items
        ]


def test_a_release_of_runs_with_no_unsent_progress_sends_only_the_release() -> None:
    send = _Send()
    sent_already = _run("a", "j2", '"x"')
    sent_already.ctx._progress_sent = sent_already.ctx._progress
    rs = [_run("a", "j1", None), sent_already]
    items = [(["a"], ("release", ["j1", "j2"]))]
    got = asyncio.run(progress_sends.sent_ahead(_BY_NAME, rs, items, send))
    assert send.sent == [items] and got == ["ok"]


def test_unsent_progress_goes_first_in_the_same_call_with_each_run_s_token() -> None:
    send = _Send()
    rs = [_run("a", "j1", '"1"'), _run("b", "j2", None), _run("b", "j3", '"3"')]
    items = [(["a"], ("release", ["j1"])), (["b"], ("release", ["j2", "j3"]))]
    got = asyncio.run(progress_sends.sent_ahead(_BY_NAME, rs, items, send))
    assert send.sent == [
        [
            (["a"], ("progress", [("j1", "t-j1", '"1"')])),
            (["b"], ("progress", [("j3", "t-j3", '"3"')])),
            *items,
        ]
    ]
    assert got == ["ok", "ok"]  # the release's replies only
    # Marked sent: another try carries nothing more.
    asyncio.run(progress_sends.sent_ahead(_BY_NAME, rs, items, send))
    assert send.sent[1] == items


@pytest.mark.parametrize("how", ["call raised", "progress reply failed"])
def test_progress_whose_call_failed_is_carried_again_by_the_next_try(how: str) -> None:
    send = _Send()
    rs = [_run("a", "j1", '"1"')]
    items = [(["a"], ("release", ["j1"]))]
    if how == "call raised":
        send.raise_next = redis.ConnectionError("lost")
        with pytest.raises(redis.ConnectionError):
            asyncio.run(progress_sends.sent_ahead(_BY_NAME, rs, items, send))
    else:
        send.fail_progress = True
        asyncio.run(progress_sends.sent_ahead(_BY_NAME, rs, items, send))
        send.fail_progress = False
    asyncio.run(progress_sends.sent_ahead(_BY_NAME, rs, items, send))
    assert send.sent[1] == send.sent[0] == [(["a"], ("progress", [("j1", "t-j1", '"1"')])), *items]


def test_a_stale_run_s_progress_is_refused_at_a_graceful_stop(
    redis_url: str, tq: tuple[Queue, Clock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's lease lapsed and another claim took its job before the stop: its progress,
    sent ahead of its release with its old token, writes nothing, nor does the release, and the
    new holder keeps the job."""
    q, clock = tq
    carried: list[Any] = []
    real_ahead = progress_sends.ahead

    def ahead(by_name: Any, rs: Any) -> Any:
        got = real_ahead(by_name, rs)
        carried.extend((r.job.id, text) for r, text, _ in got[0])
        return got

    monkeypatch.setattr(progress_sends, "ahead", ahead)
    clock.set_ms(T0)
    job = q.enqueue("digest", {"n": 1})
    registry = Registry()
    started = asyncio.Event()

    @registry.task("digest")
    async def digest(payload: dict[str, Any], ctx: JobContext) -> None:
        ctx.set_progress({"sent": 3})
        started.set()
        await asyncio.sleep(60)  # stopped by the shutdown

    async def main() -> str:
        client = connect_async(redis_url)
        settings = WorkerSettings(
            queues=(q.name,), concurrency=1, heartbeat_ms=20_000, lease_ms=60_000, grace_s=0
        )
        w = Worker(client, registry, settings, _clock="test")
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await asyncio.wait_for(started.wait(), 15)
            clock.set_ms(T0 + 60_001)  # the worker's lease lapsed (its heartbeat is far off)
            (taken,) = q.claim("other", limit=1, lease_ms=60_000).jobs
        finally:
            w.request_stop()
            await asyncio.wait_for(task, 15)
            await client.aclose()
        assert taken.id == job
        return taken.token

    token = asyncio.run(main())
    assert carried == [(job, '{"sent":3}')]  # sent, and refused
    got = q.get_job(job)
    assert got.progress is None
    assert q.status(job) == "leased"
    assert q.set_progress(job, token, "new holder") == "held"  # its lease is intact
