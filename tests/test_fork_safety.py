"""A blocking Queue across os.fork and multiprocessing's fork start method (client fork audit):
each process gets its own connections (redis-py's pool sees the new pid; direct_pool.take checks
it too), so the parent and its children, enqueueing at once, each read their own replies. These
pin the verified behaviour (they pass before and after); AsyncQueue's side is
tests/test_async_loop_guard.py."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator

import pytest
import redis

from scheduler import JobSpec, Queue
from scheduler._spawn import RedisProcess
from scheduler.core.connection import connect
from tests.redis_server import is_cluster_run

pytestmark = pytest.mark.skipif(is_cluster_run(), reason="a private single server")

_Q: Queue | None = None  # the queue a multiprocessing child inherits


@pytest.fixture
def url(module_server: RedisProcess) -> Iterator[str]:
    yield module_server.url


def _mixed(q: Queue, tag: str, n: int) -> list[object]:
    """Calls whose answers name what was asked: every wrong one."""
    wrong: list[object] = []
    for i in range(n):
        jid = f"{tag}-{i}"
        if (got := q.enqueue("t", {"i": i}, job_id=jid)) != jid:
            wrong.append((jid, got))
        if q.get_job(jid).id != jid:
            wrong.append(("get_job", jid))
        if i % 10 == 0:
            want = [f"{jid}-m{k}" for k in range(4)]
            if (
                ids := q.enqueue_many([JobSpec("t", job_id=j) for j in want], batch_size=2)
            ) != want:
                wrong.append((want, ids))
    return wrong


def _fork_each(q: Queue, tags: list[str]) -> list[int]:
    pids = []
    for tag in tags:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 3
            try:
                wrong = _mixed(q, tag, 60)
                code = 0 if wrong == [] else 2
                if wrong:
                    print(f"child {tag} read wrong replies: {wrong[:3]}", file=sys.stderr)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        pids.append(pid)
    return pids


def _exit_codes(pids: list[int]) -> list[int]:
    return [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]


@pytest.mark.parametrize("used_before", [True, False])
def test_forked_children_and_their_parent_each_read_their_own_replies(
    url: str, queue_name: str, used_before: bool
) -> None:
    q = Queue(connect(url), queue_name)
    if used_before:
        q.counts()  # the parent holds a pooled connection across the fork
    pids = _fork_each(q, [f"c{k}" for k in range(3)])
    assert _mixed(q, "p", 60) == []
    assert _exit_codes(pids) == [0, 0, 0]
    assert q.counts().due == 4 * (60 + 6 * 4)
    q.close()


def test_a_fork_while_another_thread_is_mid_call(url: str, queue_name: str) -> None:
    q = Queue(connect(url), queue_name)
    stop, wrong = threading.Event(), []

    def busy() -> None:
        i = 0
        while not stop.is_set():
            wrong.extend(_mixed(q, f"b{i}", 1))
            i += 1

    thread = threading.Thread(target=busy)
    thread.start()
    try:
        pids = _fork_each(q, [f"f{k}" for k in range(5)])
        codes = _exit_codes(pids)
    finally:
        stop.set()
        thread.join(30)
    assert codes == [0] * 5
    assert wrong == []
    q.close()


def _child_calls(k: int) -> list[object]:
    assert _Q is not None
    return _mixed(_Q, f"m{k}", 30)


def test_a_multiprocessing_fork_pool_uses_the_parents_queue(url: str, queue_name: str) -> None:
    global _Q
    _Q = Queue(connect(url), queue_name)
    _Q.counts()
    try:
        with multiprocessing.get_context("fork").Pool(3) as pool:
            assert pool.map(_child_calls, range(6)) == [[]] * 6
        assert _mixed(_Q, "parent", 20) == []
        admin = redis.Redis.from_url(url)
        # the parent's and this one (the children's end with them; the server may see the
        # last closes a moment later)
        for _ in range(100):
            if len(clients := admin.client_list()) <= 2:
                break
            time.sleep(0.1)
        admin.close()
        assert len(clients) <= 2, clients
    finally:
        _Q.close()
        _Q = None
