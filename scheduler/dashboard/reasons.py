"""Why a job is not running right now, in words, for the job page.

The one place these reasons are worked out: flow control (priorities, concurrency keys, rate
limits, dependencies) adds its reasons here, each as one more `Reason`, and the job page shows
every reason returned without any change to the template."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.core.models import Job, JobState


@dataclass(frozen=True)
class Reason:
    code: str  # stable: 'scheduled', 'waiting-for-worker', 'no-live-worker', 'dead', ...
    text: str


def why_not_running(job: Job, now_ms: int, live_workers: int) -> list[Reason]:
    """Reasons the job is not being run now; [] when it is running (leased)."""
    state = job.state
    if state == JobState.LEASED:
        return []
    if state == JobState.SCHEDULED:
        run_at = job.run_at_ms
        wait = "" if run_at is None else f" in {max(run_at - now_ms, 0) // 1000} s"
        return [Reason("scheduled", f"its run time has not come yet (due{wait})")]
    if state == JobState.DUE:
        if live_workers == 0:
            return [Reason("no-live-worker", "it is due, but no worker of this queue is alive")]
        return [Reason("waiting-for-worker", "it is due and waits for a free worker slot")]
    if state == JobState.DEAD:
        why = job.dead_reason or "unknown"
        return [Reason("dead", f"it is a dead letter ({why}): requeue it to run it again")]
    if state == JobState.DONE:
        return [Reason("done", "it has finished")]
    if state == JobState.CANCELLED:
        return [Reason("cancelled", "it was cancelled")]
    return [Reason("unknown-state", f"its stored state {state!r} is not one this version knows")]
