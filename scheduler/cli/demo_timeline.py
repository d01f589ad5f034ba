"""The table `scheduler demo` ends with: what happened to each of its jobs, on the server clock,
read back from what outlives a lean finished job (its Job: state, attempts, run_at_ms, errors,
result, finished_ms) and from the demo handlers' ledger (when each attempt started)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import redis
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from scheduler.cli.demo_tasks import FLAKY_BACKOFF, LEDGER
from scheduler.client.queue import Queue
from scheduler.core.safety import clean

Event = tuple[int, str, str]  # (server ms, job label, markup text)


@dataclass(frozen=True)
class Run:
    """One run of the demo: its jobs (id -> label), the workers that died (server ms, pid,
    signal), its clock (t0_ms: the first enqueue; when the jobs were enqueued) and the
    workers' lease."""

    jobs: dict[str, str]
    deaths: list[tuple[int, int, int]]
    t0_ms: int
    enqueued_ms: int
    lease_ms: int


def _shown(stored: object) -> str:
    """Stored job text inside a markup line: control characters escaped, markup inert."""
    return escape(clean(stored))


def _retry_tail(attempt: int, max_attempts: int, err_type: str, delay_ms: int | None) -> str:
    """What came of a failed attempt; `delay_ms`: its retry's, when the job's run_at_ms says."""
    if attempt >= max_attempts:
        return "no attempts left"
    backoff_ms = FLAKY_BACKOFF.delay_ms(attempt)
    if err_type == "RetryLater":
        asked = "as asked" if delay_ms is None else f"in {delay_ms} ms"
        return f"[yellow]retry {asked}[/] (its own delay, not the backoff's {backoff_ms} ms)"
    return (
        f"[yellow]retry in {backoff_ms} ms[/] (backoff {FLAKY_BACKOFF.base_ms} ms x "
        f"{FLAKY_BACKOFF.factor:g}^{attempt - 1})"
    )


def events(q: Queue, client: redis.Redis, run: Run) -> list[Event]:
    """Every row of the timeline, in time order."""
    out: list[Event] = []
    started: dict[tuple[str, int], int] = {}  # (job id, attempt) -> server ms
    for raw in client.lrange(LEDGER, 0, -1):
        e = json.loads(raw)
        started[(e["job"], e["attempt"])] = e["at_ms"]
        label = run.jobs.get(e["job"], e["job"])
        out.append((e["at_ms"], label, f"started attempt {e['attempt']} in worker pid {e['pid']}"))
    for pid_ms, pid, sig in run.deaths:
        out.append((pid_ms, "-", f"[red]worker pid {pid} died (signal {sig})[/]; restarted"))
    for job_id, label in run.jobs.items():
        j = q.get_job(job_id)
        f = j.fields
        due_ms = (j.run_at_ms or run.t0_ms) - run.t0_ms
        due = "" if j.errors else f", due at {due_ms / 1000:+.3f}s"
        out.append((run.enqueued_ms, label, "enqueued" + due))
        failed: set[int] = set()
        for n, err in enumerate(j.errors, 1):
            attempt, at_ms = int(err["attempt"]), int(err["at_ms"])
            failed.add(attempt)
            # The job's run_at_ms is the one its last retry was given (kept whole: the webhook).
            retry_ms = j.run_at_ms - at_ms if j.run_at_ms and n == len(j.errors) else None
            tail = _retry_tail(attempt, j.max_attempts or 0, str(err["type"]), retry_ms)
            message = str(err["message"])
            if err["type"] == "RetryLater":  # "retry in N ms: why": the tail says the N
                message = re.sub(r"^retry in \d+ ms(: )?", "", message)
            out.append(
                (
                    at_ms,
                    label,
                    f"attempt {attempt} failed: {_shown(err['type'])}: {_shown(message)} -> {tail}",
                )
            )
        if j.state == "done":
            attempts = j.attempts or 0
            # An attempt before the last with no error of its own ended by its lease.
            if attempts > 1 and attempts - 1 not in failed and (job_id, attempts) in started:
                out.append(
                    (
                        started[(job_id, attempts)] - 1,
                        label,
                        f"lease of attempt {attempts - 1} expired after {run.lease_ms} ms "
                        "-> claimed again",
                    )
                )
            out.append(
                (
                    int(f["finished_ms"]),
                    label,
                    f"[green]done[/] after {j.attempts} attempt(s): {_shown(j.result_json)}",
                )
            )
        elif j.state == "dead":
            out.append(
                (
                    int(f["dead_ms"]),
                    label,
                    f"[red]dead-lettered[/] ({_shown(j.dead_reason)}); see `scheduler dead list`",
                )
            )
    return sorted(out, key=lambda e: e[0])


def print_timeline(console: Console, q: Queue, client: redis.Redis, run: Run) -> None:
    table = Table(title="What happened (server clock, from the first enqueue)")
    table.add_column("t", justify="right")
    table.add_column("job")
    table.add_column("event")
    for at, label, text in events(q, client, run):
        table.add_row(f"{(at - run.t0_ms) / 1000:+.3f}s", label, text)
    console.print(table)
