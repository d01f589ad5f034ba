"""Dead-letter read paths (operations/dead_letters.py, cli/dead.py): what they send, counted
with a client that records every command and every round trip on a private server; a scan
that never returns an id twice while jobs die between its pages."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import hiredis
import pytest
import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.cli import dead as dead_cli
from scheduler.cli.main import main
from scheduler.core.scripts import Scripts
from scheduler.operations.dead_letters import scored_pairs
from scheduler.operations.requests import Commands, Op
from tests.conftest import delete_queue
from tests.redis_server import RedisProcess

_HANDSHAKE = {"CLIENT", "HELLO", "SELECT", "AUTH", "PING"}
SHA = Scripts().sha
TEST_SHA = Scripts(clock="test").sha


class Counter:
    """What a counting client sent: each command's arguments, and its round trips (a pipeline
    is one)."""

    def __init__(self) -> None:
        self.cmds: list[tuple[Any, ...]] = []
        self.trips = 0

    def reset(self) -> None:
        self.cmds.clear()
        self.trips = 0

    def named(self, name: str) -> list[tuple[Any, ...]]:
        return [c for c in self.cmds if str(c[0]).upper() == name]

    def scripts(self, name: str) -> int:
        """How many EVALSHA calls ran the script `name` (either clock)."""
        shas = {SHA[name], TEST_SHA[name]}
        return sum(1 for c in self.named("EVALSHA") if c[1] in shas)

    def matched(self) -> list[str]:
        """The ids sent to dead_match (the filter's reads): EVALSHA sha 5 <KEYS> task error ids."""
        shas = {SHA["dead_match"], TEST_SHA["dead_match"]}
        return [i for c in self.named("EVALSHA") if c[1] in shas for i in c[10:]]


def counting_client(url: str) -> tuple[redis.Redis, Counter]:
    """A client whose connections record every command as sent on the wire (parsed back from
    the packed bytes, so redis-py's pipelines and the driver's direct calls, direct_io, are
    seen alike; arguments come back as text) and count a round trip per burst of writes
    sent with no reply outstanding."""
    client = redis.Redis.from_url(url, decode_responses=True)
    counter = Counter()
    base = client.connection_pool.connection_class

    class Counting(base):  # type: ignore[valid-type,misc]
        outstanding = 0  # replies not yet read

        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            chunks = [command] if isinstance(command, (bytes, str)) else list(command)
            reader = hiredis.Reader(encoding="utf-8", errors="replace")
            for chunk in chunks:
                reader.feed(chunk.encode() if isinstance(chunk, str) else bytes(chunk))
            sent: list[tuple[Any, ...]] = []
            while (item := reader.gets()) is not False:
                sent.append(tuple(item))
            mine = [c for c in sent if str(c[0]).upper() not in _HANDSHAKE]
            if mine and self.outstanding == 0:
                counter.trips += 1
            counter.cmds.extend(mine)
            self.outstanding += len(sent)
            super().send_packed_command(chunks, check_health)

        def read_response(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().read_response(*args, **kwargs)
            finally:
                self.outstanding = max(0, self.outstanding - 1)

        def disconnect(self, *args: Any, **kwargs: Any) -> None:
            self.outstanding = 0
            super().disconnect(*args, **kwargs)

    client.connection_pool.connection_class = Counting
    client.ping()
    counter.reset()
    return client, counter


@pytest.fixture
def counted(module_server: RedisProcess, queue_name: str) -> Iterator[tuple[Queue, Counter]]:
    client, counter = counting_client(module_server.url)
    q = Queue(client, queue_name, _clock="test")
    client.set(q.keys.test_clock, 1_000_000)
    q.preload()  # SCRIPT LOAD now: a NOSCRIPT re-send would count as a second call
    yield q, counter
    delete_queue(client, q)
    client.close()


def park(q: Queue, n: int, *, task: str = "t", at_ms: int | None = None) -> list[str]:
    """`n` jobs dead-lettered (max_attempts=1, failed) at the test clock `at_ms`."""
    if at_ms is not None:
        q.client.set(q.keys.test_clock, at_ms)
    ids = [q.enqueue(task, None, max_attempts=1) for _ in range(n)]
    got: list[Any] = []
    while len(got) < n:
        got += q.claim("w", limit=min(n - len(got), 1000)).jobs
    for job in got:
        assert q.fail(job.id, job.token, ValueError("x")).status == "dead"
    return ids


def test_dead_ids_converts_once_and_cuts_the_age_by_the_score(
    counted: tuple[Queue, Counter],
) -> None:
    q, c = counted
    old = park(q, 120, at_ms=1_000_000)
    new = park(q, 130, at_ms=2_000_000)
    q.client.set(q.keys.test_clock, 2_500_000)
    c.reset()
    got = q._run(q.ops.dead_ids(older_than_ms=1_000_000, page=50))
    assert sorted(got) == sorted(old)
    # One conversion check (with the clock, in one pipeline), then 3 pages of 50: no per-page
    # re-check, no job record read for the age.
    assert c.scripts("dead_migrate") == 1 and c.scripts("counts") == 1
    assert c.named("HMGET") == [] and c.trips == 1 + 3
    c.reset()
    assert q._run(q.ops.dead_ids(page=50)) == sorted(old + new, key=lambda i: (
        1 if i in old else 2, i), reverse=True)  # fmt: skip
    # 5 pages: after the first each starts _SLACK entries early (ids of the cursor's ms may
    # leave between pages) and one shorter than asked ends the scan.
    assert c.scripts("dead_migrate") == 1 and c.scripts("counts") == 0 and c.trips == 1 + 5


def test_filters_read_the_records_of_the_aged_ids_only(counted: tuple[Queue, Counter]) -> None:
    q, c = counted
    old = park(q, 40, task="a", at_ms=1_000_000) + park(q, 40, task="b", at_ms=1_000_000)
    park(q, 200, task="a", at_ms=3_000_000)
    c.reset()
    got = q._run(q.ops.dead_ids(task="a", older_than_ms=1_000_000, page=1000))
    assert sorted(got) == sorted(old[:40])
    # The 80 old enough are matched (one dead_match call), not the 200 younger ones.
    assert len(c.matched()) == 80 and c.scripts("dead_match") == 1 and not c.named("HMGET")


def drive_killing(q: Queue, op: Op[Any], between: Callable[[], None]) -> Any:
    """Queue's driver loop, calling `between` after each dead-ZSET page it read."""
    try:
        req = next(op)
        while True:
            reply = q._execute(req)
            if isinstance(req, Commands) and any(
                c[:2] == ("ZRANGE", q.keys.dead) for c in req.cmds
            ):
                between()
            req = op.send(reply)
    except StopIteration as done:
        return done.value


@pytest.mark.parametrize("same_ms", [False, True], ids=["later", "same-ms"])
def test_a_scan_never_repeats_an_id_while_jobs_die_between_pages(
    counted: tuple[Queue, Counter], same_ms: bool
) -> None:
    """Jobs that die between two pages (newest first: at the top, so every offset moves)
    never make an id come back; every id dead at the start is returned. `same_ms`: they die
    at the very ms of the scan's cursor, with ids that sort above it."""
    q, _ = counted
    at = 1_000_000
    before = park(q, 95, at_ms=at)
    victims = [q.enqueue("t", None, max_attempts=1, job_id=f"zz-{n:03}") for n in range(10)]
    leases = iter(q.claim("w", limit=10).jobs)
    clock = iter(range(at + 1, at + 100))

    def kill_one() -> None:
        if not same_ms:
            q.client.set(q.keys.test_clock, next(clock))
        job = next(leases, None)
        if job is not None:
            assert q.fail(job.id, job.token, ValueError("x")).status == "dead"

    got = drive_killing(q, q.ops.dead_ids(page=10), kill_one)
    assert len(got) == len(set(got)), [i for i in got if got.count(i) > 1]
    assert set(before) <= set(got) <= set(before) | set(victims)


@pytest.mark.parametrize("how", ["requeue", "purge"])
def test_a_scan_skips_nothing_when_a_returned_id_of_the_cursors_ms_leaves(
    counted: tuple[Queue, Counter], how: str
) -> None:
    """Review of 651a398: 30 jobs dead at one ms, pages of 10; after each page an operator
    requeues (or purges) an id the scan already returned. The page offset counted that id,
    so the next page started one too far and a job dead all along was never returned."""
    q, _ = counted
    still_dead = park(q, 30, at_ms=1_000_000)
    returned: list[str] = []
    op = q.ops.dead_ids(page=10)
    try:
        req = next(op)
        while True:
            reply = q._execute(req)
            pages = []
            if isinstance(req, Commands):
                pages = [rep for cmd, rep in zip(req.cmds, reply, strict=True)
                         if cmd[:2] == ("ZRANGE", q.keys.dead)]  # fmt: skip
            for rep in pages:
                returned.extend(i for _, i in scored_pairs(rep))
            if pages and returned:
                victim = returned[0] if returned[0] in still_dead else None
                victim = victim or next((i for i in returned if i in still_dead), None)
                if victim is not None:
                    getattr(q, f"{how}_dead")([victim])
                    still_dead.remove(victim)
            req = op.send(reply)
    except StopIteration as done:
        got = done.value
    assert len(got) == len(set(got))
    assert set(still_dead) <= set(got)  # every id dead the whole time was returned


# -- scheduler dead list ---------------------------------------------------------------------
def dead_cmd(monkeypatch: pytest.MonkeyPatch, q: Queue, *args: str) -> dict[str, Any]:
    """`scheduler dead <args>` on the counting client."""
    monkeypatch.setattr(dead_cli, "connect", lambda _url: q.client)
    result = CliRunner().invoke(
        main, ["dead", *args, "-q", q.name, "--url", "redis://unused", "--json"]
    )
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def list_dead(monkeypatch: pytest.MonkeyPatch, q: Queue, *args: str) -> dict[str, Any]:
    return dead_cmd(monkeypatch, q, "list", *args)


def dead_ids_read(c: Counter, dead_key: str) -> int:
    """How many dead-ZSET entries the commands asked for (ZRANGE ... LIMIT off n), plus the
    job records read one by one."""
    n = 0
    for cmd in c.named("ZRANGE"):
        if cmd[1] == dead_key:
            parts = [str(a).upper() for a in cmd]
            n += int(cmd[parts.index("LIMIT") + 2]) if "LIMIT" in parts else int(cmd[3]) + 1
    return n


def test_dead_list_reads_only_the_page_it_prints(
    counted: tuple[Queue, Counter], monkeypatch: pytest.MonkeyPatch
) -> None:
    q, c = counted
    ids = park(q, 300, task="a", at_ms=1_000_000)
    newest = sorted(ids, reverse=True)
    c.reset()
    out = list_dead(monkeypatch, q, "--limit", "5")
    assert [j["id"] for j in out["jobs"]] == newest[:5] and out["total"] == 300
    assert dead_ids_read(c, q.keys.dead) <= 5 and len(c.named("HMGET")) == 0
    assert len(c.named("HGETALL")) + len(c.named("HMGET")) <= 5 * 2  # the printed records
    c.reset()
    out = list_dead(monkeypatch, q, "--offset", "10", "--limit", "5", "--task", "a")
    assert [j["id"] for j in out["jobs"]] == newest[10:15] and out["more"]
    assert dead_ids_read(c, q.keys.dead) <= 100 and len(c.named("HMGET")) <= 100


def test_an_id_given_is_checked_alone_not_by_a_scan(
    counted: tuple[Queue, Counter], monkeypatch: pytest.MonkeyPatch
) -> None:
    q, c = counted
    ids = park(q, 300, task="a", at_ms=1_000_000)
    c.reset()
    out = dead_cmd(monkeypatch, q, "requeue", "--id", ids[7], "--task", "a", "--yes")
    assert (out["matched"], out["done"]) == (1, 1) and q.get_job(ids[7]).state != "dead"
    assert dead_ids_read(c, q.keys.dead) == 0 and c.matched() == [ids[7]]
    assert q.counts().dead == 299


def test_retention_counts_the_jobs_beyond_an_age_without_a_scan(
    counted: tuple[Queue, Counter],
) -> None:
    from scheduler.cli.dead_retention import beyond

    q, c = counted
    park(q, 30, at_ms=1_000_000)
    park(q, 20, at_ms=9_000_000)
    q.client.set(q.keys.test_clock, 10_000_000)
    c.reset()
    assert beyond(q, (5_000_000, None), 50) == 30
    assert dead_ids_read(c, q.keys.dead) == 0 and len(c.named("ZCOUNT")) == 1
