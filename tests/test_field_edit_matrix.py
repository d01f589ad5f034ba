"""Every field of a job's record edited by hand into a hostile value (the standard's "a job hash
edited by hand in redis-cli"), against the operations that read that job, on a real server.

The busy queue of tests/test_wrong_type_matrix.py; one field of one job's hash (or its spec
record) is set to '', '-1' or '1e400', then one operation runs. It may succeed or refuse,
but: a call that raises raises a typed error (a SchedulerError, or Redis's own reply error)
having written nothing, never a crash of our own code (ValueError, KeyError, TypeError ...);
and no job loses its place (the edited one may be parked: the dead set is a place).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from scheduler import Queue, SchedulerError
from tests.conftest import Clock, dump_queue
from tests.test_wrong_type_matrix import (
    OPS,
    T0,
    World,
    _changed,
    places,
    populate,
    restore,
    snapshot,
)

VALUES = ["", "-1", "1e400"]

# The operations that read each job (names of tests/test_wrong_type_matrix.py OPS).
READS_ANY = ["get_jobs", "counts", "list_due", "list_dead", "claim", "claim_late"]
TARGETS: dict[str, list[str]] = {
    "l": ["heartbeat", "complete", "fail", "fail_dead", "release", "cancel_leased"],
    "c1": ["heartbeat_ck", "complete_ck", "fail_ck", "release_ck"],
    "p": ["complete_parent", "fail_parent", "cancel_parent", "enqueue_child"],
    "c2": ["cancel_held", "complete_ck"],
    "ch": ["cancel_child", "complete_parent", "cancel_parent", "reschedule_child"],
    "x": ["requeue_dead", "purge_dead"],
    "dn": [],
    "s": ["cancel_occurrence", "pause", "remove", "schedule_redefine", "reschedule_occurrence"],
    "d": ["cancel_due", "reschedule_due"],
    "f": ["reschedule_future"],
    "pr": ["reschedule_priority"],
}
GONE_BY_DESIGN = {("purge_dead", "x"), ("pause", "s"), ("remove", "s"), ("schedule_redefine", "s")}


def _edits(client: redis.Redis, w: World, name: str) -> list[tuple[str, str]]:
    """(key, field) pairs to edit: every field of the job's hash, and its spec record ('')."""
    jid = w.ids[name]
    out = [(w.q.keys.job(jid), str(f)) for f in sorted(client.hkeys(w.q.keys.job(jid)))]
    if client.exists(w.q.keys.spec(jid)):
        out.append((w.q.keys.spec(jid), ""))
    return out


def _edit(client: redis.Redis, key: str, field: str, value: str) -> None:
    if field:
        client.hset(key, field, value)
    else:
        client.set(key, value)


def _run(w: World, op: Callable[[World], Any]) -> str | None:
    """None, or what went wrong."""
    q, client = w.q, w.client
    before_places = places(w)
    before = dump_queue(client, q)
    try:
        op(w)
    except (SchedulerError, redis.ResponseError) as exc:
        diff = _changed(before, dump_queue(client, q))
        if diff:
            return (
                f"raised {str(exc)[:70]!r} after writing {[k[len(q.keys.prefix) :] for k in diff]}"
            )
        return None
    except Exception as exc:  # our own code broke on the stored data
        return f"crashed {type(exc).__name__}: {str(exc)[:100]}"
    after = places(w)
    lost = [n for n, was in before_places.items() if was and not after[n]]
    return f"lost {lost}" if lost else None


@pytest.mark.parametrize("name", list(TARGETS))
def test_a_hand_edited_field_is_refused_or_survived_never_half_written(
    tq: tuple[Queue, Clock], client: redis.Redis, name: str
) -> None:
    q, clock = tq
    w = populate(q, clock, client)
    clock.set_ms(T0 + 2)
    saved = snapshot(client, q)
    problems: list[str] = []
    for key, field in _edits(client, w, name):
        for value in VALUES:
            for op_name in TARGETS[name] + READS_ANY:
                restore(client, q, saved)
                _edit(client, key, field, value)
                why = _run(w, OPS[op_name])
                if why and not (why.startswith("lost") and (op_name, name) in GONE_BY_DESIGN):
                    what = field or "spec record"
                    problems.append(f"{name}.{what}={value!r} {op_name}: {why}")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:60])
