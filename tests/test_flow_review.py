"""Flow-control leftovers found in review: a child naming, in the same enqueue_many, a parent
whose idempotency key was already taken depends on the job the key points to (the id the reply
gives for that parent), instead of on an id that is never written (it waited forever)."""

from __future__ import annotations

import pytest
import redis

from scheduler import BadArgument, JobNotFound, JobSpec, Queue
from scheduler.core.errors import NotDurable
from tests.conftest import dump_queue
from tests.redis_server import is_cluster_run


def _claim_ids(q: Queue) -> list[str]:
    return [j.id for j in q.claim("w", limit=100, lease_ms=10_000).jobs]


def test_a_child_of_a_parent_whose_key_is_taken_waits_for_the_keys_job(q: Queue) -> None:
    first = q.enqueue("t", 0, key="daily")
    ids = q.enqueue_many(
        [JobSpec("t", 1, key="daily", job_id="p2"), JobSpec("t", 2, job_id="c2", after=["p2"])]
    )
    assert ids == [first, "c2"]
    assert q.get_job("c2").fields["flow_reason"] == "waiting for 1 jobs"
    lease = q.claim("w", limit=10, lease_ms=10_000).jobs
    assert [j.id for j in lease] == [first]
    q.complete(first, lease[0].token, None)
    assert _claim_ids(q) == ["c2"]  # before: waiting for 'p2', which never exists


def test_the_keys_job_already_done_or_dead_counts_as_that_parent(q: Queue) -> None:
    done = q.enqueue("t", 0, key="k-done")
    lease = q.claim("w", limit=1, lease_ms=10_000).jobs[0]
    q.complete(done, lease.token, None)
    gone = q.enqueue("t", 0, key="k-gone")
    q.cancel(gone)
    q.enqueue_many(
        [
            JobSpec("t", key="k-done", job_id="p-done"),
            JobSpec("t", job_id="c-done", after=["p-done"]),
            JobSpec("t", key="k-gone", job_id="p-gone"),
            JobSpec("t", job_id="c-gone", after=["p-gone"]),
        ]
    )
    assert q.get_job("c-gone").dead_reason == f"parent cancelled: {gone}"
    assert _claim_ids(q) == ["c-done"]


def test_a_parent_named_twice_through_its_key_is_waited_for_once(q: Queue) -> None:
    first = q.enqueue("t", 0, key="twice")
    q.enqueue_many(
        [
            JobSpec("t", key="twice", job_id="p3"),
            JobSpec("t", job_id="c3", after=["p3", first]),
        ]
    )
    assert q.get_job("c3").fields["flow_reason"] == "waiting for 1 jobs"
    lease = q.claim("w", limit=10, lease_ms=10_000).jobs
    q.complete(first, lease[0].token, None)
    assert _claim_ids(q) == ["c3"]


def test_a_key_taken_earlier_in_the_same_call_points_the_child_there(q: Queue) -> None:
    ids = q.enqueue_many(
        [
            JobSpec("t", key="same", job_id="a4"),
            JobSpec("t", key="same", job_id="b4"),
            JobSpec("t", job_id="c4", after=["b4"]),
        ]
    )
    assert ids == ["a4", "a4", "c4"]
    lease = q.claim("w", limit=10, lease_ms=10_000).jobs
    assert [j.id for j in lease] == ["a4"]
    q.complete("a4", lease[0].token, None)
    assert _claim_ids(q) == ["c4"]


def test_a_key_whose_job_is_gone_refuses_the_call_and_writes_nothing(
    q: Queue, client: redis.Redis
) -> None:
    first = q.enqueue("t", 0, key="expired")
    # The key outlives its job (a done record expired, a purge): the job is missing.
    client.delete(q.keys.prefix + "spec:" + first, q.keys.prefix + "job:" + first)
    before = dump_queue(client, q)
    with pytest.raises(BadArgument, match=f"after=p5.*{first}.*no such job"):
        q.enqueue_many(
            [JobSpec("t", key="expired", job_id="p5"), JobSpec("t", job_id="c5", after=["p5"])]
        )
    assert dump_queue(client, q) == before


