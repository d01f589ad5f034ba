"""The reason shown for a job of a concurrency key that is held while its key has room: it waits
its turn behind a held job of the key placed before it (by run time less a priority part,
lib/flow.lua flow_admit: it may be newer), and its reason says so, 'waiting behind job <id> of
key <k> (<live> of <K> leased)'. Before, it read 'limited by key <k> (<K> leased)', as if the
key's K slots were all leased, through every view: the job's `flow_reason` (Queue.get_job,
list_jobs('held')), `scheduler jobs show` and the dashboard's job page. A job held because its
key is full keeps the key-limit reason."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner
from starlette.testclient import TestClient

from scheduler import JobState, Queue
from scheduler.cli.main import main
from scheduler.dashboard import Auth, create_app
from tests.conftest import FLOW_T0 as T0
from tests.conftest import Clock

LEASE_MS = 60_000


def _held_behind(q: Queue, clock: Clock) -> tuple[str, str, str]:
    """Key k busy with one lease of limit 1; x (limit 1) held because k is full for it; y
    (limit 3, enqueued after x) held behind x although k has room for y's limit."""
    a = q.enqueue("t", "a", concurrency_key="k", concurrency_limit=1)
    assert [j.id for j in q.claim("w", limit=10, lease_ms=LEASE_MS).jobs] == [a]
    x = q.enqueue("t", "x", concurrency_key="k", concurrency_limit=1)
    assert q.claim("w", limit=10, lease_ms=LEASE_MS).jobs == []
    clock.set_ms(T0 + 1)
    y = q.enqueue("t", "y", concurrency_key="k", concurrency_limit=3)
    assert q.claim("w", limit=10, lease_ms=LEASE_MS).jobs == []  # 1 of 3 leased: held behind x
    return a, x, y


def test_a_job_held_behind_an_older_one_of_its_key_says_so(fq: tuple[Queue, Clock]) -> None:
    q, clock = fq
    a, x, y = _held_behind(q, clock)
    assert q.status(y) == JobState.HELD
    reason = q.get_job(y).fields["flow_reason"]
    assert reason == f"waiting behind job {x} of key k (1 of 3 leased)"
    assert "limited" not in reason
    # x is held because k is full for its limit of 1: that reason stays.
    assert q.get_job(x).fields["flow_reason"] == "limited by key k (1 leased)"
    held = {j.id: j.fields.get("flow_reason") for j in q.list_jobs("held")}
    assert held == {x: "limited by key k (1 leased)", y: reason}
    # What it says is what happens: x goes first when a's lease ends, then y.
    q.complete(a, q.get_job(a).token or "", None)
    [got] = q.claim("w", limit=10, lease_ms=LEASE_MS).jobs
    assert got.id == x
    q.complete(x, got.token, None)
    assert [j.id for j in q.claim("w", limit=10, lease_ms=LEASE_MS).jobs] == [y]
    assert "flow_reason" not in q.get_job(y).fields


def test_jobs_show_gives_the_reason(redis_url: str, fq: tuple[Queue, Clock]) -> None:
    q, clock = fq
    _, x, y = _held_behind(q, clock)
    runner = CliRunner(env={"COLUMNS": "250"})
    got = runner.invoke(main, ["jobs", "show", "--json", "-q", q.name, y, "--url", redis_url])
    assert got.exit_code == 0, got.output
    data = json.loads(got.stdout)
    assert data["state"] == "held"
    assert data["flow"] == f"waiting behind job {x} of key k (1 of 3 leased)"
    human = runner.invoke(main, ["jobs", "show", "-q", q.name, y, "--url", redis_url])
    assert human.exit_code == 0, human.output
    assert f"waiting behind job {x} of key k" in human.stdout
    assert "limited by key" not in human.stdout


@pytest.fixture
def web(client: redis.Redis, fq: tuple[Queue, Clock]) -> Iterator[TestClient]:
    with TestClient(create_app(client=client, queues=[fq[0].name], auth=Auth())) as t:
        yield t


def test_the_job_page_says_the_key_has_room(fq: tuple[Queue, Clock], web: TestClient) -> None:
    q, clock = fq
    _, x, y = _held_behind(q, clock)
    page = web.get(f"/queues/{q.name}/jobs/{y}").text
    assert 'data-reason="behind-older-in-key"' in page
    assert f"waiting behind job {x} of key k: the key had room (1 of 3 leased" in page
    assert 'data-reason="limited-by-key"' not in page
    assert "slots are leased" not in page
    page_x = web.get(f"/queues/{q.name}/jobs/{x}").text
    assert 'data-reason="limited-by-key"' in page_x


def test_a_job_of_a_full_key_with_older_held_jobs_is_limited_by_the_key(
    fq: tuple[Queue, Clock],
) -> None:
    """Both hold it (the key is full, and x is older): the full key is the reason, as it would
    be with no older job, not 'waiting behind' as if the key had room."""
    q, clock = fq
    _held_behind(q, clock)
    clock.set_ms(T0 + 2)
    z = q.enqueue("t", "z", concurrency_key="k", concurrency_limit=1)
    assert q.claim("w", limit=10, lease_ms=LEASE_MS).jobs == []
    assert q.get_job(z).fields["flow_reason"] == "limited by key k (1 leased)"


def test_the_reason_does_not_call_a_newer_job_ahead_older(fq: tuple[Queue, Clock]) -> None:
    """The key's held jobs are ordered by place: a newer job of higher priority goes ahead of
    an older one. Before, the reason called it 'older job'."""
    q, clock = fq
    a = q.enqueue("t", "a", concurrency_key="k", concurrency_limit=1)
    assert [j.id for j in q.claim("w", limit=10, lease_ms=LEASE_MS).jobs] == [a]
    old = q.enqueue("t", "old", concurrency_key="k", concurrency_limit=3, delay_ms=5_000)
    clock.set_ms(T0 + 1)
    new = q.enqueue("t", "new", concurrency_key="k", concurrency_limit=1, priority=9)
    assert q.claim("w", limit=10, lease_ms=LEASE_MS).jobs == []  # new: held, k is full for it
    clock.set_ms(T0 + 5_000)
    assert q.claim("w", limit=10, lease_ms=LEASE_MS).jobs == []  # old: held behind new
    reason = q.get_job(old).fields["flow_reason"]
    assert reason == f"waiting behind job {new} of key k (1 of 3 leased)"
    assert "older" not in reason


@pytest.mark.parametrize("older", ["older ", ""])
def test_the_job_page_reads_the_reason_of_either_version(
    client: redis.Redis, fq: tuple[Queue, Clock], web: TestClient, older: str
) -> None:
    """A job held by the previous version keeps its stored reason ('waiting behind older job',
    a rolling deploy): the job page reads it as it reads this version's."""
    q, clock = fq
    _, x, y = _held_behind(q, clock)
    client.hset(
        q.keys.job(y), "flow_reason", f"waiting behind {older}job {x} of key k (1 of 3 leased)"
    )
    page = web.get(f"/queues/{q.name}/jobs/{y}").text
    assert 'data-reason="behind-older-in-key"' in page
    assert f"waiting behind job {x} of key k: the key had room (1 of 3 leased" in page
    assert "held by flow control:" not in page
