"""docs/guide/manual.md's runnable example runs as written against a real Redis, and the guide
is in the site's nav and linked from the README."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from scheduler import Queue
from tests.conftest import delete_queue

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs/guide/manual.md"


def _example() -> str:
    text = GUIDE.read_text()
    section = text.split("## A runnable example", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "no python block under '## A runnable example'"
    return match.group(1)


@pytest.fixture
def demo_queue(client: redis.Redis) -> Iterator[Queue]:
    queue = Queue(client, "manual-demo")
    delete_queue(client, queue)
    yield queue
    delete_queue(client, queue)


def test_the_manual_example_runs(
    redis_url: str, demo_queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    ns: dict[str, object] = {"__name__": "manual_example"}
    exec(compile(_example(), str(GUIDE), "exec"), ns)  # its own asserts check each step
    # It ran against this Redis, to its end: the fenced job is done, nothing is left waiting.
    assert demo_queue.status(str(ns["job_id"])) == "done"
    counts = demo_queue.counts()
    assert (counts.due, counts.scheduled, counts.leased, counts.dead) == (0, 0, 0, 0)


def test_the_manual_guide_is_in_the_nav_and_the_readme() -> None:
    assert "guide/manual.md" in (ROOT / "mkdocs.yml").read_text()
    assert "docs/guide/manual.md" in (ROOT / "README.md").read_text()
