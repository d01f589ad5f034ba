"""`scheduler jobs cancel` (scheduler/cli/job_cancel.py) gives the same outcome whatever order
it meets the jobs in: each job it cancels (selected by --state / --task, or given by id) is
cancelled before any job it waits for, so none is parked by its parent's cancel; a waiting job
it leaves out is parked as dead when a parent it waits for is cancelled, as Queue.cancel does.
Before, cancelling a parent first parked its selected waiting child (dead, 'parent cancelled'),
cancelling the child first cancelled it: the visit order (run times, ids' order) decided."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner, Result

from scheduler import Queue
from scheduler.cli.main import main
from scheduler.core import exits

HOUR_MS = 3_600_000


def cancel(redis_url: str, q: Queue, *args: str) -> Result:
    return CliRunner().invoke(
        main, ["jobs", "cancel", "--url", redis_url, "--queue", q.name, "--yes", *args]
    )


def _chain(q: Queue, parent_first: bool) -> tuple[str, str, str]:
    """A scheduled root, a child waiting on it and a grandchild waiting on the child: both
    held, the child's run time before the grandchild's (visited first) or after."""
    root = q.enqueue("t", None, delay_ms=HOUR_MS)
    child = q.enqueue("t", None, after=[root], delay_ms=HOUR_MS // 2 if parent_first else HOUR_MS)
    grandchild = q.enqueue("t", None, after=[child], delay_ms=HOUR_MS * 3 // 4)
    return root, child, grandchild


@pytest.mark.parametrize("parent_first", [True, False], ids=["parent-first", "child-first"])
def test_state_held_cancels_both_of_a_chain_in_any_order(
    redis_url: str, q: Queue, parent_first: bool
) -> None:
    root, child, grandchild = _chain(q, parent_first)
    got = cancel(redis_url, q, "--state", "held", "--json")
    assert got.exit_code == 0, got.output
    out: Any = json.loads(got.stdout)
    assert (out["matched"], out["cancelled"], out["before"]) == (2, 2, {"held": 2})
    assert q.status(child) == q.status(grandchild) == "cancelled"
    assert q.dead_ids() == [] and q.status(root) == "scheduled"


@pytest.mark.parametrize("parent_first", [True, False], ids=["parent-first", "child-first"])
def test_ids_in_any_order_are_all_cancelled(redis_url: str, q: Queue, parent_first: bool) -> None:
    root, child, grandchild = _chain(q, parent_first=True)
    ids = [root, child, grandchild] if parent_first else [grandchild, child, root]
    got = cancel(redis_url, q, *ids, "--json")
    assert got.exit_code == 0, got.output
    out: Any = json.loads(got.stdout)
    assert out["jobs"] == {root: "scheduled", child: "held", grandchild: "held"}
    assert {q.status(i) for i in ids} == {"cancelled"} and q.dead_ids() == []


def test_a_waiting_job_left_out_is_parked_and_one_below_it_selected_is_cancelled(
    redis_url: str, q: Queue
) -> None:
    # a (task x) <- b (task y, left out by --task x) <- d (task x): d is cancelled before a,
    # whichever comes first in flow:held; b is parked by a's cancel.
    root = q.enqueue("t", None, delay_ms=HOUR_MS)
    a = q.enqueue("x", None, after=[root], delay_ms=HOUR_MS // 4)
    b = q.enqueue("y", None, after=[a], delay_ms=HOUR_MS // 2)
    d = q.enqueue("x", None, after=[b], delay_ms=HOUR_MS * 3 // 4)
    got = cancel(redis_url, q, "--state", "held", "--task", "x", "--json")
    assert got.exit_code == 0, got.output
    assert json.loads(got.stdout)["before"] == {"held": 2}
    assert q.status(a) == q.status(d) == "cancelled"
    assert q.dead_ids() == [b] and q.get_job(b).dead_reason == f"parent cancelled: {a}"


def test_state_scheduled_parks_the_waiting_children_it_leaves_out(redis_url: str, q: Queue) -> None:
    parent = q.enqueue("t", None, delay_ms=HOUR_MS)
    child = q.enqueue("t", None, after=[parent], delay_ms=HOUR_MS)
    got = cancel(redis_url, q, "--state", "scheduled")
    assert got.exit_code == 0, got.output
    assert q.status(parent) == "cancelled"
    assert q.get_job(child).dead_reason == f"parent cancelled: {parent}"
    again = cancel(redis_url, q, child)  # dead: not cancelled, exit 1
    assert again.exit_code == exits.EXIT_FAILED
