"""The wake-up pops: a blocking pop of the queues' wake-up LISTs while the worker is idle, so an
enqueue starts its job at once. A queue a newer version stores (its claims refused with
NewerStorage) is left out of the pop: its wake-ups are for that version's workers."""

from __future__ import annotations

import asyncio
import functools
from collections import Counter

from scheduler.client.result_waiting import block_slice_s, connection_kwargs
from scheduler.core.connection import is_cluster
from scheduler.core.errors import NewerStorage
from scheduler.worker.core import WorkerCore
from scheduler.worker.execution import RetryDelay, wake_error
from scheduler.worker.settings import _WAKE_BLOCK_S, SettingsError

# What a worker holds at once on a server (a cluster node) besides its wake-up pops there: a
# claim, a heartbeat, a report and the presence beat.
_CALLS_AT_ONCE = 4


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

    def _wake_groups(self) -> list[list[str]]:
        """The keys of each wake-up pop. One pop for every queue's wake-up key on one server: a
        pop per queue held a pooled connection each while idle, and redis-py 8's pool has 100,
        so a worker on ~100 partitions had none left for its claims and heartbeats
        (MaxConnectionsError). On a cluster the keys live in different slots: one pop per queue
        (per-node pools)."""
        if is_cluster(self.client):
            return [[q.keys.wake] for q in self.queues]
        return [[q.keys.wake for q in self.queues]]

    @functools.cached_property
    def _wake_block_s(self) -> float:
        """The pop's block: _WAKE_BLOCK_S, or half the connection's read timeout when that is
        shorter (a URL's ?socket_timeout=0.5 cut every idle pop of 1 s: a TimeoutError logged
        and counted as a Redis error); 1 ms at least: BLPOP blocks for good on 0."""
        return block_slice_s(self.client, _WAKE_BLOCK_S)

    def _check_pool(self) -> None:
        """SettingsError when the URL's pool (`max_connections`, each node's on a cluster) is
        smaller than what this worker holds at once: its heartbeats failed for want of one
        (MaxConnectionsError) and the leases of healthy jobs lapsed. After the slot map's read."""
        size = connection_kwargs(self.client).get("max_connections")
        pool = getattr(self.client, "connection_pool", None)
        size = getattr(pool, "max_connections", size)  # one server: its pool's
        if not isinstance(size, int):
            return
        pops = Counter(self._node_of(keys[0]) for keys in self._wake_groups())
        needed = max(pops.values()) + _CALLS_AT_ONCE
        if size < needed:
            raise SettingsError(
                f"max_connections={size} (the URL's, else redis-py's 100) is too small for this "
                f"worker: it holds {needed} connections at once (its wake-up pops, a claim, a "
                f"heartbeat, a report, the presence beat); give the URL max_connections={needed}"
                " or more"
            )

    async def _waker_loop(self, keys: list[str]) -> None:
        backoff = RetryDelay()
        block_s = self._wake_block_s
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
                await asyncio.sleep(block_s)  # its claims go on without a wake-up
                continue
            try:
                got = await self.client.blpop(live, timeout=block_s)
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
