"""The words for how a job's run ended, in one place: metric `outcome` labels, stats counters
and the worker's log events use these (docs/glossary.md)."""

from __future__ import annotations

# How one run of a job ended (the state it reached). A worker's metrics count each of these.
OUTCOMES = ("done", "retry", "dead", "cancelled", "released", "expired", "stale", "timeout")

# The per-minute stats hash's counters (written by the Lua transitions, read by `stats`). The
# outcome words are the same as above; `claim`, `fail`, `cancel`, `requeue_dead`, `misfire_skip`,
# `rearm` count transitions rather than outcomes (`rearm`: a schedule placed its next occurrence
# after its pending one left due, lib/rearm.lua); `dead_trimmed` counts dead letters the queue's
# opt-in retention deleted (lib/job.lua dead_trim).
STAT_FIELDS = (
    "claim",
    "done",
    "fail",
    "retry",
    "dead",
    "expired",
    "release",
    "cancel",
    "requeue_dead",
    "misfire_skip",
    "dead_trimmed",
    "rearm",
)

# Why flow control set a due job aside (docs/flow-control.md): `stats --json` `held`, the
# QueueCounts fields held_<reason>, the metric scheduler_queue_held_jobs{reason}, the dashboard.
HELD_REASONS = ("key_limit", "rate_window", "waiting")

# What an operator may ask of a running worker (`scheduler workers quiet|stop`, the dashboard;
# lua/worker_beat.lua hands it over): `quiet` claims nothing more and stops once the jobs it
# holds have ended; `stop` is a SIGTERM's stop (--grace, then the jobs still running released).
STOP_VERBS = ("quiet", "stop")

# Counter names stored before the vocabulary was unified: read as the new word, never written.
LEGACY_STAT_FIELDS = {"complete": "done", "lease_expired": "expired"}


def stat_field(stored: str) -> str:
    """The current name of a stored stats counter (old names map to their new word)."""
    return LEGACY_STAT_FIELDS.get(stored, stored)
