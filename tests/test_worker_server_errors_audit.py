"""The worker against rare Redis server errors met while it runs (an audit; a private server,
reconfigured by the tests): an ACL permission removed mid-run."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aredis

from scheduler import Queue
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.registry import JobContext, Registry
from tests.redis_server import RedisProcess

registry = Registry()
_gates: dict[str, asyncio.Event] = {}
_starts: list[str] = []


@registry.task(name="gate")
async def gate(payload: Any, ctx: JobContext) -> str:
    _starts.append(ctx.job_id)
    await _gates.setdefault(ctx.job_id, asyncio.Event()).wait()
    return "ok"


def app_role(admin: redis.Redis, user: str) -> None:
    """docs/security.md's app role, as `user`."""
    text = (Path(__file__).parent.parent / "docs" / "security.md").read_text()
    m = re.search(r"<!-- acl:app -->\s*```\s*\n(ACL SETUSER [^\n]+)\n```", text)
    assert m, "docs/security.md lost its app ACL line"
    words = m.group(1).split()
    admin.execute_command("ACL", "SETUSER", user, *words[3:])  # type: ignore[no-untyped-call]


def capture() -> tuple[logging.Logger, list[str]]:
    records: list[str] = []
    log = logging.getLogger("scheduler.test." + uuid.uuid4().hex[:8])
    log.propagate = False
    log.setLevel(logging.INFO)

    class ToList(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    log.handlers[:] = [ToList()]
    return log, records


async def poll(cond: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def test_a_permission_removed_mid_run_that_refuses_a_complete_stops_the_worker(
    module_server: RedisProcess,
) -> None:
    """Redis 7.0 refuses a command inside a script with "ERR The user executing the script
    can't run this command" (no NOPERM code; Valkey: "ACL failure in script: ..."). Before, a
    complete refused so was taken for that one job's refusal: logged 'complete refused', its
    outcome dropped, and the worker went on claiming and running jobs whose outcomes were all
    refused (one ERROR line per batch)."""
    admin = module_server.client()
    user = "w" + uuid.uuid4().hex[:6]
    app_role(admin, user)
    q = Queue(admin, "pa-" + uuid.uuid4().hex[:8])
    job = q.enqueue("gate", None)
    log, records = capture()
    _starts.clear()

    async def main() -> int:
        client = aredis.Redis(unix_socket_path=module_server.socket, username=user,
                              password="CHANGE-ME", decode_responses=True)  # fmt: skip
        w = Worker(client, registry, WorkerSettings(
            queues=(q.name,), concurrency=1, lease_ms=3000, heartbeat_ms=100, grace_s=1),
            logger=log)  # fmt: skip
        task = asyncio.create_task(w.run(install_signals=False))
        await poll(lambda: _starts == [job], "the job started")
        # Only complete's result retention uses PEXPIRE: claims and heartbeats go on.
        admin.acl_setuser(user, enabled=True, commands=["-pexpire"])
        _gates.setdefault(job, asyncio.Event()).set()
        await poll(lambda: task.done() or any("complete refused" in m for m in records),
                   "the worker stopped or the complete refused")  # fmt: skip
        try:
            assert not any("complete refused" in m for m in records), records
            return await asyncio.wait_for(task, 30)
        finally:
            if not task.done():
                w.request_stop()
                await asyncio.wait_for(task, 30)
            await client.aclose()

    try:
        assert asyncio.run(main()) == 5  # EXIT_FORBIDDEN, as NOPERM outside a script
    finally:
        admin.acl_deluser(user)
    stop = [m for m in records if "stopping the worker (exit 5)" in m]
    # Redis 7.0: "ERR The user executing the script can't run this command"; Valkey: "ACL
    # failure in script: User ... has no permissions to run the 'pexpire' command".
    assert len(stop) == 1 and re.search(r"can't run this command|'pexpire'", stop[0]), records
