"""Review of this session's own changes since f12bc70 (adversarial): the operator lines of
admin/redis_cli.py (connection flags for `redis-cli`, `--url` for `scheduler ...`) as doctor,
`scheduler keys` and the server-settings warnings show them, pasted into a shell; the CLI's lazy
command table; claim.lua's bounded answer while a suspect is skipped; ceil_ms / utc_ms; the
schedule-slots key family; `jobs show`'s require_queue; the dashboard's health fix line.
Its 7 defects (strict xfails at first) are fixed; the rest held. Private servers only (never
the shared one)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
import redis
from click.testing import CliRunner
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler._spawn import RedisProcess
from scheduler.admin.inspection import key_families
from scheduler.admin.redis_cli import connection_flags, with_url
from scheduler.admin.startup import check_or_warn, check_or_warn_async
from scheduler.cli.common import DEFAULT_URL
from scheduler.cli.doctor import _Shown
from scheduler.cli.main import main
from scheduler.core.codec import ceil_ms
from scheduler.core.connection import connect, connect_async
from scheduler.core.keys import QueueKeys
from scheduler.dashboard import Auth, create_app
from scheduler.schedules.cron_slots import _to_ms, utc_ms
from tests.redis_server import require_binary, require_server
from tests.sentinel_servers import SentinelSet


@pytest.fixture
def tcp() -> Iterator[RedisProcess]:
    """A private TCP server (its URL is neither REDIS_URL's nor the default)."""
    with RedisProcess(require_server("a private TCP server"), tcp=True) as server:
        yield server


def _paste(line: str) -> str:
    """Run one printed line in a shell, as an operator pasting it would."""
    done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=30)
    return done.stdout


# -- defects ---------------------------------------------------------------------------------


def test_keys_scan_example_on_a_cluster_lists_the_queues_keys(cluster_url: str) -> None:
    require_binary("redis-cli", "the printed lines are run as an operator would")
    client = connect(cluster_url)
    seed_port = int(cluster_url.split("://", 1)[1].split(",", 1)[0].rsplit(":", 1)[1])
    owner = client.get_node_from_key  # type: ignore[attr-defined]
    name = next(
        n
        for n in (f"rvd4-scan-{i}" for i in range(1000))
        if owner(QueueKeys(n).due).port != seed_port
    )
    q = Queue(client, name)
    job = q.enqueue("t", {"n": 1})
    try:
        out = CliRunner(env={"COLUMNS": "300"}).invoke(
            main, ["keys", "--url", cluster_url, "-q", name]
        )
        assert out.exit_code == 0, out.output
        zrange = next(ln.strip() for ln in out.output.splitlines() if " ZRANGE " in ln)
        assert job in _paste(zrange)  # a keyed command: -c follows the slot to its node
        scan = next(ln.strip() for ln in out.output.splitlines() if "--scan" in ln)
        assert q.keys.due in _paste(scan), scan
    finally:
        client.delete(*client.keys(q.keys.pattern()))
        client.close()


def test_worker_start_warning_on_a_sentinel_url_names_the_master() -> None:
    s = SentinelSet(require_server("a master + replica + sentinel")).start()
    try:
        url = s.url(path="/mymaster/2")
        master = s.master_port()
        sync_lines: list[str] = []
        check_or_warn(connect(url), strict=False, log=sync_lines.append, url=url)
        # Holds: `scheduler enqueue`'s warning (a blocking client) asks the sentinel.
        assert sync_lines and all(f"-p {master} -n 2 CONFIG" in ln for ln in sync_lines)
        lines: list[str] = []

        async def start() -> None:
            client = connect_async(url)
            try:  # as worker_start.serve does
                await check_or_warn_async(client, strict=False, log=lines.append, url=url,
                                          keys=[QueueKeys("rvd4").due])  # fmt: skip
            finally:
                await client.aclose()

        asyncio.run(start())
        fixes = [ln.split("fix: ", 1)[1] for ln in lines if "fix: redis-cli" in ln]
        assert fixes, lines
        for fix in fixes:
            assert f"redis-cli -p {master} -n 2 CONFIG" in fix, fix
    finally:
        s.cleanup()


def test_doctor_lines_keep_an_explicit_default_url_when_redis_url_differs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://prod.example:6379/0")
    shown = _Shown(DEFAULT_URL, None)  # no client: a plain URL needs none
    line = shown.line("scheduler doctor --fix --queue q", None)
    # Pasted in that shell, a line without --url reads REDIS_URL: prod.example, not localhost.
    assert f"--url {DEFAULT_URL}" in line, line


def test_a_purge_line_for_a_job_id_ending_in_a_colon_keeps_the_id_and_the_url(
    tcp: RedisProcess,
) -> None:
    url = f"redis://127.0.0.1:{tcp.port}/3"
    admin = redis.Redis(port=tcp.port, db=3, decode_responses=True)
    q = Queue.from_url(url, "rvd4colon")
    job = q.enqueue("t", {"n": 1}, job_id="gone:")
    # Dead with its record gone (deleted by hand): doctor's fix names `dead purge --id`.
    admin.zrem(q.keys.due, job)
    admin.zadd(q.keys.dead, {job: 1_000})
    admin.delete(q.keys.job(job), q.keys.spec(job))
    out = CliRunner(env={"COLUMNS": "300", "REDIS_URL": None}).invoke(
        main, ["doctor", "--json", "--no-server", "--url", url, "-q", q.name]
    )
    (fix,) = [f["fix"] for f in json.loads(out.output)["findings"] if f["job_id"] == job]
    command = shlex.split(fix.split("to drop it: ", 1)[1])
    assert command[command.index("--id") + 1] == "gone:", fix
    assert command[command.index("--url") + 1] == url, fix
    # The same in with_url alone.
    line = "none needed; to drop it: scheduler dead purge -q q --id a:"
    assert shlex.split(with_url(line, "redis://h:1/0"))[-3:] == ["a:", "--url", "redis://h:1/0"]


