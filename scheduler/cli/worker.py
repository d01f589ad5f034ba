"""`scheduler worker` and `scheduler demo` (the worker's start sequence: worker_start.py)."""

from __future__ import annotations

import logging
import sys

import click
from redis.exceptions import RedisClusterException, RedisError

from scheduler.admin.startup import (
    APP_ROLE_HINT,
    is_permission_error,
    permission_message,
)
from scheduler.cli.common import url_option
from scheduler.cli.worker_pool_child import join_pool
from scheduler.cli.worker_signals import restored, stop_while_starting
from scheduler.core.connection import parse_url
from scheduler.core.errors import BadArgument
from scheduler.core.exits import EXIT_FORBIDDEN
from scheduler.core.limits import DEFAULT_LEASE_MS
from scheduler.core.safety import safe
from scheduler.worker import (
    EXIT_ERROR,
    EXIT_IMPORT,
    EXIT_USAGE,
    WorkerSettings,
    logs,
)


def register(main: click.Group) -> None:
    main.add_command(worker_cmd)
    main.add_command(demo_cmd)


@click.command("worker")
@click.argument("registry")
@url_option
@click.option(
    "--queue",
    "-q",
    "queues",
    multiple=True,
    default=("default",),
    show_default=True,
    envvar="SCHEDULER_QUEUE",  # as every other command's --queue (space-separated here)
    help="Queue to work (repeat for several); env SCHEDULER_QUEUE (names separated by spaces).",
)
@click.option(
    "--concurrency",
    "-c",
    default=16,
    show_default=True,
    help="Jobs run at once per process (async on the loop, sync in threads).",
)
@click.option(
    "--processes",
    "-p",
    type=click.IntRange(0, 256),
    default=1,
    show_default=True,
    help="Worker processes (0: one per core), each with --concurrency slots, under a "
    "supervisor that restarts a dead one and serves all their metrics on --metrics-port "
    '(label process="0".."N-1").',
)
@click.option(
    "--lease-ms",
    default=DEFAULT_LEASE_MS,
    show_default=True,
    help="Lease length (up to 1 day; at least 3 heartbeat intervals, so 30 ms at the least); a "
    "crashed worker's jobs are re-run after it.",
)
@click.option(
    "--heartbeat-ms",
    default=5_000,
    show_default=True,
    help="How often all leases are extended (lease must be >= 3x this).",
)
@click.option(
    "--batch", "batch_size", default=100, show_default=True, help="Jobs claimed per call at most."
)
@click.option(
    "--grace",
    "grace_s",
    default=25.0,
    show_default=True,
    help="Seconds to let running jobs finish on SIGTERM before releasing them (0..86400).",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="The least severe log lines written (to stderr).",
)
@click.option("--json-logs", is_flag=True, help="One JSON object per log line.")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus metrics on this port (0: any free one).",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Refuse to start (exit 1) when the Redis settings break the never-lost promise "
    "(persistence off, an evicting maxmemory-policy, Redis < 7); without it: a warning.",
)
@click.option(
    "--max-abandoned-threads",
    type=int,
    default=None,
    help="Stopped handlers still running (a thread cannot be killed; an async task may ignore "
    "its cancel) before the worker stops claiming until one ends (default: 2x --concurrency).",
)
@click.option(
    "--result-ttl-ms",
    type=int,
    default=None,
    help="How long a completed job's status and result are kept, unless its task sets "
    "result_ttl_ms (default: 3600000, 1 h).",
)
@click.option(
    "--max-jobs",
    type=click.IntRange(1, None),
    default=None,
    help="Exit 0 once this many jobs were claimed and have ended: a process recycled (a "
    "handler's leak contained); under --processes the pool starts another at once.",
)
@click.option(
    "--max-memory-mb",
    type=click.IntRange(1, None),
    default=None,
    help="Exit 0 the same way once this process's resident memory, read before each claim, "
    "is over this many MB.",
)
@click.option(
    "--burst",
    is_flag=True,
    help="Run the jobs claimable now, then exit 0 once none is left and none is running; "
    "jobs due later stay, however soon (a delay, a retry's backoff); one process only.",
)
@click.option(
    "--worker-id",
    default=None,
    help="Name shown by `scheduler workers` and in logs (default: host:pid:random).",
)
@restored  # the start's signal handlers (stop_while_starting), on the way out
def worker_cmd(
    registry: str,
    url: str,
    queues: tuple[str, ...],
    concurrency: int,
    lease_ms: int,
    heartbeat_ms: int,
    batch_size: int,
    grace_s: float,
    log_level: str,
    json_logs: bool,
    metrics_port: int | None,
    strict: bool,
    max_abandoned_threads: int | None,
    result_ttl_ms: int | None,
    worker_id: str | None,
    processes: int,
    burst: bool,
    max_jobs: int | None,
    max_memory_mb: int | None,
) -> None:
    """Run handlers from REGISTRY (module:attribute, a scheduler.worker.registry.Registry).

    Exit codes: the table of `scheduler --help` (0 stopped cleanly, 1 crashed, --strict refused
    unsafe Redis settings, a queue key edited by hand at start, or --metrics-port could not be
    bound, 2 invalid settings or a URL no retry mends (a refused TLS certificate, a database
    the server lacks, a cluster node's plain URL, a max_connections too small), 3 Redis
    unreachable at start, 4 registry not importable or with no task, 5 the Redis user may not
    work a queue, 130 forced by a second signal).
    """
    # Imported here, not at the top, and worker_start only past the pool's branch: it loads
    # the worker's runtime (claiming, execution, metrics), which `worker --help`, a refused
    # flag and a --processes pool's parent (it runs no job) do not need.
    from scheduler.cli.worker_pool_start import pool_size, run_pool

    in_pool = join_pool()  # a child of --processes: stop with the supervisor
    if processes == 1:  # a pool's supervisor has its own (worker_pool.py)
        stop_while_starting(in_pool)  # until the worker's own handlers replace these
    logs.setup(log_level, json_logs)
    settings = WorkerSettings(
        tuple(queues),
        concurrency,
        lease_ms,
        heartbeat_ms,
        batch_size,
        grace_s,
        max_abandoned_threads=max_abandoned_threads,
        result_ttl_ms=result_ttl_ms,
        burst=burst,
        max_jobs=max_jobs,
        max_memory_mb=max_memory_mb,
    )
    try:
        settings.check()
        if burst and processes != 1:
            raise BadArgument("--burst runs one process: drop --processes")
        parse_url(url)  # a bad URL (or cluster form) is a usage error, before any I/O
        n = pool_size(processes, worker_id)
    except Exception as exc:  # SettingsError, BadArgument, a URL redis-py refuses
        logs.console(str(exc))
        sys.exit(EXIT_USAGE)
    # The children import the registry; the supervisor runs none of the user's code. Also
    # --processes 0 on one core: a lone worker there died of the unit's reload (SIGHUP).
    if processes != 1:
        sys.exit(run_pool(n, registry, url, metrics_port, worker_id))
    from scheduler.cli.worker_start import RegistryImportError, load_registry, run_loop, serve

    try:
        reg = load_registry(registry)
    except RegistryImportError as exc:
        logs.after_registry(log_level)  # its logging.config may have disabled ours
        logs.console(str(exc))
        sys.exit(EXIT_IMPORT)
    logs.after_registry(log_level)
    if not reg.names():  # its tasks' modules never imported: each job claimed would fail
        why = "import the modules that register its tasks (@registry.task) from its module"
        logs.console(f"{registry!r} has no task registered: {why}")
        sys.exit(EXIT_IMPORT)
    try:
        code = run_loop(
            serve(
                url,
                reg,
                settings,
                metrics_port,
                strict=strict,
                worker_id=worker_id,
                in_pool=in_pool,
            ),
            lease_s=settings.lease_ms / 1000,
        )
    except Exception as exc:
        if is_permission_error(exc):  # a permission revoked while running: one line
            logs.console(permission_message(exc, APP_ROLE_HINT))
            sys.exit(EXIT_FORBIDDEN)
        logging.getLogger(logs.LOGGER).exception("worker crashed: %s", exc)
        code = EXIT_ERROR
    sys.exit(code)


@click.command("demo")
@click.option(
    "--url",
    envvar="REDIS_URL",
    default=None,
    metavar="URL",
    help="Use this Redis (default: env REDIS_URL, else start a private one and stop it "
    "afterwards).",
)
@click.option(
    "--keep",
    is_flag=True,
    help="Leave the private Redis running afterwards and print the commands to explore it.",
)
def demo_cmd(url: str | None, keep: bool) -> None:
    """Watch the scheduler at work in ~15 s: on-time, delayed, failing and crashing jobs."""
    from scheduler.cli.demo import run_demo
    from scheduler.cli.worker_start import start_failure  # the runtime: see worker_cmd

    try:
        if url is not None:
            parse_url(url)  # the one URL reader's refusals (the password redacted), before I/O
    except BadArgument as exc:
        click.echo(safe(f"error: invalid --url: {exc}"), err=True)
        sys.exit(EXIT_USAGE)
    try:
        code = run_demo(url, keep=keep)
    except (RedisError, RedisClusterException) as exc:  # a --url whose server or user won't do
        # The worker's one line and exit code: a refused password 5, not 3 (a retry cannot pass).
        sys.exit(start_failure(exc, url or "the demo's private Redis"))
    sys.exit(code)
