"""The documented ACL roles (docs/security.md) hold every command the package sends, from its
scripts and from Python: a script's command the role lacks is refused inside it, and a
`redis.pcall` of it reads as a value, so the transition silently took another branch (a paused
queue claimed, a finished parent's children never released); a `redis.call` of it failed the
transition after its first writes."""

from __future__ import annotations

import asyncio
import html
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from starlette.testclient import TestClient

from scheduler import AsyncQueue, Queue
from scheduler._spawn_cluster import LocalCluster
from scheduler.admin.queue_move import QueueMove
from scheduler.core.connection import connect
from scheduler.core.scripts import TRANSITIONS, source
from scheduler.dashboard import Auth, create_app
from tests.faults.conftest import Server
from tests.faults.test_security import (
    PASSWORD,
    QUEUE,
    app_url,
    cli,
    create_user,
    documented_acl_line,
    ops_url,
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


@pytest.fixture(scope="module")
def acl_cluster() -> Iterator[str]:
    """A local Redis Cluster with both roles' users on every node: its nodes' host:port list
    (and a spare operator, sched-dash)."""
    with LocalCluster(require_server("a local Redis Cluster")) as cluster:
        for node in cluster.nodes:
            admin = cluster.node_client(node)
            for role in ("app", "operator"):
                admin.execute_command(*documented_acl_line(role))  # type: ignore[no-untyped-call]
            # The operator's line as it was before CLUSTER SLOTS joined it.
            old = [w for w in documented_acl_line("operator") if w != "+cluster|slots"]
            admin.execute_command(*[("sched-old" if w == "sched-ops" else w) for w in old])  # type: ignore[no-untyped-call]
            dash = [
                ("sched-dash" if w == "sched-ops" else w) for w in documented_acl_line("operator")
            ]
            admin.execute_command(*dash)  # type: ignore[no-untyped-call]
        yield cluster.url.split("://", 1)[1]


def test_both_roles_work_a_redis_cluster(acl_cluster: str) -> None:
    """redis-py's cluster clients read the slot map (CLUSTER SLOTS) and the command table
    (COMMAND) when they start: without them every call under the roles failed, said as
    'Cluster mode is not enabled on this node' (the CLI: cannot reach, exit 3)."""
    nodes = acl_cluster
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
        assert result.exit_code == 0, f"{' '.join(args)}: exit {result.exit_code}\n{result.output}"
    assert app.status(job) == "done" and app.status(later) == "due"


def test_a_cluster_refusing_the_login_or_the_slot_map_is_exit_5(
    acl_cluster: str, tmp_path: Path
) -> None:
    """redis-py words a refused password at every seed node, and a user refused CLUSTER SLOTS
    ('Cluster mode is not enabled'), as 'Redis Cluster cannot be connected': the CLI and the
    worker said 'cannot reach' with exit 3, which supervisors restart for ever."""
    from tests.workers.procs import spawn_worker

    wrong = f"redis+cluster://sched-ops:WRONG-{PASSWORD}@{acl_cluster}"
    old = f"redis+cluster://sched-old:{PASSWORD}@{acl_cluster}"
    result = cli(wrong, "stats")
    assert result.exit_code == 5, result.output
    assert "refused the credentials" in result.stderr and "WRONG" not in result.output
    result = cli(old, "stats")
    assert result.exit_code == 5, result.output
    assert "may not run CLUSTER SLOTS" in result.stderr, result.output
    for url, said in ((wrong, "refused the credentials"), (old, "may not run CLUSTER SLOTS")):
        log = tmp_path / "worker.log"
        code = spawn_worker(url, QUEUE, "--burst", log=str(log)).wait(60)
        text = log.read_text()
        assert code == 5 and said in text and "WRONG" not in text, text


def test_the_dashboard_says_a_cluster_refused_its_login(acl_cluster: str) -> None:
    """Its password changed while it runs: the overview, which rebuilds the slot map, said
    'Redis unreachable' (503) where a queue page said 'Redis refused the login'."""
    app = create_app(url=f"redis+cluster://sched-dash:{PASSWORD}@{acl_cluster}", auth=Auth())
    Queue.from_url(f"redis+cluster://sched-app:{PASSWORD}@{acl_cluster}", "dash").enqueue("t", None)
    with TestClient(app, raise_server_exceptions=False) as web:
        assert "dash" in web.get("/api/overview").text
        for node in acl_cluster.rstrip("/").split(","):
            host, port = node.rsplit(":", 1)
            with redis.Redis(host=host, port=int(port)) as admin:
                admin.execute_command("ACL", "SETUSER", "sched-dash", "resetpass", ">changed")
                admin.execute_command("CLIENT", "KILL", "USER", "sched-dash")
        for path in ("/queues/dash", "/"):  # from a node's connection, then from the slot map
            page = web.get(path)
            assert page.status_code == 500, f"{path}: {page.status_code} {page.text}"
            assert "refused the dashboard's credentials" in html.unescape(page.text), path
            assert PASSWORD not in page.text


def test_the_operator_role_can_do_everything_the_app_role_can() -> None:
    """docs/security.md's threat model says so, and an operator runs `scheduler worker` too
    (a one-off drain, `--burst`): without BLPOP, its wake-up wait, that worker exits 5."""
    assert _allowed("app") - _allowed("operator") == set()


def test_the_operator_role_runs_queue_move_and_the_rerun_of_a_stopped_one(
    start_server: Callable[..., Server],
) -> None:
    """`scheduler queue move` sends its own commands from Python (the run lock's SET NX PX,
    the destination's records and kept ids, an idempotency key carried with SCAN and PTTL)
    and three scripts: all under the operator role, a stopped move's rerun and a stale
    record's deletion too (the take read config with HKEYS, which neither role allows)."""
    server = start_server()
    admin = server.admin()
    create_user(admin, "operator")
    url = ops_url(server)
    a, b, c = (Queue(admin, n) for n in ("acl-mv-a", "acl-mv-b", "acl-mv-c"))
    a.enqueue("acl.t", {"n": 1}, job_id="x")
    a.enqueue("acl.t", {"n": 2}, job_id="y", key="k")
    stopped = QueueMove(connect(url), a.name, b.name)  # as the operator, stopped after its put
    assert stopped.put(stopped.take(stopped.src[0], ["x"])) == "c"
    for args in (("--from", a.name, "--to", b.name), ("--from", b.name, "--to", c.name)):
        if args[1] == b.name:  # a record its run left behind: deleted by this run's check
            admin.hset(b.keys.config, "move_from:acl-mv-gone", "1")
        result = cli(url, "queue", "move", *args, "--json")
        assert result.exit_code == 0, result.output
        assert "NOPERM" not in result.output and "permission" not in result.output, args
    assert sorted(admin.zrange(c.keys.due, 0, -1)) == ["x", "y"]
    left = [f for f in map(str, admin.hkeys(b.keys.config)) if not f.startswith("move_epoch:")]
    assert left == [] and admin.exists(a.keys.job("x"), a.keys.spec("x")) == 0
