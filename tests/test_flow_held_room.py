"""A job of a concurrency key held behind an older held job of its key (the key is FIFO,
lib/flow.lua) starts once the job ahead has started, when its own limit has room. Before, claim
promoted the older job and held this one, and nothing but the end of one of the key's leases
brought it back: after the older one started, it stayed held with its key's room free until the
next lease of the key ended (an hour late behind hour-long jobs). Now a lease of the key lets its
oldest held jobs whose own limit has room go back to due, oldest first (the first without room
stops it, so the key stays FIFO and the limits are kept), at most a script's promote step; and
so does the end of a lease, by the held jobs' own limits as well as by the ended job's."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from scheduler import JobSpec, JobState, Queue, Registry
from scheduler.admin.doctor import check_queue
from scheduler.worker import WorkerSettings
from tests.conftest import FLOW_T0 as T0
from tests.conftest import Clock
from tests.embedded_worker import run_until

LEASE_MS = 60_000


def _held_behind(q: Queue, clock: Clock, behind: int = 1) -> tuple[str, str, list[str]]:
    """Key k busy with a (limit 1); x (limit 1) held because k is full for it; `behind` jobs
    of limit 3, enqueued after x, held behind x although k has room for their limit."""
    a = q.enqueue("t", "a", concurrency_key="k", concurrency_limit=1)
    assert [j.id for j in q.claim("w", limit=10, lease_ms=LEASE_MS).jobs] == [a]
    x = q.enqueue("t", "x", concurrency_key="k", concurrency_limit=1)
    assert q.claim("w", limit=10, lease_ms=LEASE_MS).jobs == []
    ys = []
    for i in range(behind):
        clock.set_ms(T0 + 1 + i)
        ys.append(q.enqueue("t", f"y{i}", concurrency_key="k", concurrency_limit=3))
    assert q.claim("w", limit=10, lease_ms=LEASE_MS).jobs == []
    for y in ys:
        assert q.get_job(y).fields["flow_reason"].startswith(f"waiting behind job {x}")
    return a, x, ys


def _leased_of_k(q: Queue) -> int:
    return int(q.client.zcard(q.keys.prefix + "flow:ck:k"))


def test_a_job_held_behind_one_that_started_runs_while_its_key_has_room(
    fq: tuple[Queue, Clock],
) -> None:
    q, clock = fq
    a, x, [y] = _held_behind(q, clock)
    q.complete(a, q.get_job(a).token or "", None)
    first = [j.id for j in q.claim("w", limit=10, lease_ms=LEASE_MS).jobs]
    assert first[0] == x
    # x started: y is due again in the same call (before: held until x's lease ended).
    assert q.status(y) != JobState.HELD
    assert "flow_reason" not in q.get_job(y).fields
    started = first + [j.id for j in q.claim("w", limit=10, lease_ms=LEASE_MS).jobs]
    assert started == [x, y]  # x still runs: 2 of y's limit of 3
    assert q.status(x) == JobState.LEASED and q.status(y) == JobState.LEASED
    assert _leased_of_k(q) == 2
    assert q.client.zcard(q.keys.prefix + "flow:ckheld:k") == 0


def test_only_as_many_go_as_their_own_limit_has_room_for(fq: tuple[Queue, Clock]) -> None:
    """Three jobs of limit 3 behind x: with x running, two go and the third is held, now by
    its full key. It goes when x (limit 1) ends: 2 of its 3 slots leased. Before, an ended
    lease let back as many as the ended job's own limit had room for (1 - 2: none), and it
    waited for the end of one of the jobs of limit 3."""
    q, clock = fq
    a, x, ys = _held_behind(q, clock, behind=3)
    q.complete(a, q.get_job(a).token or "", None)
    tokens: dict[str, str] = {}
    for _ in range(3):
        tokens |= {j.id: j.token for j in q.claim("w", limit=10, lease_ms=LEASE_MS).jobs}
        assert _leased_of_k(q) <= 3
    assert sorted(tokens) == sorted([x, ys[0], ys[1]])
    assert q.status(ys[2]) == JobState.HELD
    assert q.get_job(ys[2]).fields["flow_reason"] == "limited by key k (3 leased)"
    q.complete(x, tokens[x], None)
    assert [j.id for j in q.claim("w", limit=10, lease_ms=LEASE_MS).jobs] == [ys[2]]


def test_a_head_without_room_keeps_the_key_fifo(fq: tuple[Queue, Clock]) -> None:
    """A lease of the key while its oldest held job (limit 1) has no room lets nothing by it:
    the newer job of limit 3 behind it stays held (the key drains to the old one)."""
    q, clock = fq
    z = q.enqueue("t", "z", concurrency_key="k", concurrency_limit=3)
    assert [j.id for j in q.claim("w", limit=10, lease_ms=LEASE_MS).jobs] == [z]
    x = q.enqueue("t", "x", concurrency_key="k", concurrency_limit=1)
    clock.set_ms(T0 + 1)
    y = q.enqueue("t", "y", concurrency_key="k", concurrency_limit=3)
    assert q.claim("w", limit=10, lease_ms=LEASE_MS).jobs == []
    # A job of the key due before both (its run_at older than x's) starts: a lease of k.
    w = q.enqueue("t", "w", concurrency_key="k", concurrency_limit=3,
                  run_at=datetime.fromtimestamp((T0 - 5) / 1000, UTC))  # fmt: skip
    assert [j.id for j in q.claim("w", limit=10, lease_ms=LEASE_MS).jobs] == [w]
    assert q.status(x) == JobState.HELD and q.status(y) == JobState.HELD
    assert q.claim("w", limit=10, lease_ms=LEASE_MS).jobs == []
    q.complete(z, q.get_job(z).token or "", None)
    q.complete(w, q.get_job(w).token or "", None)
    got = [j.id for j in q.claim("w", limit=10, lease_ms=LEASE_MS).jobs]
    got += [j.id for j in q.claim("w", limit=10, lease_ms=LEASE_MS).jobs]
    assert got == [x, y]


def test_one_lease_lets_at_most_a_promote_step_go(fq: tuple[Queue, Clock]) -> None:
    """1,200 jobs of limit 10,000 behind x: x's start lets at most the script's promote step
    (1,000) back into due; the rest follow at the next claims, none left held."""
    q, clock = fq
    a = q.enqueue("t", "a", concurrency_key="k", concurrency_limit=1)
    q.claim("w", limit=1, lease_ms=LEASE_MS)
    x = q.enqueue("t", "x", concurrency_key="k", concurrency_limit=1)
    clock.set_ms(T0 + 1)
    many = q.enqueue_many(
        JobSpec("t", i, concurrency_key="k", concurrency_limit=10_000) for i in range(1_200)
    )
    for _ in range(6):  # each sets aside its batch and lib/flow.lua FLOW_HOLD_BUDGET (200)
        assert q.claim("w", limit=10, lease_ms=LEASE_MS).jobs == []
    held = q.keys.prefix + "flow:ckheld:k"
    assert q.client.zcard(held) == 1_201
    q.complete(a, q.get_job(a).token or "", None)
    assert [j.id for j in q.claim("w", limit=1, lease_ms=LEASE_MS).jobs] == [x]
    left = q.client.zcard(held)
    assert 200 <= left < 1_200  # some went, not more than one step
    leased = {x}
    for _ in range(200):
        leased |= {j.id for j in q.claim("w", limit=100, lease_ms=LEASE_MS).jobs}
        if len(leased) == 1_201:
            break
    assert leased == {x, *many}
    assert q.client.zcard(held) == 0


def test_doctor_finds_nothing_after_the_job_behind_went(q: Queue, client: redis.Redis) -> None:
    """Real clock (doctor reads the server's time): the moves are the ordinary ones."""
    now = datetime.now(UTC)
    a = q.enqueue("t", "a", concurrency_key="k", concurrency_limit=1,
                  run_at=now - timedelta(seconds=3))  # fmt: skip
    assert [j.id for j in q.claim("w", limit=10).jobs] == [a]
    x = q.enqueue("t", "x", concurrency_key="k", concurrency_limit=1,
                  run_at=now - timedelta(seconds=2))  # fmt: skip
    y = q.enqueue("t", "y", concurrency_key="k", concurrency_limit=3,
                  run_at=now - timedelta(seconds=1))  # fmt: skip
    assert q.claim("w", limit=10).jobs == []
    assert check_queue(client, q.name) == []
    q.complete(a, q.get_job(a).token or "", None)
    assert [j.id for j in q.claim("w", limit=1).jobs] == [x]
    assert q.status(y) == JobState.DUE
    assert check_queue(client, q.name) == []
    assert [j.id for j in q.claim("w", limit=10).jobs] == [y]
    assert check_queue(client, q.name) == []


def test_a_worker_runs_the_job_behind_while_the_one_ahead_still_runs(
    redis_url: str, q: Queue
) -> None:
    """A real worker (concurrency 3): x (limit 1) runs until y (limit 3, held behind x) has
    started beside it. Before, y waited for x's end, and x waited for y: neither finished."""
    registry = Registry()
    release_a = threading.Event()
    y_started = threading.Event()
    ran: list[str] = []
    x_saw_y: list[bool] = []

    @registry.task("flow")
    def flow(payload: Any, ctx: Any) -> None:
        ran.append(payload)
        if payload == "a":
            release_a.wait(20)
        elif payload == "x":
            # A liveness bound: before, y waited for x's end, so x never saw it start.
            x_saw_y.append(y_started.wait(10))
        elif payload == "y":
            y_started.set()

    now = datetime.now(UTC)
    q.enqueue("flow", "a", concurrency_key="k", concurrency_limit=1,
              run_at=now - timedelta(seconds=3))  # fmt: skip
    x = q.enqueue("flow", "x", concurrency_key="k", concurrency_limit=1,
                  run_at=now - timedelta(seconds=2))  # fmt: skip
    y = q.enqueue("flow", "y", concurrency_key="k", concurrency_limit=3,
                  run_at=now - timedelta(seconds=1))  # fmt: skip

    def ready() -> bool:
        # Set a free once both are held behind it (y behind x), as _held_behind does.
        if not release_a.is_set() and q.status(x) == JobState.HELD and q.status(y) == JobState.HELD:
            release_a.set()
        return len(ran) == 3 and q.counts().leased == 0

    settings = WorkerSettings(queues=(q.name,), concurrency=3, heartbeat_ms=50, lease_ms=5_000)
    assert run_until(redis_url, registry, settings, ready, timeout_s=30)
    assert ran == ["a", "x", "y"]
    assert x_saw_y == [True]  # y started while x still ran: 2 of y's limit of 3
