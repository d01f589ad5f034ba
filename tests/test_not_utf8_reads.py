"""A stored value that is not UTF-8 (a pickle written by hand into a spec record).

The claim parks such a job ("invalid job: payload"); after that, every reader of the Python API
raised a bare UnicodeDecodeError from redis-py: `get_job`, `status`, `result`, and
`list_jobs('dead')` for the whole page, hiding the healthy dead jobs too. The package's own
clients (`Queue.from_url`, the worker, like the CLI and dashboard already) now read such bytes
as `\\xff` escapes; a caller's client that decodes strictly gets UnreadableRecord, a typed
error, and its connection stays usable."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aredis

from scheduler import AsyncQueue, JobState, Queue, UnreadableRecord


@pytest.fixture
def parked(q: Queue) -> Iterator[tuple[str, str]]:
    """(a healthy dead job, a dead job whose spec payload is a pickle)."""
    ok = q.enqueue("t", "fine", max_attempts=1)
    (job,) = q.claim("w", limit=1).jobs
    q.fail(job.id, job.token, ("E", "m", ""))
    bad = q.enqueue("t", "x")
    key = f"{q.keys.prefix}spec:{bad}"
    raw = q.client.get(key)
    assert isinstance(raw, str)
    q.client.set(key, raw.rsplit("|", 1)[0].encode() + b"|" + pickle.dumps({"evil": 1}))
    assert q.claim("w", limit=5).jobs == []  # parked at once
    yield ok, bad


def test_own_clients_read_escapes(redis_url: str, q: Queue, parked: tuple[str, str]) -> None:
    ok, bad = parked
    with Queue.from_url(redis_url, q.name) as own:
        assert {j.id for j in own.list_jobs("dead")} == {ok, bad}
        assert own.status(bad) == JobState.DEAD
        assert "\\x80" in own.get_job(bad).payload_json


def test_strict_client_gets_typed_error(redis_url: str, q: Queue, parked: tuple[str, str]) -> None:
    ok, bad = parked
    strict = Queue(redis.Redis.from_url(redis_url, decode_responses=True), q.name)
    try:
        for call in (lambda: strict.get_job(bad), lambda: strict.status(bad)):
            with pytest.raises(UnreadableRecord, match="not UTF-8"):
                call()
        with pytest.raises(UnreadableRecord, match="not UTF-8"):
            strict.result(bad, timeout_s=0.2)
        assert strict.get_job(ok).state == JobState.DEAD  # the connection is in step after it
    finally:
        strict.close()


def test_strict_async_client_gets_typed_error(
    redis_url: str, q: Queue, parked: tuple[str, str]
) -> None:
    ok, _ = parked

    async def main() -> None:
        strict = AsyncQueue(aredis.Redis.from_url(redis_url, decode_responses=True), q.name)
        try:
            with pytest.raises(UnreadableRecord, match="not UTF-8"):
                await strict.list_jobs("dead")
            assert (await strict.get_job(ok)).state == JobState.DEAD
        finally:
            await strict.aclose()

    asyncio.run(main())
