"""A task handle's calls are checked by the caller's type checker: calling it as the function
(its own signature), and `enqueue` / `aenqueue` / `job_spec` options (JobOptions). Each line
below that mypy must refuse carries a `type: ignore[...]`; the project's `mypy --strict` (in
`make test`) warns of an unused ignore, so if a handle stopped being checked, it fails there.
At run time the same calls raise TypeError."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler import JobContext, Queue, Registry

registry = Registry()


@registry.task("typing.greet")
def greet(payload: dict[str, Any], ctx: JobContext) -> str:
    return f"hi {payload['name']}"


def test_a_call_to_the_handle_is_checked_against_the_function() -> None:
    with pytest.raises(TypeError):
        greet({"name": "a"}, None, 3)  # type: ignore[call-arg, arg-type]


def test_an_option_typo_is_refused_by_the_checker_and_at_run_time() -> None:
    with pytest.raises(TypeError, match="delay"):
        greet.job_spec({"name": "a"}, delay=5)  # type: ignore[call-arg]
    spec = greet.job_spec({"name": "a"}, delay_ms=5)
    assert spec.delay_ms == 5


def test_enqueue_options_are_typed(module_server: Any) -> None:

    with Queue.from_url(module_server.url, "typing") as q:
        with pytest.raises(TypeError, match="delay"):
            greet.enqueue(q, {"name": "a"}, delay=5)  # type: ignore[call-arg]
        job = greet.enqueue(q, {"name": "a"}, delay_ms=60_000, key="k")
        assert q.status(job) == "scheduled"


def test_enqueue_takes_any_queue_open_queue_gives(module_server: Any) -> None:
    """`open_queue` answers `Queue | PartitionedQueue`; the handle's `enqueue` accepted both at
    run time but its hint said Queue, so a typical app failed `mypy --strict` here."""
    from scheduler import open_queue
    from scheduler.client.partitioned import PartitionedQueue

    with Queue.from_url(module_server.url, "typing-open") as plain:
        PartitionedQueue.create(plain.client, "typing-parts", partitions=2)
        for name in ("typing-open", "typing-parts"):
            q = open_queue(plain.client, name)
            job = greet.enqueue(q, {"name": "a"}, delay_ms=60_000)  # no ignore: mypy checks it
            assert q.status(job) == "scheduled"


def test_the_wrong_kind_of_queue_is_refused_before_anything_is_sent(module_server: Any) -> None:
    """`aenqueue` on a blocking Queue wrote the job, then raised a TypeError (a caller that
    retried wrote it twice); `enqueue` on an AsyncQueue raised TypeError with a coroutine never
    awaited. Both are BadArgument now, naming the other call, and nothing is written."""
    import asyncio

    from scheduler import AsyncQueue, BadArgument

    with Queue.from_url(module_server.url, "typing-kind") as q:
        with pytest.raises(BadArgument, match=r"handle\.enqueue\(q, payload\)"):
            asyncio.run(greet.aenqueue(q, {"name": "a"}))  # type: ignore[arg-type]

        async def on_async_queue() -> None:
            async with AsyncQueue.from_url(module_server.url, "typing-kind") as aq:
                with pytest.raises(BadArgument, match=r"await handle\.aenqueue\(aq, payload\)"):
                    greet.enqueue(aq, {"name": "a"})  # type: ignore[arg-type]

        asyncio.run(on_async_queue())
        counts = q.counts()
        assert (counts.due, counts.scheduled) == (0, 0)
