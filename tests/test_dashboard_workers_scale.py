"""/workers with many workers (a real private redis-server, Starlette's TestClient): it read
every workers-set entry (up to WORKERS_LISTED) of every queue of the page, a presence hash and a
stop request each: 200 queues of 200 workers were 80,000 commands and 40,000 rows a request.
Now a page reads the presence of WORKERS_SHOWN entries (?from= pages through the rest, as
?offset= pages the queues), each queue's share once, a partitioned queue's workers once."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
import redis
from starlette.testclient import TestClient

from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import connect
from scheduler.core.keys import QueueKeys
from scheduler.dashboard import Auth, create_app
from scheduler.dashboard.store import WORKERS_SHOWN
from tests.redis_server import RedisProcess

QUEUES = ("wq-a", "wq-b", "wq-c")
PER_QUEUE = 150  # 3 x 150 > WORKERS_SHOWN: the workers take three pages


def register(client: redis.Redis, queue: str, ids: list[str], live: bool = True) -> None:
    """Entries and presence hashes as lua/worker_beat.lua writes them, newest first in `ids`."""
    keys, now_ms = QueueKeys(queue), int(time.time() * 1000)
    pipe = client.pipeline(transaction=False)
    for i, wid in enumerate(ids):
        pipe.zadd(keys.workers, {wid: now_ms - i})
        if live:
            pipe.hset(
                keys.worker(wid),
                mapping={
                    "host": "h",
                    "pid": str(i),
                    "queues": queue,
                    "last_heartbeat_ms": str(now_ms - i),
                    "in_flight": "0",
                    "concurrency": "1",
                },
            )
            pipe.pexpire(keys.worker(wid), 600_000)
    pipe.execute()


def rows(html: str) -> list[tuple[str, str]]:
    """(worker id, queue) of each row."""
    return re.findall(
        r'<tr data-worker="([^"]*)"><td class="mono">[^<]*</td><td class="txt">([^<]*)</td>', html
    )


def calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0))


@pytest.fixture
def private(module_server: RedisProcess) -> Iterator[redis.Redis]:
    """A client of the module's private server, flushed: its command counts are the page's."""
    c = connect(module_server.url)
    c.flushall()
    yield c
    c.close()


@pytest.fixture
def web(private: redis.Redis) -> Iterator[TestClient]:
    for n, queue in enumerate(QUEUES):
        register(private, queue, [f"{queue}-w{i:03d}" for i in range(PER_QUEUE)])
        register(private, queue, [f"{queue}-stopped-{n}"], live=False)  # newest; its hash gone
    with TestClient(create_app(client=private, auth=Auth())) as t:
        yield t


def test_a_page_reads_the_presence_of_its_own_entries_only(
    web: TestClient, private: redis.Redis
) -> None:
    web.get("/api/overview")  # the queue discovery: not this page's reads
    private.config_resetstat()
    page = web.get("/workers")
    assert page.status_code == 200
    # Its entries: wq-a's 151 and wq-b's first 49, each queue's newest a stopped worker's.
    assert len(rows(page.text)) == WORKERS_SHOWN - 2
    # Before: every entry of every queue, 3 x 151 HGETALL and GET.
    assert calls(private, "hgetall") == WORKERS_SHOWN
    assert calls(private, "get") == WORKERS_SHOWN
    note = re.search(r'<p class="hint" id="workers-page">(.*?)</p>', page.text, re.S)
    assert note is not None, "no note saying the list is paged"
    total = len(QUEUES) * (PER_QUEUE + 1)
    assert f"Entries 1-{WORKERS_SHOWN} of {total}" in note.group(1)
    assert f'href="/workers?offset=0&amp;from={WORKERS_SHOWN}"' in note.group(1)
    assert 'id="workers-prev"' not in note.group(1)


def test_the_pages_list_every_live_worker_once_and_no_stopped_one(web: TestClient) -> None:
    seen: list[tuple[str, str]] = []
    start, pages = 0, 0
    while True:
        page = web.get(f"/workers?from={start}")
        assert page.status_code == 200
        seen += rows(page.text)
        pages += 1
        if 'id="workers-next"' not in page.text:
            break
        assert pages < 10, "the next link never ends"
        start += WORKERS_SHOWN
        assert 'id="workers-prev"' in web.get(f"/workers?from={start}").text
    want = [(f"{q}-w{i:03d}", q) for q in QUEUES for i in range(PER_QUEUE)]
    assert sorted(seen) == sorted(want)  # each once, in some page; none stopped
    assert pages == 3  # 453 entries, 200 a page
    assert seen[:PER_QUEUE] == want[:PER_QUEUE]  # queue by name, newest first


def test_a_partitioned_queue_lists_a_worker_of_every_partition_once(
    private: redis.Redis,
) -> None:
    pq = PartitionedQueue.create(private, "wq-split", partitions=3)
    everywhere = [f"all-{i}" for i in range(5)]
    for part in pq.parts:
        register(private, part.name, everywhere)
    register(private, pq.parts[2].name, ["only-p2"])
    with TestClient(create_app(client=private, auth=Auth())) as web:
        page = web.get("/workers")
    assert page.status_code == 200
    ids = [wid for wid, _ in rows(page.text)]
    assert sorted(ids) == sorted([*everywhere, "only-p2"])