def test_claim_reads_each_flow_field_once_and_a_bad_one_as_unset(
    q: Queue, client: redis.Redis
) -> None:
    # Guards claim's one read of the flow fields (lib/flow.lua flow_rest): the limits still
    # hold, and a limit edited by hand makes the job plain, as flow_load read it.
    a = q.enqueue("t", 0, concurrency_key="k", concurrency_limit=1, rate_limit="5/1h")
    b = q.enqueue("t", 1, concurrency_key="k", concurrency_limit=1, rate_limit="5/1h")
    assert _claim_ids(q) == [a]
    assert q.get_job(b).fields["flow_reason"] == "limited by key k (1 leased)"
    c = q.enqueue("t", 2, concurrency_key="k", concurrency_limit=1)
    client.hset(q.keys.prefix + "job:" + c, "climit", "many")
    assert _claim_ids(q) == [c]


def test_a_repeated_id_with_another_key_takes_no_key(q: Queue) -> None:
    """Review of ffa65c0: the key pre-read took k2 for the repeated id X, which the write loop
    answers 'e'; the later k2 job Y was then answered as X and never written (lost)."""
    ids = q.enqueue_many(
        [
            JobSpec("t", 1, key="k1", job_id="X"),
            JobSpec("t", 2, key="k2", job_id="X"),
            JobSpec("t", 3, key="k2", job_id="Y"),
        ]
    )
    assert ids == ["X", "X", "Y"]
    assert q.get_job("Y").payload() == 3


def test_resending_a_batch_after_its_keyed_parent_expired_stays_idempotent(
    q: Queue, client: redis.Redis
) -> None:
    """Review of ffa65c0: the same batch sent again once the parent finished and its record
    expired (its key still held) was refused 'after=P (no such job)'; nothing is to be written
    (both ids are taken), so it answers as the first call did."""
    batch = [JobSpec("t", 1, key="daily", job_id="P"), JobSpec("t", 2, job_id="C", after=["P"])]
    assert q.enqueue_many(batch) == ["P", "C"]
    lease = q.claim("w", limit=1, lease_ms=10_000).jobs[0]
    q.complete("P", lease.token, None)
    client.delete(q.keys.job("P"))  # its result TTL ran out; the key lasts longer
    assert q.enqueue_many(batch) == ["P", "C"]


def test_a_child_in_a_later_batch_waits_for_the_job_its_parents_key_names(q: Queue) -> None:
    """The known limit of enqueue_many's batches, lifted: a child of a later script call named a
    parent of an earlier call whose key was taken, and was refused (after the earlier calls
    were written). The batches then go in turn, each naming the earlier reply's substitute."""
    first = q.enqueue("t", 0, key="daily")
    ids = q.enqueue_many(
        [
            JobSpec("t", 1, key="daily", job_id="p6"),
            JobSpec("t", 2, job_id="x6"),
            JobSpec("t", 3, job_id="c6", after=["p6", "x6"]),
        ],
        batch_size=1,
    )
    assert ids == [first, "x6", "c6"]
    assert q.get_job("c6").fields["flow_reason"] == "waiting for 2 jobs"
    for lease in q.claim("w", limit=10, lease_ms=10_000).jobs:
        q.complete(lease.id, lease.token, None)
    assert _claim_ids(q) == ["c6"]


def test_a_later_batch_names_a_parent_reached_twice_through_its_key_once(q: Queue) -> None:
    first = q.enqueue("t", 0, key="twice-b")
    q.enqueue_many(
        [
            JobSpec("t", key="twice-b", job_id="p7"),
            JobSpec("t", job_id="c7", after=["p7", first]),
        ],
        batch_size=1,
    )
    assert q.get_job("c7").fields["flow_reason"] == "waiting for 1 jobs"
    lease = q.claim("w", limit=10, lease_ms=10_000).jobs
    q.complete(first, lease[0].token, None)
    assert _claim_ids(q) == ["c7"]


