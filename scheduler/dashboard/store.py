"""What the pages read, through the client (`Queue`), the browsing operations
(scheduler/operations/browsing.py) and the admin readers: never a job key by hand. Every read
is O(page): counts are one script call, listings are ZRANGE pages, records come by id."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from typing import Any, TypeVar

import redis
from redis.exceptions import ResponseError

from scheduler.admin.inspection import (
    discover_queues,
    existence_keys,
    server_now_ms,
)
from scheduler.client.partitioned import PartitionedQueue, read_layout
from scheduler.client.partitioned_merge import not_answering
from scheduler.client.partitioned_partial import by_node, nodes_of
from scheduler.client.queue import Queue
from scheduler.core.connection import is_cluster
from scheduler.core.errors import SchedulerError, edited_by_hand
from scheduler.core.keys import QueueKeys, check_queue_name
from scheduler.core.models import QueueCounts
from scheduler.core.partitions import Layout, meta_key
from scheduler.core.vocabulary import STOP_VERBS
from scheduler.dashboard import batch
from scheduler.dashboard.logical import PARTITION_NAME, View, stored_layout
from scheduler.dashboard.summary import queue_summary
from scheduler.dashboard.workers_read import Part, live_probe, newest_ids, pipelined, reply_of
from scheduler.operations.requests import Op

T = TypeVar("T")
DISCOVER_EVERY_S = 60.0  # the queue index (a SCAN the first time): once a minute at most
REDISCOVER_UNREACHABLE_S = 15.0  # sooner while a cluster node could not be read
QUEUE_RETRY_S = 15.0  # a cluster queue whose node did not answer: not asked again until then
MAX_CACHED = 10_000  # queue names a cache keeps: they come from URLs, so any number may come
# The workers ZSET is written by every worker (and by anyone holding the app role): read a
# bounded number of its newest entries, never all of it, per page.
WORKERS_LISTED = 200  # per queue (partition) on /workers: the newest entries paged through
WORKERS_SHOWN = 200  # entries of the workers sets a /workers page reads (workers_read.py)
WORKERS_PROBED = 20  # per queue (partition) on a job page: one pipeline for all of them


class QueueNotServed(SchedulerError):
    """A queue outside the dashboard's `queues` list: its pages and actions answer 404."""


