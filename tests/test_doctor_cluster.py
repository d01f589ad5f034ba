"""`scheduler doctor` on a Redis Cluster and on a partitioned queue (an audit): every kind of
damage injected by hand into each partition, spread over the three primaries, is found by the
logical name, repaired by `--fix` through each partition's own node, and the queue drains
afterwards; the repairs are counted in each partition's stats as on one server."""

from __future__ import annotations

import itertools
import json
import shlex
from typing import Any

import pytest
from click.testing import CliRunner

from scheduler import JobSpec, Queue
from scheduler.admin.inspection import server_now_ms
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import node_for_key
from tests.old_layout import old_enqueue

HOUR_MS = 3_600_000
pytestmark = pytest.mark.pq(client="rc")


def _damage(part: Queue, n: int) -> dict[str, str]:
    """In one partition, with plain commands on its own node: a hash in no place, a job in due
    and dead at once, a lease lapsed an hour ago, a state that lies, an id whose hash is gone,
    a job no worker can run. Returns id -> the finding doctor must report."""
    node = node_for_key(part.client, part.keys.prefix)
    k = part.keys
    ids = {
        name: old_enqueue(part, node, "t", f'{{"n":{n}}}', job_id=f"{name}{n}")
        for name in ("orphan", "twice", "lapsed", "mismatch", "notask")
    }
    now = server_now_ms(node)
    node.zrem(k.due, ids["orphan"])
    node.zadd(k.dead, {ids["twice"]: 0})
    node.zrem(k.due, ids["lapsed"])
    node.zadd(k.leased, {ids["lapsed"]: now - HOUR_MS})
    node.hset(k.job(ids["lapsed"]), mapping={"state": "leased", "worker": "ghost", "attempts": 1,
                                             "token": "1-deadbeef"})  # fmt: skip
    node.hset(k.job(ids["mismatch"]), "state", "done")
    node.hdel(k.job(ids["notask"]), "task")
    node.zadd(k.due, {f"nohash{n}": now})
    return {
        ids["orphan"]: "orphan-hash",
        ids["twice"]: "two-places",
        ids["lapsed"]: "lease-expired",
        ids["mismatch"]: "state-mismatch",
        ids["notask"]: "invalid-job",
        f"nohash{n}": "missing-hash",
    }


def _doctor(url: str, *args: str) -> tuple[int, dict[str, Any]]:
    runner = CliRunner(env={"REDIS_URL": None})  # a fix line names the --url (not REDIS_URL)
    res = runner.invoke(main, ["doctor", "--url", url, "--json", "--no-server", *args])
    return res.exit_code, json.loads(res.output)


def _stats(part: Queue) -> dict[str, int]:
    node = node_for_key(part.client, part.keys.prefix)
    out: dict[str, int] = {}
    for key in node.scan_iter(match=f"{part.keys.prefix}stats:*"):
        for field, value in node.hgetall(key).items():
            if str(field) in ("dead", "expired"):
                out[str(field)] = out.get(str(field), 0) + int(value)
    return out


def test_doctor_finds_and_fixes_every_partition_of_a_queue_on_a_cluster(
    rc: Any, cluster_url: str, pq: PartitionedQueue
) -> None:
    nodes = {rc.get_node_from_key(p.keys.prefix).name for p in pq.parts}
    assert len(nodes) == 3  # one partition per primary
    healthy = pq.enqueue_many([JobSpec("t", {"ok": i}) for i in range(6)])
    want: dict[str, tuple[str, str]] = {}
    for n, part in enumerate(pq.parts):
        want.update({jid: (part.name, code) for jid, code in _damage(part, n).items()})
    code, out = _doctor(cluster_url, "-q", pq.name)
    assert code == 1 and out["queues"] == [p.name for p in pq.parts]
    found = {f["job_id"]: (f["queue"], f["code"]) for f in out["findings"]}
    assert found == want
    code, out = _doctor(cluster_url, "-q", pq.name, "--fix")
    assert (code, out["findings"]) == (0, []), out
    assert {f["job_id"] for f in out["fixed"]} == set(want)
    assert _doctor(cluster_url, "-q", pq.name) == (0, {**out, "fixed": [], "findings": []})
    # The lapsed lease reaped (expired); parked (dead): the task-less job, the hash-less id.
    for part in pq.parts:
        assert _stats(part) == {"expired": 1, "dead": 2}, part.name
    done: set[str] = set()
    for part in pq.parts:  # a worker claims each partition
        for job in part.claim("drainer", limit=50).jobs:
            part.complete(job.id, job.token)
            done.add(job.id)
    assert set(healthy) <= done
    kept = {j for j, (_, c) in want.items() if c in ("orphan-hash", "two-places", "lease-expired",
                                                      "state-mismatch")}  # fmt: skip
    assert kept <= done  # no job lost: each repaired one ran