def test_batches_in_turn_keep_wait_replicas(client: redis.Redis, q: Queue) -> None:
    # No replica here (the conftest server is a lone primary, or a cluster node with one):
    # asking for one more than there are must raise NotDurable with every id of the call.
    replicas = 1 if is_cluster_run() else 0
    first = q.enqueue("t", 0, key="durable-turn")
    durable = Queue(client, q.name, wait_replicas=replicas + 1, wait_timeout_ms=20)
    specs = [JobSpec("t", key="durable-turn", job_id="p8"), JobSpec("t", job_id="c8", after=["p8"])]
    with pytest.raises(NotDurable) as info:
        durable.enqueue_many(specs, batch_size=1)
    assert info.value.job_ids == [first, "c8"] and info.value.acked == replicas
    assert q.get_job("c8").fields["flow_reason"] == "waiting for 1 jobs"


def test_in_turn_a_gone_substitute_is_named_as_the_call_named_it(
    q: Queue, client: redis.Redis
) -> None:
    # As within one call (test_a_key_whose_job_is_gone_refuses_the_call_and_writes_nothing): the
    # refusal names the parent as given and the job its key names, not only the substitute.
    first = q.enqueue("t", 0, key="gone-turn")
    client.delete(q.keys.prefix + "spec:" + first, q.keys.prefix + "job:" + first)
    with pytest.raises(BadArgument, match=f"after=p9 \\(its idempotency key names {first}\\)"):
        q.enqueue_many(
            [JobSpec("t", key="gone-turn", job_id="p9"), JobSpec("t", job_id="c9", after=["p9"])],
            batch_size=1,
        )
    with pytest.raises(JobNotFound):
        q.get_job("c9")


def test_in_turn_a_short_wait_is_not_waited_for_again(client: redis.Redis, q: Queue) -> None:
    # Once one batch's WAIT came back short, NotDurable is certain: the later batches go without
    # a WAIT (each would block wait_timeout_ms for nothing).
    replicas = 1 if is_cluster_run() else 0
    first = q.enqueue("t", 0, key="durable-short")
    durable = Queue(client, q.name, wait_replicas=replicas + 1, wait_timeout_ms=20)
    specs = [JobSpec("t", key="durable-short", job_id="p10")]
    specs += [JobSpec("t", job_id=f"c10-{i}", after=["p10"]) for i in range(3)]
    if not is_cluster_run():
        client.config_resetstat()
    with pytest.raises(NotDurable) as info:
        durable.enqueue_many(specs, batch_size=1)
    assert info.value.job_ids == [first, "c10-0", "c10-1", "c10-2"]
    if not is_cluster_run():
        assert client.info("commandstats")["cmdstat_wait"]["calls"] == 1


def test_in_turn_a_parent_repeated_in_the_childs_batch_is_the_servers_to_alias(q: Queue) -> None:
    # P under two keys, both taken: within one call the child waits for the job of P's last
    # key before it. In turn, the second P shares the child's batch: the same (the client must
    # not rename P to the first batch's substitute).
    s1 = q.enqueue("t", 0, key="k-one")
    s2 = q.enqueue("t", 1, key="k-two")
    q.enqueue_many(
        [
            JobSpec("t", key="k-one", job_id="p11"),
            JobSpec("t", 2, job_id="x11"),
            JobSpec("t", key="k-two", job_id="p11"),
            JobSpec("t", job_id="c11", after=["p11"]),
        ],
        batch_size=2,
    )
    assert q.get_job("c11").fields["flow_reason"] == "waiting for 1 jobs"
    leases = {j.id: j for j in q.claim("w", limit=10, lease_ms=10_000).jobs}
    assert set(leases) == {s1, s2, "x11"}
    q.complete(s2, leases[s2].token, None)
    assert _claim_ids(q) == ["c11"]  # it waited for s2, not s1 (still leased)