def test_a_schedule_named_slots_is_counted_as_a_schedule_hash(tcp: RedisProcess) -> None:
    client = connect(f"redis://127.0.0.1:{tcp.port}/0")
    q = Queue(client, "rvd4slots")
    q.schedule("slots", "t", every_ms=60_000)
    assert client.type(q.keys.schedule("slots")) == "hash"
    families, _ = key_families(client, q.keys)
    counts = {f.pattern: f.count for f in families}
    assert counts[q.keys.prefix + "schedule:*"] == 1, counts
    assert counts[q.keys.prefix + "schedule:*:slots"] == 0, counts


# -- what held --------------------------------------------------------------------------------


def test_the_cli_entries_list_every_command_lazily() -> None:
    """Completion lists every command from a fresh process (the lazy table registers all); a
    typo is refused with exit 2; `python -m scheduler --version` answers."""
    env = {**os.environ, "_SCHEDULER_COMPLETE": "bash_complete", "COMP_WORDS": "scheduler ",
           "COMP_CWORD": "1"}  # fmt: skip
    env.pop("REDIS_URL", None)
    code = "from scheduler.cli.main import main; main(prog_name='scheduler')"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    words = {ln.split(",", 1)[1] for ln in done.stdout.split() if "," in ln}
    assert {"worker", "workers", "demo", "doctor", "schedules", "dashboard", "keys"} <= words
    version = subprocess.run([sys.executable, "-m", "scheduler", "--version"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert version.returncode == 0 and "version" in version.stdout
    typo = CliRunner().invoke(main, ["dotor"])
    assert typo.exit_code == 2 and "No such command" in typo.output


def _float_to_ms(local: datetime, zone: ZoneInfo) -> int:
    return int(local.replace(tzinfo=zone, fold=0).timestamp() * 1000)  # the former _to_ms


@pytest.mark.parametrize(
    "zone", ["Europe/Berlin", "Australia/Lord_Howe", "Asia/Kathmandu", "Africa/Monrovia"]
)
def test_cron_slot_instants_are_unchanged_by_the_integer_conversion(zone: str) -> None:
    """Whole-minute wall times (gaps, folds, LMT offsets in seconds, negative epochs, after
    2038): the integer conversion gives the float one's instants."""
    tz = ZoneInfo(zone)
    for year in (1900, 1969, 2024, 2039, 2199):
        start = datetime(year, 1, 1)
        for step in range(0, 366 * 24 * 2, 7):
            local = start + timedelta(minutes=30 * step + 15)
            assert _to_ms(local, tz) == _float_to_ms(local, tz), (zone, local)


def test_utc_ms_rounds_up_and_reads_the_fold() -> None:
    first = datetime(2024, 10, 27, 2, 30, tzinfo=ZoneInfo("Europe/Berlin"))
    assert utc_ms(first.replace(fold=1)) - utc_ms(first) == 3_600_000
    assert utc_ms(datetime(1969, 12, 31, 23, 59, 59, 999_001, tzinfo=UTC)) == -0
    assert ceil_ms(datetime(2100, 1, 1, 0, 0, 0, 1, tzinfo=UTC)) % 1000 == 1


def test_the_flags_name_the_user_the_client_logs_in_as() -> None:
    url = "redis://bob:pw@db.internal:7000/0?username=carol"
    client = connect(url)  # no I/O until a command
    user = client.connection_pool.connection_kwargs["username"]
    flags = connection_flags(url)
    assert flags[flags.index("--user") + 1] == user == "bob", flags


def test_the_dashboards_health_fix_reaches_its_server(tcp: RedisProcess) -> None:
    url = f"redis://127.0.0.1:{tcp.port}/0"
    Queue.from_url(url, "rvd4dash").enqueue("t", None)  # persistence off: a finding
    with TestClient(create_app(url, queues=["rvd4dash"], auth=Auth())) as web:
        page = web.get("/health")
    assert page.status_code == 200
    fixes = re.findall(r"fix: <code>([^<]*)</code>", page.text)
    assert any("CONFIG SET" in f for f in fixes), fixes
    for fix in fixes:
        if "redis-cli" in fix:
            assert f"redis-cli -p {tcp.port} CONFIG" in fix, fix


def test_jobs_show_finds_a_done_job_of_a_queue_left_with_its_finished_index(
    tcp: RedisProcess,
) -> None:
    """require_queue in `jobs show`: a queue whose jobs are all done, its stats minutes gone
    and no queue index, is still found (its `finished` ZSET) and the job shown."""
    url = f"redis://127.0.0.1:{tcp.port}/0"
    client = connect(url)
    q = Queue(client, "rvd4fin")
    job = q.enqueue("t", {"a": 1}, result_ttl_ms=86_400_000)
    (leased,) = q.claim("w", limit=1, lease_ms=60_000).jobs
    q.complete(leased.id, leased.token, {"r": 1})
    client.delete(*client.keys(q.keys.prefix + "stats:*"), "sched:queues")
    runner = CliRunner(env={"COLUMNS": "200", "REDIS_URL": None})
    out = runner.invoke(main, ["jobs", "show", "--url", url, "-q", q.name, job])
    assert out.exit_code == 0 and "done" in out.output, out.output
    typo = runner.invoke(main, ["jobs", "show", "--url", url, "-q", "rvd4fni", job])
    assert typo.exit_code == 1 and "no queue named" in typo.output, typo.output
