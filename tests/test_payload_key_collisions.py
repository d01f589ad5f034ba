"""A dict whose keys JSON writes as the same text ({1: "a", "1": "b"}, {True: .., "true": ..})
lost one of its values silently: JSON has string keys only, and its reader keeps the last of
two equal ones. Such a payload (by name, in a batch, of a schedule), a handler's result and a
progress value are refused with InvalidPayload naming the key and where it is; nothing written.
A dict with non-string keys that do not collide is taken as before (the keys come back as text)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from scheduler import InvalidPayload, JobSpec, Queue
from scheduler.core.codec import encode_json
from scheduler.core.progress import encode_progress
from scheduler.worker import EXIT_OK, Worker, WorkerSettings
from scheduler.worker.registry import JobContext, Registry
from tests.conftest import delete_queue, dump_queue, new_queue
from tests.fixtures.polling import poll
from tests.redis_server import RedisProcess


class Items(dict[Any, Any]):
    """A mapping whose items() (what the encoder reads) gives two pairs of one key."""

    def items(self) -> Any:
        return [("a", 1), ("a", 2)]


COLLIDING: dict[str, tuple[Any, str, str]] = {
    "int and str": ({1: "a", "1": "b"}, "'1'", "payload"),
    "bool and str": ({True: "a", "true": "b"}, "'true'", "payload"),
    "None and str": ({None: "a", "null": "b"}, "'null'", "payload"),
    "float and str": ({1.5: "a", "1.5": "b"}, "'1.5'", "payload"),
    "nested": ({"x": [{"ok": 1}, {2: "a", "2": "b"}]}, "'2'", "payload['x'][1]"),
    "in a tuple": ((0, {False: 1, "false": 2}), "'false'", "payload[1]"),
    "items twice": ({"y": Items()}, "'a'", "payload['y']"),
}


@pytest.mark.parametrize(("value", "key", "where"), COLLIDING.values(), ids=COLLIDING.keys())
def test_keys_written_as_one_text_are_refused(value: Any, key: str, where: str) -> None:
    with pytest.raises(InvalidPayload) as err:
        encode_json(value, "payload", 1 << 20)
    text = str(err.value)
    assert key in text and where in text and "same JSON key" in text, text


def test_non_string_keys_that_do_not_collide_are_taken() -> None:
    value = {1: "a", "b": [{2.5: None, None: 1, True: 0}], "c": ({3: 4},)}
    text = encode_json(value, "payload", 1 << 20)
    assert text == '{"1":"a","b":[{"2.5":null,"null":1,"true":0}],"c":[{"3":4}]}'


def test_progress_and_result_are_checked_too() -> None:
    with pytest.raises(InvalidPayload, match=r"progress has .*same JSON key"):
        encode_progress({1: 10, "1": 20})
    with pytest.raises(InvalidPayload, match=r"result\[0\] has .*same JSON key"):
        encode_json([{1: 10, "1": 20}], "result", 1 << 20)


CALLS = {
    "enqueue": lambda q: q.enqueue("t", {1: "a", "1": "b"}),
    "enqueue_many": lambda q: q.enqueue_many(
        [JobSpec("t", {"ok": 1}), JobSpec("t", {"n": {7: 1, "7": 2}})]
    ),
    "schedule": lambda q: q.schedule("s", "t", {None: 1, "null": 2}, every_ms=60_000),
}


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
def test_a_colliding_payload_is_refused_at_enqueue_writing_nothing(
    q: Queue, client: redis.Redis, call: Any
) -> None:
    before = dump_queue(client, q)
    with pytest.raises(InvalidPayload, match="same JSON key"):
        call(q)
    assert dump_queue(client, q) == before


registry = Registry()


@registry.task(name="kc-result")
async def colliding_result(payload: Any, ctx: JobContext) -> Any:
    return {"1": 1, 1: "lost"} if payload == "bad" else {"n": 1, 1: "kept"}


def test_a_colliding_result_parks_its_job_and_others_run(module_server: RedisProcess) -> None:
    """Before: the job was done with the result {"n": 1, "1": ...} written with two "1" keys."""
    q = new_queue(module_server.client(), "rs-")
    try:
        bad = q.enqueue("kc-result", "bad", max_attempts=3)
        good = q.enqueue("kc-result", "good", max_attempts=3)
        q.client.close()

        async def main() -> None:
            client = aredis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
            w = Worker(client, registry, WorkerSettings(queues=(q.name,), concurrency=2))
            run = asyncio.create_task(w.run(install_signals=False))
            try:
                await poll(
                    lambda: run.done() or {q.status(bad), q.status(good)} <= {"done", "dead"},
                    "both jobs to settle",
                    timeout_s=15,
                )
            finally:
                w.request_stop()
                assert await asyncio.wait_for(run, 20) == EXIT_OK
                await client.aclose()

        asyncio.run(main())
        assert q.status(good) == "done"
        assert q.result(good, timeout_s=1) == {"n": 1, "1": "kept"}
        got = q.get_job(bad)
        assert got is not None and got.state == "dead", got
        assert got.fields["last_error_type"] == "InvalidResult"
        assert "same JSON key" in got.fields["last_error"]
        assert got.attempts == 1  # never retried: it would give the same result
    finally:
        delete_queue(q.client, q)
