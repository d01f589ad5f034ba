"""The wake-up pops: a blocking pop of the queues' wake-up LISTs while the worker is idle, so an
enqueue starts its job at once. A queue a newer version stores (its claims refused with
NewerStorage) is left out of the pop: its wake-ups are for that version's workers."""

from __future__ import annotations

import asyncio
import functools

from scheduler.core.errors import NewerStorage
from scheduler.worker.core import WorkerCore
from scheduler.worker.execution import RetryDelay, wake_error
from scheduler.worker.settings import _WAKE_BLOCK_S


class Waking(WorkerCore):
    """The wake-up pops (one per queue on a cluster, one for all on one server)."""

    @functools.cached_property
    def _newer_storage(self) -> set[str]:
        """Queues whose last claim was refused with NewerStorage (the claim loop notes them)."""
        return set()

    def _note_claim(self, queue: str, exc: BaseException | None) -> None:
        """A claim of `queue` was answered (exc None) or failed with `exc`."""
        if isinstance(exc, NewerStorage):
            self._newer_storage.add(queue)
        elif exc is None:
            self._newer_storage.discard(queue)

    async def _waker_loop(self, keys: list[str]) -> None:
        backoff = RetryDelay()
        queue_of = {q.keys.wake: q.name for q in self.queues}
        # A pop that failed may have taken a token (the server ran it, its reply was lost):
        # once a pop is answered again, the claim loop claims as if woken.
        missed = False
        while not self._closed:
            await self._idle.wait()
            if self._closed:
                return
            # Before: a newer version's wake-ups were popped here and lost (this worker's
            # claim is refused), so its workers slept out their idle wait (30 s) instead.
            live = [k for k in keys if queue_of.get(k) not in self._newer_storage]
            if not live:
                await asyncio.sleep(_WAKE_BLOCK_S)  # its claims go on without a wake-up
                continue
            try:
                got = await self.client.blpop(live, timeout=_WAKE_BLOCK_S)
                if got is not None and not self._idle.is_set():
                    # we got busy meanwhile: hand the wake-up on to an idle worker
                    await self.client.lpush(got[0], "1")
                elif got is not None and queue_of.get(_text(got[0])) in self._newer_storage:
                    await self.client.lpush(got[0], "1")  # refused while this pop was out
                    got = None
            except Exception as exc:
                if self._closed:  # redis-py turns a cancelled BLPOP into a ConnectionError
                    return
                bad_key = wake_error(exc)  # a wake-up key of another type, or None
                self._loop_error("wake", bad_key or exc)
                missed = True
                if bad_key and self._idle.is_set():  # claim by polling until it is fixed
                    self._wake.set()
                await asyncio.sleep(backoff())
                continue
            backoff.reset()
            woken = [_text(got[0])] if got else []
            if missed and self._idle.is_set():
                woken, missed = keys, False
            for q in self.queues:  # a wake-up of its own ends a queue's skip
                if q.keys.wake in woken:
                    self._skip_until.pop(q.name, None)
            if woken and self._idle.is_set():
                self._wake.set()


def _text(key: bytes | str) -> str:
    return key.decode() if isinstance(key, bytes) else key
