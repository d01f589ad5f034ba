"""`scheduler enqueue`: add one job from the command line."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click

from scheduler.admin.startup import check_or_warn
from scheduler.cli.common import (
    AdminCommand,
    BadInput,
    Duration,
    backoff_option,
    connect,
    emit_json,
    json_option,
    parse_at,
    queue_option,
    timeout_option,
    url_option,
)
from scheduler.client.partitioned import open_queue
from scheduler.core.backoff import Backoff
from scheduler.core.errors import BadArgument
from scheduler.core.flow import check_flow
from scheduler.core.keys import QueueKeys
from scheduler.core.safety import safe
from scheduler.operations.ops import Op, Ops, Settings


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _one_value_per_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of a repeated key: the other value would be lost unseen (the
    # API refuses such a payload, InvalidPayload, for the same reason).
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key!r} is given twice (one value would be lost)")
        out[key] = value
    return out


def parse_payload(text: str) -> Any:
    try:
        return json.loads(
            text, parse_constant=_reject_constant, object_pairs_hook=_one_value_per_key
        )
    except ValueError as exc:
        raise BadInput(f"--payload is not valid JSON: {exc}") from None
    except RecursionError:  # Python's parser gives up near 1,000 levels; no payload needs them
        raise BadInput("--payload is nested too deeply") from None


def checked_offline(op: Op[Any]) -> None:
    """Run an operation's own checks, which come before its first request, with no connection:
    a refused value is a usage error (exit 2) also while Redis is down."""
    try:
        next(op)
    except StopIteration:
        pass
    except BadArgument as exc:  # InvalidPayload too
        raise BadInput(str(exc)) from None
    finally:
        op.close()


@click.command(cls=AdminCommand)
@url_option
@queue_option
@json_option
@click.argument("task")
@click.option("--payload", default="null", show_default=True, help="The job's JSON payload.")
@click.option(
    "--at",
    "at_text",
    metavar="ISO8601",
    help="Run at this time, with an offset: 2030-01-01T09:00:00Z.",
)
@click.option("--in", "in_ms", type=Duration(), help="Run after this delay: 30s, 5m, 1h30m.")
@click.option(
    "--start-within",
    "start_within_ms",
    type=Duration(),
    help="Start it within this long of its run time or not at all (parked: start deadline passed).",
)
@click.option(
    "--jitter",
    "jitter_ms",
    type=Duration(),
    default=0,
    help="Spread the run time by a random [0, this].",
)
@click.option("--key", help="Idempotency key: a second enqueue with it returns the first id.")
@click.option(
    "--key-ttl",
    "key_ttl_ms",
    type=Duration(),
    help="How long --key is held past the run time (default 24h).",
)
@click.option(
    "--debounce",
    is_flag=True,
    help="With --key: replace the job the key names while it has not started (same id).",
)
@click.option("--job-id", help="Choose the id (re-sending the same id enqueues nothing more).")
@click.option("--after", multiple=True, help="Run once this job (an id; repeatable) is done.")
@click.option(
    "--result-ttl",
    "result_ttl_ms",
    type=Duration(),
    help="Keep its outcome this long once done (default: the task's result_ttl_ms, else the "
    "worker's --result-ttl-ms, 1 h).",
)
@click.option("--keep-payload", is_flag=True, help="Keep the payload with its outcome once done.")
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Attempts, the first included, before it is parked as dead (up to 1,000,000; a task's "
    "own max_attempts does not apply to this command).",
)
@timeout_option
@backoff_option
@click.option("--priority", type=int, default=0, show_default=True, help="0..9, higher runs first.")
@click.option("--concurrency-key", help="At most --concurrency-limit jobs of this key at once.")
@click.option(
    "--concurrency-limit",
    type=int,
    help="At most this many jobs of --concurrency-key leased at once (1..10,000).",
)
@click.option("--rate-limit", help="N starts per window, e.g. 10/1s or 100/m.")
@click.option("--rate-key", help="What --rate-limit counts (default: the task name).")
@click.option(
    "--strict",
    is_flag=True,
    help="Refuse (exit 1) when the Redis settings can lose jobs; else warn.",
)
def enqueue(
    url: str,
    queue: str,
    as_json: bool,
    task: str,
    payload: str,
    at_text: str | None,
    in_ms: int | None,
    start_within_ms: int | None,
    jitter_ms: int,
    key: str | None,
    key_ttl_ms: int | None,
    debounce: bool,
    job_id: str | None,
    after: tuple[str, ...],
    result_ttl_ms: int | None,
    keep_payload: bool,
    max_attempts: int,
    timeout_ms: int,
    backoff: Backoff | None,
    priority: int,
    concurrency_key: str | None,
    concurrency_limit: int | None,
    rate_limit: str | None,
    rate_key: str | None,
    strict: bool,
) -> None:
    """Add a job; prints its id. Everything is checked before anything is written."""
    data = parse_payload(payload)
    flow = {
        "priority": priority,
        "concurrency_key": concurrency_key,
        "concurrency_limit": concurrency_limit,
        "rate_limit": rate_limit,
        "rate_key": rate_key,
        "after": list(after) or None,
    }
    try:
        check_flow(task, **flow)  # docs/flow-control.md; refused before connecting
    except BadArgument as exc:
        raise BadInput(str(exc)) from None
    if at_text is not None and in_ms is not None:
        raise BadInput("give --at or --in, not both")
    run_at: datetime | None = None
    if at_text is not None:
        try:
            run_at = parse_at(at_text)
        except BadArgument as exc:
            raise BadInput(str(exc)) from None
    spec: dict[str, Any] = dict(
        run_at=run_at, delay_ms=in_ms, start_within_ms=start_within_ms, jitter_ms=jitter_ms,
        key=key, key_ttl_ms=key_ttl_ms, debounce=debounce, job_id=job_id,
        result_ttl_ms=result_ttl_ms, keep_payload=keep_payload, max_attempts=max_attempts,
        timeout_ms=timeout_ms, backoff=backoff, **flow,
    )  # fmt: skip
    # The API's own checks first (they precede its first request): a bad value is a usage
    # error also while Redis is down, not 'cannot reach Redis'.
    checked_offline(Ops(QueueKeys(queue), Settings()).enqueue(task, data, **spec))
    client = connect(url)
    # A job accepted by a server that can drop it would make the returned id a false promise.
    check_or_warn(client, strict=strict, url=url,
                  log=lambda m: click.echo(safe(f"warning: {m}"), err=True))  # fmt: skip
    # A partitioned queue: the job goes to its partition (by --key, else round robin).
    job_id = open_queue(client, queue).enqueue(task, data, **spec)
    if as_json:
        emit_json({"id": job_id, "queue": queue, "task": task})
    else:
        click.echo(safe(job_id))  # with --key: the id stored under it, possibly hand-edited
