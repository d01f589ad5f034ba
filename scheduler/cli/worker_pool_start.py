"""The command lines of a worker pool's children (`scheduler worker --processes N`), made from
the worker command's own options, so an option added to `scheduler worker` reaches every child
without a change here."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import click

from scheduler.cli.worker_pool import Pool
from scheduler.core.keys import check_job_id
from scheduler.worker import SettingsError


def pool_size(processes: int, metrics_port: int | None, worker_id: str | None) -> int:
    """How many processes `--processes` asks for (0: one per core); settings the pool cannot
    honour raise, before any child starts."""
    n = processes or _cores()
    if worker_id is not None:  # the same safe alphabet: it becomes part of a key name
        check_job_id(worker_id if n == 1 else f"{worker_id}.{n}")
    if n > 1 and metrics_port and metrics_port + n - 1 > 65535:
        raise SettingsError(f"--metrics-port {metrics_port} + {n} processes passes 65535")
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
    (`ps` shows argv to every user, and the URL may hold a password). Child i (from 0) serves
    metrics on metrics_port + i (0: a free port each) and is named worker_id.(i+1)."""
    argvs, envs = [], []
    for i in range(n):
        argv = [sys.executable, "-m", "scheduler", "worker", registry, *options]
        if metrics_port is not None:
            argv += ["--metrics-port", str(metrics_port + i if metrics_port else 0)]
        if worker_id is not None:
            argv += ["--worker-id", f"{worker_id}.{i + 1}"]
        argvs.append(argv)
        envs.append(dict(os.environ, REDIS_URL=url))
    return argvs, envs


# Options a pool passes on to each child unchanged; --url goes through the environment, and
# --metrics-port and --worker-id differ per child (child_commands).
_PER_CHILD = {"url", "processes", "metrics_port", "worker_id"}


def run_pool(
    n: int, registry: str, url: str, metrics_port: int | None, worker_id: str | None
) -> int:
    """Run `scheduler worker`'s pool: its options (this click context's) passed on to each of
    n children."""
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
    return Pool(n, argv, env).run()
