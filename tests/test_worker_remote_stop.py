"""An operator's quiet / stop of a running worker (`scheduler workers quiet|stop`, the
dashboard's buttons): the request in Redis (admin/worker_stop.py), handed over by the worker's
presence beat (lua/worker_beat.lua) and acted on as its self-stop and SIGTERM are
(worker/remote_stop.py). Real worker processes for the stops; a worker's presence written by
worker_beat itself for the requests' own rules."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest
import redis
from click.testing import CliRunner
from redis.exceptions import ConnectionError as RedisConnectionError

from scheduler import Queue, Registry
from scheduler.admin.inspection import live_workers
from scheduler.admin.worker_stop import DEFAULT_STOP_TTL_MS, WorkerNotFound, ask_stop
from scheduler.cli.main import main
from scheduler.core.errors import BadArgument
from scheduler.operations.requests import Script
from scheduler.worker import EXIT_OK, Worker, WorkerSettings
from tests.workers.basic import LEDGER
from tests.workers.procs import SCHEDULER, spawn_worker, stop_all, wait_for

REMOTE = "tests.workers.remote:registry"
# A fast beat: the request is read within one (the default is 5 s).
FAST = ("--heartbeat-ms", "100", "--lease-ms", "3000")


@pytest.fixture
def until(client: redis.Redis, q: Queue) -> Iterator[str]:
    """The key that ends the `hold` jobs; the ledger goes with it."""
    key = f"test:until:{q.name}"
    yield key
    client.delete(key, f"{LEDGER}:{q.name}")


def ledger(client: redis.Redis, q: Queue) -> list[list[str]]:
    return [str(e).split("|") for e in client.lrange(f"{LEDGER}:{q.name}", 0, -1)]


def cli(url: str, *args: str, input: str | None = None) -> tuple[int, str]:
    res = CliRunner().invoke(main, [*args, "--url", url], input=input)
    return res.exit_code, res.output


def beat(q: Queue, worker: str, stopping: str = "") -> list[str]:
    """One presence beat of a worker that exists only in Redis: its reply [now_ms, request]."""
    reply = q._execute(Script("worker_beat", [worker, "30000", "beat", "h", "1", q.name, "0", "1",
                                              stopping]))  # fmt: skip
    return [str(x) for x in reply]


def requests(client: redis.Redis, q: Queue) -> dict[str, str]:
    found = client.scan_iter(match=q.keys.prefix + "worker_stop:*")
    return {k: str(client.get(k)) for k in found}


def log_of(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


# -- real workers -------------------------------------------------------------------------------
def test_stop_ends_a_busy_worker_after_its_grace_and_its_job_runs_elsewhere(
    redis_url: str, client: redis.Redis, q: Queue, until: str, tmp_path: Path
) -> None:
    job = q.enqueue("hold", {"until": until})
    log = tmp_path / "w.log"
    w = spawn_worker(redis_url, q.name, *FAST, "--grace", "0.5", "--worker-id", "busy-1",
                     registry=REMOTE, log=str(log))  # fmt: skip
    try:
        wait_for(lambda: len(ledger(client, q)) == 1, what="the job started")
        code, out = cli(redis_url, "workers", "stop", "busy-1", "-q", q.name)
        assert code == 0, out
        assert "stop requested for worker busy-1" in out
        # The job never ends by itself: only the stop's grace, then its release, ends the
        # process (the test's timeout otherwise).
        assert w.wait(60) == EXIT_OK
    finally:
        stop_all([w])
    messages = [str(e.get("msg", "")) for e in log_of(log)]
    assert any(m.startswith("stop requested (scheduler workers stop)") for m in messages)
    first = ledger(client, q)
    assert [e[3] for e in first] == ["start", "cancelled:shutdown"]
    assert q.get_job(job).state == "due"  # released, not failed: it runs again at once
    assert q.get_job(job).attempts == 0  # the release gives its attempt back
    assert requests(client, q) == {}  # read (and deleted) by the beat
    client.set(until, 1)
    other = spawn_worker(redis_url, q.name, "--burst", registry=REMOTE)
    try:
        assert other.wait(60) == EXIT_OK
    finally:
        stop_all([other])
    assert q.status(job) == "done"
    second = ledger(client, q)[len(first) :]
    assert [e[3] for e in second] == ["start", "end"]
    assert second[0][4] != first[0][4]  # another process ran it


def test_quiet_finishes_the_running_job_claims_nothing_more_then_exits(
    redis_url: str, client: redis.Redis, q: Queue, until: str, tmp_path: Path
) -> None:
    running = q.enqueue("hold", {"until": until})
    log = tmp_path / "w.log"
    w = spawn_worker(redis_url, q.name, *FAST, "--concurrency", "4", "--worker-id", "busy-2",
                     registry=REMOTE, log=str(log))  # fmt: skip
    try:
        wait_for(lambda: len(ledger(client, q)) == 1, what="the job started")
        code, out = cli(redis_url, "workers", "quiet", "busy-2", "-q", q.name)
        assert code == 0, out
        assert "quiet requested for worker busy-2" in out

        def quiet() -> bool:
            return [w.stopping for w in live_workers(client, q.keys)[0]] == ["quiet"]

        wait_for(quiet, what="the worker read the request")
        # Three free slots and a job due: a worker that claims is woken for it at once.
        later = q.enqueue("hold", {"until": until})
        code, out = cli(redis_url, "workers", "list", "-q", q.name, "--json")
        assert code == 0 and [x["stopping"] for x in json.loads(out)["workers"]] == ["quiet"]
        assert w.poll() is None  # still running, still listed: its job has not ended
        client.set(until, 1)
        assert w.wait(60) == EXIT_OK
    finally:
        stop_all([w])
    messages = [str(e.get("msg", "")) for e in log_of(log)]
    assert any(m.startswith("quiet requested (scheduler workers quiet)") for m in messages)
    assert q.status(running) == "done"  # finished, not released
    assert [e[0] for e in ledger(client, q)] == [running, running]  # start, end: `later` never
    job = q.get_job(later)
    assert (job.state, job.attempts) == ("due", 0)  # never claimed
    assert live_workers(client, q.keys)[0] == []  # it removed its presence on the way out


# -- the request's rules (a worker written by worker_beat alone) ------------------------------
def test_an_unknown_worker_is_refused_and_nothing_is_written(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    beat(q, "w-live")
    code, out = cli(redis_url, "workers", "stop", "w-live", "w-nope", "-q", q.name)
    assert code == 1
    assert "no live worker 'w-nope'" in out and "nothing asked" in out
    assert requests(client, q) == {}  # not even for the live one named with it
    with pytest.raises(WorkerNotFound, match="no live worker 'w-nope'"):
        ask_stop(client, [q.keys], "w-nope", "stop")
    code, out = cli(redis_url, "workers", "quiet", "-q", q.name)
    assert code == 2 and "or --all" in out  # neither ids nor --all
    code, out = cli(redis_url, "workers", "stop", "w-live", "--all", "-q", q.name)
    assert code == 2
    assert requests(client, q) == {}


def test_the_request_expires_and_bad_ttls_or_verbs_are_refused(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    beat(q, "w1")
    key = q.keys.worker_stop("w1")
    assert cli(redis_url, "workers", "stop", "w1", "-q", q.name, "--ttl", "0s")[0] == 2
    assert cli(redis_url, "workers", "stop", "w1", "-q", q.name, "--ttl", "2d")[0] == 2
    with pytest.raises(BadArgument, match="one of quiet, stop"):
        ask_stop(client, [q.keys], "w1", "halt")
    assert requests(client, q) == {}
    assert cli(redis_url, "workers", "stop", "w1", "-q", q.name, "--ttl", "10s")[0] == 0
    assert 0 < client.pttl(key) <= 10_000
    client.delete(key)
    assert cli(redis_url, "workers", "quiet", "w1", "-q", q.name)[0] == 0
    assert 0 < client.pttl(key) <= DEFAULT_STOP_TTL_MS
    # Expired unread (a worker that is gone): the next beat of that id hands nothing over.
    client.pexpire(key, 1)
    wait_for(lambda: client.exists(key) == 0, what="the request expired")
    assert beat(q, "w1")[1] == ""


def test_the_beat_hands_a_request_over_once_and_the_listing_shows_it(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    beat(q, "w1")
    assert ask_stop(client, [q.keys], "w1", "quiet") == "asked"
    code, out = cli(redis_url, "workers", "-q", q.name, "--json")  # the group alone lists
    assert code == 0, out
    (w,) = json.loads(out)["workers"]
    assert (w["stop_requested"], w["stopping"]) == ("quiet", None)
    assert ask_stop(client, [q.keys], "w1", "quiet") == "pending"
    assert ask_stop(client, [q.keys], "w1", "stop") == "asked"  # a stop replaces a quiet
    assert ask_stop(client, [q.keys], "w1", "quiet") == "pending"  # never the other way
    assert client.get(q.keys.worker_stop("w1")) == "stop"
    assert beat(q, "w1")[1] == "stop"
    assert beat(q, "w1", "stop")[1] == ""  # deleted once read
    (info,) = live_workers(client, q.keys)[0]
    assert (info.stopping, info.stop_requested) == ("stop", None)
    assert ask_stop(client, [q.keys], "w1", "quiet") == "already"
    assert ask_stop(client, [q.keys], "w1", "stop") == "already"
    assert requests(client, q) == {}


def test_all_asks_every_live_worker_after_a_confirmation(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    for wid in ("w1", "w2"):
        beat(q, wid)
    code, _ = cli(redis_url, "workers", "stop", "--all", "-q", q.name, input="n\n")
    assert code == 1  # declined
    assert requests(client, q) == {}
    code, out = cli(redis_url, "workers", "quiet", "--all", "-q", q.name, "--yes", "--json")
    assert code == 0, out
    got = json.loads(out)
    assert got["request"] == "quiet" and got["ttl_ms"] == DEFAULT_STOP_TTL_MS
    assert sorted((w["id"], w["outcome"]) for w in got["workers"]) == [
        ("w1", "asked"),
        ("w2", "asked"),
    ]
    assert sorted(requests(client, q).values()) == ["quiet", "quiet"]
    code, out = cli(redis_url, "workers", "list", "-q", q.name)
    assert code == 0 and out.count("quiet asked") == 2


def test_a_removed_worker_takes_its_unread_request_with_it(client: redis.Redis, q: Queue) -> None:
    """A process started later under the same id (a fixed --worker-id restarted) must not be
    stopped by a request its predecessor never read."""
    beat(q, "w1")
    ask_stop(client, [q.keys], "w1", "stop")
    q._execute(Script("worker_beat", ["w1", "30000", "remove", "h", "1", q.name, "0", "1"]))
    assert requests(client, q) == {}
    assert beat(q, "w1")[1] == ""


def test_a_request_edited_into_another_type_is_written_around(
    client: redis.Redis, q: Queue
) -> None:
    beat(q, "w1")
    client.hset(q.keys.worker_stop("w1"), "x", "1")
    assert beat(q, "w1")[1] == ""  # the beat goes on
    (info,) = live_workers(client, q.keys)[0]
    assert info.stop_requested is None


def test_the_cli_process_exit_code_of_an_unknown_worker(redis_url: str, q: Queue) -> None:
    """The installed command, not CliRunner: exit 1 and one line."""
    cmd = [SCHEDULER, "workers", "stop", "nope", "-q", q.name, "--url", redis_url]
    q.enqueue("x")  # the queue exists
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "Error: no live worker 'nope' on queue " + q.name + " (`scheduler workers` lists them): "
        "nothing asked"
    ]


def test_a_request_read_is_acted_on_when_another_nodes_beat_failed() -> None:
    """A worker on queues of several cluster nodes: a beat that fails on one node must not
    drop the request another node's beat read (and deleted)."""

    async def main() -> tuple[bool, str]:
        client = fakeredis.FakeAsyncRedis()
        worker = Worker(client, Registry(), WorkerSettings(queues=("a", "b")))
        down = RedisConnectionError("node down")

        async def replies(*_: object) -> list[object]:
            return [down, ["1", "stop"]]

        worker._run_by_node = replies  # type: ignore[method-assign,assignment]
        with pytest.raises(RedisConnectionError):
            await worker._beat_workers()
        await client.aclose()
        return worker._stop_claiming.is_set(), worker._asked

    assert asyncio.run(main()) == (True, "stop")


def test_the_groups_own_options_go_after_the_subcommand(redis_url: str, q: Queue) -> None:
    beat(q, "w1")
    code, out = cli(redis_url, "workers", "-q", q.name, "stop", "w1")
    assert code == 2 and "after `workers stop`" in out


def test_scheduler_keys_counts_the_requests(redis_url: str, client: redis.Redis, q: Queue) -> None:
    beat(q, "w1")
    ask_stop(client, [q.keys], "w1", "stop")
    code, out = cli(redis_url, "keys", "-q", q.name, "--json")
    assert code == 0, out
    counts = {f["pattern"]: f["count"] for f in json.loads(out)["families"]}
    assert counts[q.keys.prefix + "worker_stop:*"] == 1
