"""`scheduler worker` and `scheduler demo`."""

from __future__ import annotations

import logging
import sys
from dataclasses import replace

import click
import redis
from redis.exceptions import RedisClusterException, RedisError

from scheduler.admin.startup import (
    APP_ROLE_HINT,
    AccessDenied,
    UnsafeServer,
    check_access_async,
    check_or_warn_async,
    is_permission_error,
    permission_message,
)
from scheduler.cli.common import url_option
from scheduler.cli.worker_pool import join_pool, notify_ready
from scheduler.cli.worker_pool_start import pool_size, run_pool
from scheduler.cli.worker_start import (
    RegistryImportError,
    load_registry,
    run_loop,
    start_failure,
)
from scheduler.client.partitioned_merge import expand_labelled_async
from scheduler.core.connection import connect_async, parse_url
from scheduler.core.errors import SchedulerError
from scheduler.core.exits import EXIT_FAILED, EXIT_FORBIDDEN
from scheduler.core.safety import redact, safe
from scheduler.worker import (
    EXIT_ERROR,
    EXIT_IMPORT,
    EXIT_REDIS,
    EXIT_USAGE,
    Worker,
    WorkerSettings,
    logs,
)
from scheduler.worker.execution import TRANSIENT
from scheduler.worker.registry import Registry

# Each one line and an exit code (worker_start.start_failure); a hand-edited partition record
# is an UnreadableRecord (a SchedulerError).
_START_ERRORS: tuple[type[BaseException], ...] = (
    *TRANSIENT,
    RedisError,
    RedisClusterException,
    SchedulerError,
)


async def _serve(
    url: str,
    registry: Registry,
    settings: WorkerSettings,
    port: int | None,
    *,
    strict: bool,
    worker_id: str | None,
) -> int:
    client = connect_async(url, socket_connect_timeout=5, socket_timeout=30)
    try:
        # The names asked for first: expand_queues reads each one's partitions record, and a
        # queue the user's ACL leaves out must be refused naming it (docs/security.md).
        await check_access_async(client, settings.queues)
        queues, logical = await expand_labelled_async(client, settings.queues)
        worker = Worker(client, registry, replace(settings, queues=queues), worker_id=worker_id)
        worker.metrics.logical = logical  # a partition is labelled by its logical queue
        await worker.preflight()
        await check_access_async(client, queues)
    except AccessDenied as exc:
        click.echo(f"error: {exc}", err=True)
        await client.aclose()
        return EXIT_FORBIDDEN
    except _START_ERRORS as exc:  # what the first reads and script loads can meet
        await client.aclose()
        return start_failure(exc, url)
    try:
        await check_or_warn_async(client, strict=strict, log=worker.log.warning)
    except UnsafeServer as exc:  # a refusal, as with `enqueue --strict`
        click.echo(safe(f"error: {exc}"), err=True)
        await client.aclose()
        return EXIT_FAILED
    if port is not None:
        try:
            bound = worker.metrics.serve(port)
        except OSError as exc:  # the port is taken, or not ours to bind: one line, no trace
            why = exc.strerror or exc
            click.echo(f"error: cannot serve metrics on port {port}: {why}", err=True)
            await client.aclose()
            return EXIT_FAILED
        worker.log.info("metrics on :%d/metrics", bound)
    notify_ready()  # to a pool's supervisor (--processes): this child started
    try:
        return await worker.run()
    finally:
        await client.aclose()


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
    help="Queue to work (repeat for several).",
)
@click.option(
    "--concurrency",
    "-c",
    default=16,
    show_default=True,
    help="Jobs run at once (async on the loop, sync in threads).",
)
@click.option(
    "--processes",
    "-p",
    type=click.IntRange(0, 256),
    default=1,
    show_default=True,
    help="Worker processes (0: one per core), each with --concurrency slots, under a "
    "supervisor that restarts a dead one; process i serves --metrics-port + i - 1.",
)
@click.option(
    "--lease-ms",
    default=30_000,
    show_default=True,
    help="Lease length (1 ms .. 1 day); a crashed worker's jobs are re-run after it.",
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
    help="Timed-out sync handlers still running (a thread cannot be killed) before the worker "
    "stops claiming until one ends (default: 2x concurrency).",
)
@click.option(
    "--result-ttl-ms",
    type=int,
    default=None,
    help="How long a completed job's status and result are kept, unless its task sets "
    "result_ttl_ms (default: 3600000, 1 h).",
)
@click.option(
    "--worker-id",
    default=None,
    help="Name shown by `scheduler workers` and in logs (default: host:pid:random).",
)
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
) -> None:
    """Run handlers from REGISTRY (module:attribute, a scheduler.worker.registry.Registry).

    Exit codes: the table of `scheduler --help` (0 stopped cleanly, 1 crashed, --strict refused
    unsafe Redis settings, a queue key edited by hand at start, or --metrics-port could not be
    bound, 2 invalid settings, 3 Redis unreachable at start, 4 registry not importable, 5 the
    Redis user may not work a queue, 130 forced by a second signal).
    """
    join_pool()  # a child of --processes: stop with the supervisor
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
    )
    try:
        settings.check()
        parse_url(url)  # a bad URL (or cluster form) is a usage error, before any I/O
        n = pool_size(processes, metrics_port, worker_id)
    except Exception as exc:  # SettingsError, BadArgument, a URL redis-py refuses
        click.echo(safe(f"error: {exc}"), err=True)
        sys.exit(EXIT_USAGE)
    if n > 1:  # the children import the registry; the supervisor runs none of the user's code
        sys.exit(run_pool(n, registry, url, metrics_port, worker_id))
    try:
        reg = load_registry(registry)
    except RegistryImportError as exc:
        click.echo(safe(f"error: {exc}"), err=True)
        sys.exit(EXIT_IMPORT)
    try:
        code = run_loop(
            _serve(url, reg, settings, metrics_port, strict=strict, worker_id=worker_id)
        )
    except Exception as exc:
        if is_permission_error(exc):  # a permission revoked while running: one line
            click.echo(f"error: {permission_message(exc, APP_ROLE_HINT)}", err=True)
            sys.exit(EXIT_FORBIDDEN)
        logging.getLogger(logs.LOGGER).exception("worker crashed: %s", exc)
        code = EXIT_ERROR
    sys.exit(code)


@click.command("demo")
@click.option(
    "--url",
    envvar="REDIS_URL",
    default=None,
    help="Use this Redis (default: start a private one and stop it afterwards).",
)
@click.option(
    "--keep",
    is_flag=True,
    help="Leave the private Redis running afterwards and print the commands to explore it.",
)
def demo_cmd(url: str | None, keep: bool) -> None:
    """Watch the scheduler at work in ~15 s: on-time, delayed, failing and crashing jobs."""
    from scheduler.cli.demo import run_demo

    try:
        if url is not None:
            redis.Redis.from_url(url).close()  # redis-py's own URL refusals, before any I/O
    except ValueError as exc:
        click.echo(safe(f"error: invalid --url {redact(url or '')}: {exc}"), err=True)
        sys.exit(EXIT_USAGE)
    try:
        code = run_demo(url, keep=keep)
    except RedisError as exc:  # a --url whose server or user will not do: one line, no trace
        if is_permission_error(exc):
            click.echo(f"error: {permission_message(exc, APP_ROLE_HINT)}", err=True)
            sys.exit(EXIT_FORBIDDEN)
        click.echo(
            safe(f"error: Redis at {redact(url or '')}: {type(exc).__name__}: {exc}"), err=True
        )
        sys.exit(EXIT_REDIS)
    sys.exit(code)
