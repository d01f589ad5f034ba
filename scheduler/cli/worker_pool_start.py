"""The command lines of a worker pool's children (`scheduler worker --processes N`), made from
the worker command's own options, so an option added to `scheduler worker` reaches every child
without a change here."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

import click

from scheduler.cli.exit_watchdog import EXIT_WATCHDOG_S
from scheduler.cli.stall_watchdog import FROZEN_MARGIN_S, STALL_MIN_S
from scheduler.cli.worker_pool import Pool
from scheduler.cli.worker_pool_metrics import PoolMetrics
from scheduler.core.claim_reply import check_worker_id
from scheduler.core.errors import BadArgument
from scheduler.worker.logs import LOGGER

log = logging.getLogger(LOGGER)


def pool_size(processes: int, worker_id: str | None) -> int:
    """How many processes `--processes` asks for (0: one per core); settings the pool cannot
    honour raise, before any child starts."""
    n = processes or _cores()
    if worker_id is not None:  # what claim takes (the API's rule), each child's suffix included
        lone = processes == 1  # else a pool, of one too (--processes 0 on one core)
        try:
            check_worker_id(worker_id if lone else f"{worker_id}.{n}")
        except BadArgument:
            raise BadArgument(
                f"invalid --worker-id {worker_id!r:.80}: 1-200 bytes of valid Unicode (UTF-8)"
                + ("" if lone else f" with its process suffix .{n}")
            ) from None
    return n


def _cores() -> int:
    """The cores this process may run on (its affinity mask, which containers narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def child_commands(
    n: int,
    options: Sequence[str],
    *,
    url: str,
    registry: str,
    metrics_port: int | None,
    worker_id: str | None,
) -> tuple[list[list[str]], list[dict[str, str]]]:
    """Each child's command line and environment. The URL goes through REDIS_URL, never argv
    (`ps` shows argv to every user, and the URL may hold a password). With metrics_port, each
    child serves its metrics on a free port of 127.0.0.1 (`--metrics-port 0` in a pool), which
    the supervisor serves on metrics_port; child i (from 0) is named worker_id.(i+1)."""
    argvs, envs = [], []
    for i in range(n):
        argv = [sys.executable, "-m", "scheduler", "worker", registry, *options]
        if metrics_port is not None:
            argv += ["--metrics-port", "0"]
        if worker_id is not None:
            argv += ["--worker-id", f"{worker_id}.{i + 1}"]
        argvs.append(argv)
        envs.append(dict(os.environ, REDIS_URL=url))
    return argvs, envs


# The shutdown's own waits after the grace (flushing outcomes, releasing, the final beat), each
# bounded by the worker's settle budget (settings._SETTLE_S, 5 s) or less: a generous sum.
_SHUTDOWN_S = 15.0


def stop_deadline_s(grace_s: float, lease_ms: int) -> float:
    """How long after asking a child to stop the supervisor kills it (worker_pool.py): past
    every bound of the child's own, which end a lone worker too: --grace, the shutdown's waits,
    the stall watchdog (the lease, at least STALL_MIN_S: a held event loop; FROZEN_MARGIN_S
    more for a held GIL) and the exit watchdog's two waits. A child still running then is
    stuck where none of those acts (stopped: SIGSTOP, a debugger; a kernel wait)."""
    stall_s = max(lease_ms / 1000, STALL_MIN_S) + FROZEN_MARGIN_S
    return grace_s + _SHUTDOWN_S + stall_s + 2 * EXIT_WATCHDOG_S


# Options a pool passes on to each child unchanged; --url goes through the environment, the
# supervisor serves --metrics-port itself, and --worker-id differs per child (child_commands).
_PER_CHILD = {"url", "processes", "metrics_port", "worker_id"}


def run_pool(
    n: int, registry: str, url: str, metrics_port: int | None, worker_id: str | None
) -> int:
    """Run `scheduler worker`'s pool: its options (this click context's) passed on to each of
    n children; with metrics_port, the children's metrics served there, bound before any child
    starts (a port that cannot be bound: exit 1, as for one worker)."""
    ctx = click.get_current_context()
    options: list[str] = []
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name in _PER_CHILD:
            continue
        value, flag = ctx.params[param.name or ""], max(param.opts, key=len)
        if param.is_flag:
            options += [flag] if value else []
        elif param.multiple:
            for v in value:
                options += [flag, str(v)]
        elif value is not None:
            options += [flag, str(value)]
    argv, env = child_commands(
        n, options, url=url, registry=registry, metrics_port=metrics_port, worker_id=worker_id
    )
    metrics = None
    if metrics_port is not None:
        try:
            metrics = PoolMetrics(metrics_port)
        except OSError as exc:
            # Here, not at the top: worker_start loads the worker's runtime, which the pool's
            # parent (it only starts and watches children) never runs.
            from scheduler.cli.worker_start import metrics_port_failure

            return metrics_port_failure(metrics_port, exc)
        log.info("metrics on :%d/metrics", metrics.port)
    try:
        deadline_s = stop_deadline_s(ctx.params["grace_s"], ctx.params["lease_ms"])
        return Pool(n, argv, env, metrics, deadline_s).run()
    finally:
        if metrics is not None:
            metrics.close()
