"""ThreadRunner.close: a handler thread busy at the close exits once its job returns. It went
back to waiting for work for `idle_s` (30 s), so an app that stops and starts an embedded worker
gathered about 150 idle threads."""

from __future__ import annotations

import threading
import time

from scheduler.worker.execution import ThreadRunner


def _sched_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sched-job"]


def test_threads_busy_at_close_exit_when_their_job_returns() -> None:
    before = set(_sched_threads())
    runner = ThreadRunner(idle_s=30.0)
    release, done = threading.Event(), threading.Event()
    ran: list[int] = []

    def job(i: int) -> None:
        release.wait(10)
        ran.append(i)
        if len(ran) == 3:
            done.set()

    for i in range(3):
        runner.submit(lambda i=i: job(i))  # type: ignore[misc]
    runner.submit(lambda: None)  # a fourth that ends at once: idle at the close
    time.sleep(0.05)
    runner.close()
    release.set()
    assert done.wait(10)
    mine = [t for t in _sched_threads() if t not in before]
    for t in mine:
        t.join(5)  # far below idle_s: they leave as their job returns
    assert [t for t in mine if t.is_alive()] == []
    assert runner.threads == 0 and sorted(ran) == [0, 1, 2]
