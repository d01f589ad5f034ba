"""A claimed job's payload decoded off the event loop when it is large. Claiming._take starts a
claim's jobs in one step of the loop, and each decoded its payload there: 100 structured 512 KB
payloads held the loop 2.8 s with no heartbeat sent, and every lease of the batch lapsed. A
payload past OFF_LOOP_CHARS, or past what is left of a claim's STEP_CHARS, is decoded as its run
starts: in its sync handler's thread, or in the loop's executor for an async handler. Its run's
timeout counts the decode (a 512 KB one: ~25 ms). A task's payload_type object is built there
too (run_async): an async handler's build ran on the loop, and a big model's validation held it
as the decode did. A small payload's decode and build stay on the loop (a hand-over costs more)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from scheduler.worker import failures
from scheduler.worker.context import JobContext
from scheduler.worker.execution import Running
from scheduler.worker.payloads import OFF_LOOP, Handler, built, load_stored

T = TypeVar("T")

# Decoded at claim below this (the common case: a thread's hand-over would cost more than the
# decode); a structured 64 KiB payload is ~3 ms of json decode.
OFF_LOOP_CHARS = 64 * 1024
# The most payload text one claim's jobs decode on the loop (~25 ms structured): a batch of
# 1,000 jobs of 60 KiB was 3 s of decode in one step.
STEP_CHARS = 512 * 1024


def not_json(exc: BaseException) -> str:
    """The InvalidPayload text of a stored payload that is not JSON as enqueue writes it."""
    return f"payload is not valid JSON ({exc}); it was not decoded further"


class Undecodable(Exception):
    """A payload decoded off the loop is not JSON: parked as InvalidPayload as one refused at
    claim is (Dispatch._finish), its handler never called and no run time measured."""


class Undecoded:
    """A payload's stored text, in Running.payload until its run starts (then decoded)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def decode(self) -> Any:
        try:
            return load_stored(self.text)
        except (ValueError, RecursionError) as exc:  # never anything but JSON (a pickle)
            raise Undecodable(not_json(exc)) from None

    async def off_loop_for(self, tp: type | None) -> OffLoop:
        """Decoded, and built into `tp` (a payload_type; None: not built), in the executor."""
        return await _in_executor(self._decode_for, tp)

    def _decode_for(self, tp: type | None) -> OffLoop:
        big = OffLoop(self.decode())
        if tp is not None:
            big.build(tp)
        return big


async def _in_executor(fn: Callable[..., T], *args: Any) -> T:
    loop = asyncio.get_running_loop()
    try:
        running = loop.run_in_executor(None, fn, *args)
    except RuntimeError:  # no thread could start (a pids limit), the loop is closing:
        return fn(*args)  # done here, as before, rather than the job failed
    return await running


_UNBUILT = object()


class OffLoop:
    """A large payload decoded off the loop, and its payload_type object built there with it:
    what the task's wrapper (payloads.decoding) hands the handler, through payloads.OFF_LOOP."""

    __slots__ = ("data", "error", "value")

    def __init__(self, data: Any) -> None:
        self.data = data
        self.value: Any = _UNBUILT
        self.error: BaseException | None = None

    def build(self, tp: type) -> None:
        try:
            self.value = built(tp, self.data)
        except BaseException as exc:  # raised in the wrapper, where a build on the loop raises
            self.error = exc

    async def typed(self, tp: type, payload: Any) -> Any:
        if payload is self.data:
            if self.error is not None:
                raise self.error
            if self.value is not _UNBUILT:
                return self.value
        # Not built with the decode (an async middleware runs before the build, and may change
        # the payload, in place too): built now, of what it passes on, off the loop as well.
        return await _in_executor(built, tp, payload)


async def run_async(r: Running, payload: Undecoded) -> Any:
    """An async handler's run of a large payload: decoded in the loop's executor, built into
    the task's payload_type there too unless a middleware of its own runs between them."""
    spec = r.spec
    assert spec is not None
    bare = spec.unwrapped is None or spec.fn is spec.unwrapped  # no async middleware around it
    big = await payload.off_loop_for(spec.payload_type if bare else None)
    r.payload = big.data
    token = OFF_LOOP.set(big)
    try:
        return await spec.fn(big.data, r.ctx)
    finally:
        OFF_LOOP.reset(token)
        # A task its handler started has the context (so `big`) copied: it keeps neither.
        big.data = big.value = _UNBUILT
        big.error = None


def in_thread(
    fn: Handler,
    payload: Any,
    ctx: JobContext,
    loop: asyncio.AbstractEventLoop,
    done: Callable[[Running, Any, BaseException | None], None],
    r: Running,
) -> Callable[[], None]:
    """What a sync handler's thread runs: decode (an Undecoded payload), handler, its result's
    encoding; then done(r, result, exc) on the loop."""

    def call() -> None:
        try:
            if type(payload) is Undecoded:
                data = payload.decode()
                # Stopped while it decoded (a timeout, a lost lease, a cancel): its handler is
                # not called, as a handler asking first would not go on.
                ctx.raise_if_stopped()
            else:
                data = payload
            result = fn(data, ctx)
            if result is not None:  # here: an outsized one holds no other job's beat
                result = failures.encoded_result(result)
        except BaseException as exc:
            out: tuple[Any, BaseException | None] = (None, exc)
        else:
            out = (result, None)
        with contextlib.suppress(RuntimeError):  # the loop is gone: we exited
            loop.call_soon_threadsafe(done, r, *out)

    return call
