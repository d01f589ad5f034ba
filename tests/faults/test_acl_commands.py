"""The documented ACL roles (docs/security.md) hold every command the package sends, from its
scripts and from Python: a script's command the role lacks is refused inside it, and a
`redis.pcall` of it reads as a value, so the transition silently took another branch (a paused
queue claimed, a finished parent's children never released); a `redis.call` of it failed the
transition after its first writes."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable

from scheduler import AsyncQueue, Queue
from scheduler._spawn_cluster import LocalCluster
from scheduler.core.scripts import TRANSITIONS, source
from tests.faults.conftest import Server
from tests.faults.test_security import (
    PASSWORD,
    QUEUE,
    app_url,
    cli,
    create_user,
    documented_acl_line,
)
from tests.redis_server import require_server

_CALL = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'")
# Sent from Python outside the scripts, by paths the client API or the CLI takes.
_PYTHON = {
    "app": {"LINDEX", "ZREVRANK"},  # result() of a job its park deleted, dead pages past the first
    "operator": {"LINDEX", "ZREVRANK", "SISMEMBER"},  # and doctor's check of a waiting child
}


def _allowed(role: str) -> set[str]:
    return {w[1:].upper() for w in documented_acl_line(role) if w.startswith("+")}


def test_each_role_allows_every_command_its_scripts_and_calls_send() -> None:
    """doctor --fix (repair) is the operator's own; every other transition both roles run."""
    for role in ("app", "operator"):
        names = [n for n in TRANSITIONS if role == "operator" or n != "repair"]
        sent = {c.upper() for n in names for c in _CALL.findall(source(n))} | _PYTHON[role]
        missing = sent - _allowed(role)
        assert not missing, f"the {role} role lacks {sorted(missing)}"


def _queues(server: Server, name: str) -> tuple[Queue, Queue]:
    create_user(server.admin(), "app")
    admin = server.admin()
    return Queue(admin, name), Queue.from_url(app_url(server), name)


def test_a_paused_queue_is_not_claimed_under_the_app_role(
    start_server: Callable[..., Server],
) -> None:
    admin_q, app = _queues(start_server(), QUEUE)
    job = app.enqueue("t", None)
    admin_q.pause()
    assert app.claim("w1", limit=5).jobs == []  # claimed before: HEXISTS refused in claim.lua
    admin_q.resume()
    assert [j.id for j in app.claim("w1", limit=5).jobs] == [job]


def test_a_finished_parents_children_run_under_the_app_role(
    start_server: Callable[..., Server],
) -> None:
    _, app = _queues(start_server(), QUEUE)
    parent = app.enqueue("t", None)
    children = {app.enqueue("t", None, after=[parent]) for _ in range(3)}
    (job,) = app.claim("w1", limit=5).jobs
    app.complete(job.id, job.token, None)
    # Before: SPOP refused in lib/flow.lua, the children left waiting for ever.
    assert {j.id for j in app.claim("w1", limit=5).jobs} == children


def test_a_complete_at_the_finished_index_cap_succeeds_under_the_app_role(
    start_server: Callable[..., Server],
) -> None:
    admin_q, app = _queues(start_server(), QUEUE)
    far_ms = int(time.time() * 1000) + 3_600_000
    admin_q.client.zadd(admin_q.keys.finished, {f"old{i}": far_ms for i in range(10_000)})
    app.enqueue("t", None)
    (job,) = app.claim("w1", limit=1).jobs
    app.complete(job.id, job.token, {"ok": True})  # raised (ZREMRANGEBYRANK) after its writes
    assert admin_q.client.zcard(admin_q.keys.finished) == 10_000
    assert admin_q.client.zscore(admin_q.keys.finished, job.id) is not None


def test_both_roles_work_a_redis_cluster() -> None:
    """redis-py's cluster clients read the slot map (CLUSTER SLOTS) and the command table
    (COMMAND) when they start: without them every call under the roles failed, said as
    'Cluster mode is not enabled on this node' (the CLI: cannot reach, exit 3)."""
    with LocalCluster(require_server("a local Redis Cluster")) as cluster:
        for node in cluster.nodes:
            for role in ("app", "operator"):
                cluster.node_client(node).execute_command(*documented_acl_line(role))  # type: ignore[no-untyped-call]
        nodes = cluster.url.split("://", 1)[1]
        app = Queue.from_url(f"redis+cluster://sched-app:{PASSWORD}@{nodes}", QUEUE)
        job = app.enqueue("t", None)
        (claimed,) = app.claim("w1", limit=5).jobs
        app.complete(claimed.id, claimed.token, None)

        async def enqueue() -> str:
            aq = AsyncQueue.from_url(f"redis+cluster://sched-app:{PASSWORD}@{nodes}", QUEUE)
            try:
                return await aq.enqueue("t", None)
            finally:
                await aq.aclose()

        later = asyncio.run(enqueue())
        ops = f"redis+cluster://sched-ops:{PASSWORD}@{nodes}"
        for args in (
            ("stats",),
            ("jobs", "show", "-q", QUEUE, job),
            ("jobs", "show", "-q", QUEUE, later),
        ):
            result = cli(ops, *args)
            assert result.exit_code == 0, (
                f"{' '.join(args)}: exit {result.exit_code}\n{result.output}"
            )
        assert app.status(job) == "done" and app.status(later) == "due"