class Store:
    """The dashboard's one connection and its per-queue clients."""

    def __init__(self, client: redis.Redis, queues: Sequence[str] = ()) -> None:
        self.client = client
        self.fixed_queues = [check_queue_name(q) for q in queues]
        self._queues: dict[str, Queue] = {}
        self._views: dict[str, View] = {}  # partitioned queues only: N is fixed at creation
        self._plain_until: dict[str, float] = {}  # not partitioned: asked again after this
        self._lock = threading.Lock()
        self._discovered: list[str] = []
        self._discovered_at: float | None = None  # never
        # Cluster nodes the last SCAN could not read ("host:port: error"): the overview says
        # their queues are missing, and the next SCAN comes sooner.
        self.unreachable: list[str] = []
        self._failed: dict[str, tuple[float, str]] = {}  # queue -> (asked again after, error)
        self._discover_lock = threading.Lock()

    def served(self, name: str) -> str:
        """`name` (a queue or one of its partitions) when this dashboard serves it: every
        queue, or only those it was started with (so a dashboard given to one team cannot
        read or act on another's queue by editing a URL); else QueueNotServed."""
        check_queue_name(name)
        if not self.fixed_queues or name in self.fixed_queues:
            return name
        m = PARTITION_NAME.match(name)
        # A partition of a listed queue (not a plain queue that is only named like one).
        owner = m.group(1) if m is not None else None
        if owner in self.fixed_queues and name in self.view(str(owner)).part_names:
            return name
        raise QueueNotServed(f"this dashboard does not serve queue {name[:100]!r}")

    def queue(self, name: str) -> Queue:
        """The client of queue `name` (raises BadArgument for an invalid name, QueueNotServed
        for one outside the list)."""
        self.served(name)
        with self._lock:
            q = self._queues.get(name)
            if q is None:
                if len(self._queues) >= MAX_CACHED:  # names come from URLs: keep it bounded
                    self._queues.clear()
                q = self._queues[name] = Queue(self.client, name)
            return q

    def now_ms(self, name: str | None = None) -> int:
        """The server's clock (one TIME; on a cluster, of the node holding queue `name`):
        for pages that need the time and not the counts script."""
        return server_now_ms(self.client, QueueKeys(check_queue_name(name)) if name else None)

    def views_ahead(self, names: Sequence[str]) -> None:
        """Ask whether each of `names` not known yet is partitioned in one pipeline a node
        (GET of its layout record, as view() asks one queue at a time: 200 round trips the
        first page of 200 queues, and again each minute). A record unreadable or not read is
        left to view(), which says why."""
        now = time.monotonic()
        asked = [self.queue(n) for n in names
                 if n not in self._views and self._plain_until.get(n, 0.0) <= now]  # fmt: skip
        for idx in by_node(nodes_of(self.client, asked)):
            pipe = self.client.pipeline(transaction=False)
            for i in idx:
                pipe.get(meta_key(asked[i].name))
            try:
                got = pipe.execute(raise_on_error=False)
            except Exception:  # its node does not answer: view() asks, and says so
                continue
            if len(self._plain_until) + len(idx) >= MAX_CACHED:  # names come from URLs
                self._plain_until.clear()
            until = time.monotonic() + DISCOVER_EVERY_S
            plain = [asked[i].name for i, r in zip(idx, got, strict=True) if r is None]
            self._plain_until.update(dict.fromkeys(plain, until))
            for i, raw in zip(idx, got, strict=True):
                if isinstance(raw, str):  # bytes: a client that does not decode, view() reads
                    with contextlib.suppress(SchedulerError):  # view() names it
                        self._partitioned(asked[i].name, Layout.parse(asked[i].name, raw))

    def view(self, name: str) -> View:
        """Queue `name` as the pages show it: a partitioned queue's partitions merged (its
        stored layout is one GET, remembered once found), else the plain queue."""
        self.served(name)
        found = self._views.get(name)
        if found is not None:
            return found
        plain = View(name, [self.queue(name)], self.run)
        if self._plain_until.get(name, 0.0) > time.monotonic():
            return plain
        layout = stored_layout(self.client, name)  # UnreadableRecord: edited by hand
        if layout is None:
            # A queue that exists cannot become partitioned (PartitionedQueue.create refuses),
            # so the answer is kept a minute, not asked on every read of a page.
            if len(self._plain_until) >= MAX_CACHED:  # names come from URLs: keep it bounded
                self._plain_until.clear()
            self._plain_until[name] = time.monotonic() + DISCOVER_EVERY_S
            return plain
        return self._partitioned(name, layout)

    def _partitioned(self, name: str, layout: Layout) -> View:
        pq = PartitionedQueue(self.client, layout)
        view = View(name, pq.parts, self.run, pq)
        with self._lock:
            self._views[name] = view
        return view

    def _logical(self, names: list[str]) -> list[str]:
        """Discovered names with each partition `<q>.p<k>` replaced by its logical queue `q`
        (when `q`'s stored layout lists it): one queue row per partitioned queue."""
        out: dict[str, None] = {}
        layouts: dict[str, Layout | None] = {}
        for name in names:
            m = PARTITION_NAME.match(name)
            logical = m.group(1) if m else None
            if logical is not None and logical not in layouts:
                try:
                    layouts[logical] = read_layout(self.client, logical)
                except Exception:  # an unreadable record: the partitions stay plain queues
                    layouts[logical] = None
            layout = layouts.get(logical) if logical is not None else None
            grouped = logical is not None and layout is not None and name in layout.names
            out[logical if grouped and logical is not None else name] = None
        return sorted(out)

    def queue_names(self) -> list[str]:
        """The configured queues, else those found by SCAN. The SCAN walks the whole keyspace,
        so only the very first request waits for it; later, a stale list (older than
        DISCOVER_EVERY_S) is returned at once and refreshed in a background thread."""
        if self.fixed_queues:
            return list(self.fixed_queues)
        if self._discovered_at is None:
            with self._discover_lock:
                if self._discovered_at is None:
                    self._discover()
        elif time.monotonic() - self._discovered_at >= (
            REDISCOVER_UNREACHABLE_S if self.unreachable else DISCOVER_EVERY_S
        ) and self._discover_lock.acquire(blocking=False):
            threading.Thread(target=self._discover_in_background, daemon=True).start()
        return list(self._discovered)

    def failed(self, name: str, exc: Exception) -> None:
        """A read of cluster queue `name` met a node that does not answer (on one server the
        page is a 503 and the next request asks again)."""
        if is_cluster(self.client):
            self._failed[name] = (time.monotonic() + QUEUE_RETRY_S, str(exc))

    def failed_recently(self, name: str) -> str | None:
        """The error of `name`'s last read while within QUEUE_RETRY_S of it, else None."""
        until_s, error = self._failed.get(name, (0.0, ""))
        if until_s <= time.monotonic():
            self._failed.pop(name, None)
            return None
        return error

    def _discover(self) -> None:
        unreachable: list[str] = []
        self._discovered = self._logical(discover_queues(self.client, unreachable))
        self.unreachable = unreachable
        self._discovered_at = time.monotonic()

    def _discover_in_background(self) -> None:
        try:
            self._discover()
        except Exception:  # Redis unavailable: the old list stays, the next request retries
            self._discovered_at = time.monotonic() - DISCOVER_EVERY_S / 2
        finally:
            self._discover_lock.release()

    def run(self, q: Queue, op: Op[T]) -> T:
        """Drive one operation on the queue's connection: Queue's own driver loop."""
        return q._run(op)

    def counts(self, name: str) -> tuple[QueueCounts, list[str]]:
        """(queue `name`'s counts, the partitions left out: see View.counts_and_paused)."""
        found: tuple[QueueCounts, list[str]] | None = batch.take("counts", name)
        if found is not None:  # read with the page's other queues (batch.py)
            return found
        c, _, unread = self.view(name).counts_and_paused()
        return c, unread

    def known(self, name: str) -> bool:
        """Queue `name` is one the pages list, a partitioned queue, or has keys (its sets,
        workers, schedules, a recent stats minute, its config): an action that would create
        its first key (a pause) is refused on any other name, most likely a typo in a URL."""
        if self.view(name).partitioned or name in self.queue_names():
            return True
        keys = QueueKeys(name)
        names = existence_keys(keys, self.now_ms(name))  # one slot: one EXISTS
        return int(self.client.exists(*names)) > 0

    def queue_summary(self, name: str, minutes: int = 60) -> dict[str, Any]:
        """Counts, per-minute outcomes and start lateness of queue `name` (summary.py)."""
        found: dict[str, Any] | None = batch.take("summary", name) if minutes == 60 else None
        return found if found is not None else queue_summary(self.view(name), minutes)

    def live_workers(self, name: str) -> tuple[int, int]:
        """(live workers, those of them that still claim: not quiet or stopping) among each
        partition's WORKERS_PROBED most recently seen, whatever the size of the workers ZSET,
        each once (a worker of a partitioned queue beats on every partition): a ZRANGE of each
        partition in one pipeline a node, then an EXISTS and an HGET of `stopping` of each id
        (a worker from before operator stops writes no `stopping`: it claims). A live worker
        beats every few seconds, so it is among the newest. A partition whose node does not
        answer is left out while another answers (one down gave the page of a live one's job
        503). (-1, -1) (not known) when a workers set is edited by hand into another type."""
        parts = [Part(q) for q in self.view(name).parts]
        got = pipelined(
            self.client, parts, [newest_ids(p.q.keys.workers, WORKERS_PROBED) for p in parts]
        )
        asked: list[tuple[Part, list[str]]] = []
        failed: list[BaseException] = []
        for p, reply in zip(parts, got, strict=True):
            try:
                asked.append((p, [str(w) for w, _ in (reply_of(reply) or [[]])[0]]))
            except Exception as exc:  # a node down, or refusing for now (its slot moving)
                if isinstance(exc, ResponseError) and edited_by_hand(exc):
                    return -1, -1  # its workers set edited by hand: not known (nothing said)
                if not not_answering(exc):
                    raise
                failed.append(exc)
        if len(failed) == len(parts):  # none answered: the app's 503
            raise failed[0]
        got = pipelined(
            self.client, [p for p, _ in asked], [live_probe(p, ids) for p, ids in asked]
        )
        live: set[str] = set()
        claiming: set[str] = set()
        for (_, ids), reply in zip(asked, got, strict=True):
            try:
                found = reply_of(
                    reply if isinstance(reply, BaseException) else [*map(_hand, reply)]
                )
            except Exception as exc:
                if not not_answering(exc):
                    raise
                failed.append(exc)
                continue
            alive = [(w, s) for w, n, s in zip(ids, found[::2], found[1::2], strict=True) if n]
            live.update(w for w, _ in alive)
            claiming.update(w for w, s in alive if s not in STOP_VERBS)
        if len(failed) == len(parts):
            raise failed[0]
        return len(live), len(claiming)


def _hand(reply: Any) -> Any:
    """HGET's WRONGTYPE (a presence hash edited into another type): claiming, as far as known."""
    return "" if isinstance(reply, ResponseError) and edited_by_hand(reply) else reply
