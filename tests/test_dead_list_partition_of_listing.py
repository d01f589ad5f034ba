"""`scheduler dead list` of a partitioned queue read each listed job back from the partition its
id routes to (Layout.partition_of_id), not the one whose dead list named it. A job written to a
partition's own queue (an ordinary queue: `scheduler enqueue -q <name>.p1.4`, or its Queue
object) has an id that routes elsewhere about 3 times in 4: it was shown under "gone" (as if
its records were deleted by hand) and, on Redis Cluster with that other partition's node down,
the whole command failed with 'cannot reach Redis' (the flaky CI failure of
test_cluster_node_down.py's partial-read test, whose fixture writes such jobs)."""

from __future__ import annotations

import json

import redis
from click.testing import CliRunner

from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from tests.fixtures.partitioned import delete_partitioned


def test_dead_jobs_written_to_a_partition_directly_are_listed_with_their_records(
    client: redis.Redis, redis_url: str, queue_name: str
) -> None:
    pq = PartitionedQueue.create(client, queue_name, partitions=4)
    try:
        ids: list[str] = []
        for part in pq.parts:
            ids += [part.enqueue("t", {"n": n}) for n in range(3)]
            for job in part.claim("w", limit=10).jobs:
                part.fail(job.id, job.token, ("Boom", "it broke", ""), retryable=False)
        # The premise: most of these ids route to another partition than the one they are in.
        assert (
            sum(pq.layout.partition_of_id(i) != k for k in range(4) for i in ids[3 * k :][:3]) > 0
        )
        res = CliRunner().invoke(main, ["dead", "list", "-q", queue_name, "--url", redis_url,
                                        "--json"])  # fmt: skip
        assert res.exit_code == 0, res.output
        data = json.loads(res.stdout)
        assert data["total"] == 12
        assert data["gone"] == []
        assert sorted(j["id"] for j in data["jobs"]) == sorted(ids)
        assert {j["last_error_type"] for j in data["jobs"]} == {"Boom"}
    finally:
        delete_partitioned(client, pq)
