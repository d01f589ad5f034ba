"""A TCP proxy drops connections and holds replies past the client's socket timeout, with
redis-py's retries on: every script may run twice (the first answer lost), and must still give
one job per idempotency key, one holder per lease, one attempt per real claim, and the same
answer to a repeated complete / fail / release."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import redis

from scheduler import Backoff, Queue
from tests.faults.conftest import FaultyProxy, Server, retry_policy, retrying_client

SOCKET_TIMEOUT_S = 0.25
FAULTS = {"drop_request": 0.08, "drop_reply": 0.12, "delay_reply": 0.05, "delay_s": 0.4}
QUEUE = "proxy"


def proxied(proxy: FaultyProxy) -> redis.Redis:
    return retrying_client(proxy.url, socket_timeout=SOCKET_TIMEOUT_S,
                           retry=retry_policy(retries=40, cap_s=0.05))  # fmt: skip


def run_threads(n: int, body: Callable[[int], None]) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            body(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors


def test_idempotency_key_gives_one_job_through_a_faulty_network(
    start_server: Callable[..., Server], proxy_factory: Callable[[Server, int], FaultyProxy]
) -> None:
    server = start_server()
    proxy = proxy_factory(server, 1)
    proxy.faults(**FAULTS)
    keys = [f"order-{i}" for i in range(40)]
    got: dict[str, set[str]] = {k: set() for k in keys}
    lock = threading.Lock()

    def producer(i: int) -> None:
        q = Queue(proxied(proxy), QUEUE)
        for k in keys[i::2] + keys[:20:3]:  # every key twice or more, from several threads
            jid = q.enqueue("proxy.t", {"k": k}, key=k)
            with lock:
                got[k].add(jid)

    assert run_threads(3, producer) == []
    admin = server.admin()
    q = Queue(admin, QUEUE)
    assert all(len(ids) == 1 for ids in got.values()), "a key gave two different ids"
    # A pending job is its spec record alone (lua/lib/job.lua): its hash is born at first claim.
    stored = {k for k in admin.scan_iter(match=q.keys.prefix + "spec:*")}
    assert len(stored) == len(keys) == admin.zcard(q.keys.due)
    assert {q.keys.spec(next(iter(ids))) for ids in got.values()} == stored
    assert list(admin.scan_iter(match=q.keys.prefix + "job:*")) == []
    assert proxy.stats["drop_reply"] > 0 and proxy.stats["delay_reply"] > 0, proxy.stats


def test_claims_and_settlements_through_a_faulty_network(
    start_server: Callable[..., Server], proxy_factory: Callable[[Server, int], FaultyProxy]
) -> None:
    server = start_server()
    admin = server.admin()
    direct = Queue(admin, QUEUE)
    n_jobs = 90
    no_wait = Backoff(base_ms=0, jitter=0.0)
    ids = [direct.enqueue("proxy.t", {"n": i}, backoff=no_wait) for i in range(n_jobs)]
    proxy = proxy_factory(server, 2)
    proxy.faults(**FAULTS)

    handed: Counter[str] = Counter()  # (job id) -> times a claim handed it to any worker
    answers: dict[str, list[object]] = {}
    lock = threading.Lock()

    def worker(i: int) -> None:
        q = Queue(proxied(proxy), QUEUE)
        mine = 0
        while True:
            batch = q.claim(f"w{i}", limit=4, lease_ms=60_000)
            if not batch.jobs:
                if direct.counts().due == 0:
                    return
                continue
            for job in batch.jobs:
                mine += 1
                with lock:
                    handed[job.id] += 1
                    # attempts advance once per real claim; a release gave its attempt back
                    assert job.attempts == 1 and job.fence == handed[job.id], job
                n = int(job.payload()["n"])
                if (
                    n % 3 == 0 or job.fence > 1
                ):  # complete, then complete again: same answer, nothing changes
                    first = q.complete_many([(job.id, job.token, {"n": n})])
                    again = q.complete_many([(job.id, job.token, {"n": -1})])
                elif n % 3 == 1:  # non-retryable fail, twice
                    first = q.fail(job.id, job.token, ("E", "bad", ""), retryable=False)
                    again = q.fail(job.id, job.token, ("E", "bad", ""), retryable=False)
                else:  # a worker shutting down gives the job back, twice (first claim only)
                    first = q.release([(job.id, job.token)])
                    again = q.release([(job.id, job.token)])
                with lock:
                    answers[f"{job.id}/{job.fence}"] = [first, again]

    assert run_threads(3, worker) == []
    # No job was handed to two workers: once each, twice for the released ones (released, then
    # claimed again and completed), and the fence counts exactly those claims.
    # A done job is lean (its payload and fence dropped, lua/complete.lua): n is its index, and
    # its fence was checked at each claim above; a dead job keeps its whole record.
    for n, jid in enumerate(ids):
        job = direct.get_job(jid)
        claims, state = {0: (1, "done"), 1: (1, "dead"), 2: (2, "done")}[n % 3]
        assert (handed[jid], job.state, job.attempts) == (claims, state, 1), (jid, n)
        if state == "done":
            assert job.payload_dropped and "fence" not in job.fields, job
            assert job.result_json == f'{{"n":{n}}}'  # the repeated complete changed nothing
        else:
            assert int(job.fields["fence"]) == claims and int(job.payload()["n"]) == n
    for what, (first, again) in answers.items():
        assert first == again, (what, first, again)
    assert len(answers) == n_jobs + n_jobs // 3
    c = direct.counts()
    assert (c.due, c.leased, c.dead) == (0, 0, n_jobs // 3)
    assert proxy.stats["drop_reply"] > 0 and proxy.stats["delay_reply"] > 0, proxy.stats