def test_doctor_without_a_queue_checks_every_partition_on_the_cluster(
    cluster_url: str, pq: PartitionedQueue
) -> None:
    pq.enqueue("t", 1)
    code, out = _doctor(cluster_url)
    assert code == 0, out
    assert {p.name for p in pq.parts} <= set(out["queues"])
    assert pq.name not in out["queues"]  # the logical name holds no jobs of its own


def test_the_fix_line_a_finding_gives_runs_on_its_partition(
    cluster_url: str, pq: PartitionedQueue
) -> None:
    part = pq.parts[1]
    want = _damage(part, 7)
    code, out = _doctor(cluster_url, "-q", pq.name)
    fixes = {f["fix"] for f in out["findings"]}
    # The line names the URL doctor was given (a pasted line must check the same cluster).
    line = f"scheduler doctor --fix --queue {part.name} --url {shlex.quote(cluster_url)}"
    assert code == 1 and fixes == {line}, fixes
    code, fixed = _doctor(cluster_url, *shlex.split(fixes.pop())[2:])
    assert code == 0 and {f["job_id"] for f in fixed["fixed"]} == set(want), fixed


def test_a_partitions_own_keys_and_an_old_dead_list_are_checked_on_its_node(
    cluster_url: str, pq: PartitionedQueue
) -> None:
    part = pq.parts[2]
    node = node_for_key(part.client, part.keys.prefix)
    died = []
    for i in range(3):  # an older version's dead LIST: converted on the partition's node
        jid = part.enqueue("t", i, max_attempts=1)
        (job,) = part.claim("w", limit=1).jobs
        part.fail(jid, job.token, ValueError("x"))
        died.append(jid)
    node.delete(part.keys.dead)
    node.lpush(part.keys.dead, *died)
    node.set(part.keys.config, "by hand")
    node.set(part.keys.wake, "by hand")
    pq.schedule("nightly", "t", every_ms=60_000)
    home = pq.parts[pq.layout.partition_of_schedule("nightly")]
    hnode = node_for_key(home.client, home.keys.prefix)
    hnode.hdel(home.keys.schedule("nightly"), "task")
    code, out = _doctor(cluster_url, "-q", pq.name)
    found = {(f["queue"], f["code"]) for f in out["findings"]}
    assert code == 1 and found == {(part.name, "wrong-type"), (home.name, "schedule-unreadable")}
    assert len([f for f in out["findings"] if f["code"] == "wrong-type"]) == 2, out
    assert node.type(part.keys.dead) == "zset" and set(node.zrange(part.keys.dead, 0, -1)) == set(
        died
    )


def test_an_unreadable_partition_record_on_a_cluster_is_a_finding(
    rc: Any, cluster_url: str, pq: PartitionedQueue
) -> None:
    rc.set(f"sched:{{{pq.name}}}:partitions", "garbage")
    code, out = _doctor(cluster_url, "-q", pq.name)
    assert code == 1 and [f["code"] for f in out["findings"]] == ["unreadable-layout"], out
    assert out["queues"] == [pq.name]


def test_a_node_findings_fix_line_names_that_node_not_the_seed(cluster_url: str) -> None:
    """A server setting is each node's own (CONFIG SET is not redirected by `-c`): the fix line
    of a finding read from one node carries that node's -h/-p, whatever node the URL seeds."""
    res = CliRunner(env={"COLUMNS": "300"}).invoke(main, ["doctor", "--url", cluster_url])
    lines = res.output.splitlines()
    pairs = [(a, b) for a, b in itertools.pairwise(lines)
             if " server " in a and ": node " in a and "fix: redis-cli" in b]  # fmt: skip
    assert pairs, res.output  # a local cluster's nodes run without appendonly: a finding each
    nodes = set()
    for finding, fix in pairs:
        node = finding.split(": node ", 1)[1].split(": ", 1)[0]
        host, _, port = node.rpartition(":")
        assert f"redis-cli -h {host} -p {port} " in fix and " -c " not in fix, (finding, fix)
        nodes.add(node)
    assert len(nodes) > 1, pairs  # several nodes, each its own line
