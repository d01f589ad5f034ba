"""Listings that show no payload (`jobs list`, `dead list`, the dashboard's queue and dead pages)
read each job's spec record up to its payload (InspectingOps.heads, client/job_listing.py): the
same job as a whole read gives, but its payload, for every layout a job may be stored in; the
payload is still read where it is shown (--json, `jobs show`, the public API)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from starlette.testclient import TestClient

from scheduler import JobSpec, PartitionedQueue, Queue
from scheduler.cli.main import main
from scheduler.client.job_listing import heads_readable, listing_ops
from scheduler.core.connection import connect
from scheduler.core.models import Job
from scheduler.core.spec_record import HEAD_BYTES, spec_head
from scheduler.dashboard import Auth, create_app
from tests.old_layout import old_enqueue
from tests.redis_server import RedisProcess

MIB = 1024 * 1024
BIG = {"d": "a" * (512 * 1024 - 16)}  # near the largest payload
# Two-byte characters from the start of the payload: byte HEAD_BYTES falls inside one of them.
WIDE = {"d": "é" * 600}


@pytest.fixture(scope="module")
def server(module_server: RedisProcess) -> RedisProcess:
    return module_server


@pytest.fixture
def client(server: RedisProcess) -> Iterator[redis.Redis]:
    c = connect(server.url)  # decoded, 'backslashreplace': the CLI's and the dashboard's own
    c.flushall()
    yield c
    c.close()


@pytest.fixture
def q(client: redis.Redis) -> Queue:
    return Queue(client, "lh-" + uuid.uuid4().hex[:10])


def _every_layout(q: Queue, client: redis.Redis) -> list[str]:
    """One job of each way a job is stored: pending, scheduled, leased, dead, done lean and
    kept, cancelled, the old hash-only layout (waiting and leased), and records edited by
    hand: a field too long for the head, no spec layout, empty, and a payload whose
    character byte HEAD_BYTES cuts."""
    ids = [q.enqueue(t, {"t": t}, max_attempts=1) for t in ("a.leased", "a.dead", "a.lean")]
    ids.append(q.enqueue("a.kept", WIDE, keep_payload=True))
    leased, dead, lean, kept = q.claim("w-1", limit=4, lease_ms=600_000).jobs
    q.fail(dead.id, dead.token, ValueError("no"), retryable=False)
    q.complete(lean.id, lean.token, {"r": 1})
    q.complete(kept.id, kept.token, {"r": 2})
    ids += [old_enqueue(q, client, "a.old", json.dumps(WIDE)) for _ in range(2)]
    (old,) = q.claim("w-2", limit=1, lease_ms=600_000).jobs
    ids += [q.enqueue("a.pending", WIDE), q.enqueue("a.later", {"n": 1}, delay_ms=3_600_000)]
    ids.append(q.enqueue("a.cancelled", 1))
    q.cancel(ids[-1])
    for record in ("2|a.long|" + "5" * HEAD_BYTES + "||||||{}", "garbage", ""):
        ids.append(q.enqueue("a.edited", {"x": 1}))
        client.set(q.keys.spec(ids[-1]), record)
    assert (leased.task, old.task, old.id) == ("a.leased", "a.old", ids[4])
    return ids


def _same_but_payload(head: Job, whole: Job) -> None:
    in_hash = "payload" in whole.fields and head.payload_json == whole.payload_json
    assert in_hash or ("payload" not in head.fields and head.payload_json == "")
    assert {k: v for k, v in head.fields.items() if k != "payload"} == {
        k: v for k, v in whole.fields.items() if k != "payload"
    }
    assert (head.id, head.state, head.task, head.lease_until_ms) == (
        whole.id,
        whole.state,
        whole.task,
        whole.lease_until_ms,
    )


@pytest.mark.parametrize("decoded", [True, False], ids=["text", "bytes"])
def test_a_head_read_is_the_whole_read_but_the_payload(
    server: RedisProcess, client: redis.Redis, q: Queue, decoded: bool
) -> None:
    ids = _every_layout(q, client)
    reader = client if decoded else redis.Redis.from_url(server.url)
    qr = Queue(reader, q.name)
    assert heads_readable(reader)
    whole = qr._run(qr.ops.get_jobs(ids))
    heads = qr._run(qr.ops.heads().get_jobs(ids))
    assert [j.id for j in heads] == [j.id for j in whole] == ids
    for h, w in zip(heads, whole, strict=True):
        _same_but_payload(h, w)
    assert "spec_unreadable" in heads[-2].fields and "spec_unreadable" in heads[-1].fields
    # The old layout's hash holds its payload; the spec records' payloads were not read.
    assert [j.task for j in heads if "payload" in j.fields] == ["a.old", "a.old"]
    for state in ("due", "scheduled", "leased", "dead", "finished"):
        listed = qr._run(qr.ops.heads().list_jobs(state))
        assert [j.id for j in listed] == [j.id for j in qr.list_jobs(state)]
    # The public API still reads payloads: get_job, list_jobs.
    assert qr.get_job(ids[6]).payload() == WIDE
    assert [j.payload() for j in qr.list_jobs("due") if j.task == "a.pending"] == [WIDE]


def test_the_head_is_cut_at_the_payload_and_whole_fields_only() -> None:
    record = "2|t|3||||||" + json.dumps(WIDE, ensure_ascii=False)
    raw = record.encode()[:HEAD_BYTES]
    assert spec_head(raw) == spec_head(raw.decode(errors="backslashreplace")) == "2|t|3||||||"
    assert spec_head(b"2|t|3||||") is None  # the head not all there
    assert spec_head("3|t|||||||{}") is None and spec_head("") is None


def test_a_strictly_decoding_client_lists_whole_records(
    server: RedisProcess, client: redis.Redis, q: Queue
) -> None:
    """A client given to the dashboard decodes strictly (redis-py's default): a reply cut
    inside a character would fail the page, so it reads whole records, as before."""
    job_id = q.enqueue("a.wide", WIDE)
    strict = redis.Redis.from_url(server.url, decode_responses=True)
    assert not heads_readable(strict)
    assert listing_ops(Queue(strict, q.name)).listing_payload
    web = TestClient(create_app(client=strict, auth=Auth()))
    page = web.get(f"/queues/{q.name}")
    assert page.status_code == 200 and job_id in page.text


def _net_out(server: RedisProcess) -> Callable[[], int]:
    """Bytes the server has sent so far: a listing that read the payloads sent them all."""
    c = redis.Redis.from_url(server.url)
    return lambda: int(c.info("stats")["total_net_output_bytes"])


def _cli(server: RedisProcess, *args: str) -> str:
    out = CliRunner(env={"COLUMNS": "200"}).invoke(main, [*args, "--url", server.url])
    assert out.exit_code == 0, out.output
    return out.stdout


@pytest.mark.parametrize("partitioned", [False, True], ids=["plain", "partitioned"])
def test_listings_that_show_no_payload_read_none(
    server: RedisProcess, client: redis.Redis, partitioned: bool
) -> None:
    """8 jobs of 512 KiB due and 8 dead: each listing sends less than 1 MiB (it sent 4 MiB)."""
    name = "lh-" + uuid.uuid4().hex[:10]
    pq = PartitionedQueue.create(client, name, partitions=2) if partitioned else None
    q: Any = pq or Queue(client, name)
    q.enqueue_many([JobSpec("a.big", BIG) for _ in range(8)], batch_size=2)
    q.enqueue_many([JobSpec("a.dying", BIG, max_attempts=1) for _ in range(8)], batch_size=2)
    for part in pq.parts if pq else [q]:
        while claimed := part.claim("w-1", limit=16, lease_ms=600_000).jobs:  # bounded by bytes
            for job in claimed:
                if job.task == "a.dying":
                    part.fail(job.id, job.token, ValueError("x"), retryable=False)
    assert (q.counts().dead, q.counts().leased) == (8, 8)
    web = TestClient(create_app(client=client, auth=Auth()))
    sent = _net_out(server)
    reads: dict[str, Callable[[], str]] = {
        "jobs list": lambda: _cli(server, "jobs", "list", "-q", name, "--state", "leased"),
        "jobs list --task": lambda: _cli(
            server, "jobs", "list", "-q", name, "--state", "leased", "--task", "a.big"
        ),
        "dead list": lambda: _cli(server, "dead", "list", "-q", name),
        "queue page": lambda: web.get(f"/queues/{name}?state=leased").text,
        "queue page --task": lambda: web.get(f"/queues/{name}?state=leased&task=a.big").text,
        "dead page": lambda: web.get(f"/queues/{name}/dead").text,
        "dead page --task": lambda: web.get(f"/queues/{name}/dead?task=a.dying").text,
    }
    for what, read in reads.items():
        before = sent()
        shown = read()
        assert shown.count("a.big") + shown.count("a.dying") >= 8, (what, shown[:500])
        assert sent() - before < MIB, what


def test_what_json_and_jobs_show_print_still_carries_payloads(
    server: RedisProcess, client: redis.Redis, q: Queue
) -> None:
    dead = q.enqueue("a.dead", WIDE, max_attempts=1)
    (job,) = q.claim("w-1", limit=1, lease_ms=600_000).jobs
    q.fail(job.id, job.token, ValueError("x"), retryable=False)
    job_id = q.enqueue("a.one", WIDE)
    q.enqueue("a.two", {"n": 2})

    def rows(*args: str) -> list[Any]:
        return list(json.loads(_cli(server, *args, "-q", q.name, "--json"))["jobs"])

    listed = rows("jobs", "list")
    assert [r["payload"] for r in listed] == [WIDE, {"n": 2}]
    assert [r["payload"] for r in rows("jobs", "list", "--task", "a.one")] == [WIDE]
    assert [(r["id"], r["payload"]) for r in rows("dead", "list")] == [(dead, WIDE)]
    shown = json.loads(_cli(server, "jobs", "show", "-q", q.name, "--json", job_id))
    assert shown["payload"] == WIDE
