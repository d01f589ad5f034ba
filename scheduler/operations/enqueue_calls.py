"""enqueue_many's cut of its jobs into enqueue.lua calls (operations/producing.py).

A call holds every client of the server while it runs, so each is bounded: at most
`batch_size` and ENQUEUE_PER_CALL jobs, ENQUEUE_WORK_PER_CALL jobs + parents named, and
ENQUEUE_BYTES_PER_CALL bytes of fields (core/limits.py). The byte bound never separates a job
from a later job of the call that names it in `after` (a chain, a parent and its children):
what one call would hold stays all or nothing (docs/flow-control.md), and a group over the
bound goes as one call, as one job over it does. So a byte cut never makes a child wait for a
parent of an earlier call: only the count and work bounds send calls one at a time."""

from __future__ import annotations

from typing import Any

from scheduler.core import codec
from scheduler.core.errors import BadArgument
from scheduler.core.limits import ENQUEUE_BYTES_PER_CALL, ENQUEUE_PER_CALL, ENQUEUE_WORK_PER_CALL
from scheduler.core.models import JobSpec


def enqueue_calls(specs: list[Any], size: int, payload_max: int) -> tuple[list[list[str]], bool]:
    """Each script call's arguments, every job checked first, and whether a job names a job of
    an earlier call (the calls then go one at a time: producing.py _enqueue_in_turn)."""
    jobs: list[list[str]] = []
    sizes: list[int] = []  # UTF-8 bytes of each job's fields
    first: dict[str, int] = {}  # id -> the first job with it
    # job -> its work (1 + parents: each is read and linked, core/limits.py) and its first
    # parent of this enqueue_many (itself if none): a parent in an earlier call sends the
    # calls one at a time (producing.py _enqueue_in_turn).
    linked: dict[int, tuple[int, int]] = {}
    # Per job: the last later job naming it as a parent (-1: none). A call ends at a byte cut
    # only when none of its jobs is named by a job after the cut.
    last_child: list[int] = []
    for j, spec in enumerate(specs):
        if not isinstance(spec, JobSpec):
            raise BadArgument(f"expected JobSpec, got {spec!r}")
        fields = codec.enqueue_fields(spec, payload_max)
        parents = _parents(fields[-1])
        if parents:
            low = j
            for p in parents:
                if (k := first.get(p)) is not None:
                    last_child[k] = j
                    low = min(low, k)
            linked[j] = (1 + len(parents), low)
        first.setdefault(fields[0], j)
        last_child.append(-1)
        jobs.append(fields)
        text = "".join(fields)  # isascii is a flag read: only non-ASCII text is encoded
        sizes.append(len(text) if text.isascii() else len(text.encode()))
    size = min(size, ENQUEUE_PER_CALL)
    calls: list[list[str]] = []
    count, work, nbytes, reach, start, in_turn = size, 0, 0, -1, 0, False
    for j, fields in enumerate(jobs):
        cost, low = linked.get(j, (1, j))
        if (
            count == size
            or work + cost > ENQUEUE_WORK_PER_CALL
            or (nbytes + sizes[j] > ENQUEUE_BYTES_PER_CALL and reach < j)
        ):
            if calls:
                calls[-1][0] = str(count)
            calls.append(["0"])
            count = work = nbytes = 0
            reach, start = -1, j
        in_turn = in_turn or low < start  # calls are runs of jobs: before `start`, earlier
        calls[-1].extend(fields)
        count += 1
        work += cost
        nbytes += sizes[j]
        reach = max(reach, last_child[j])
    if calls:
        calls[-1][0] = str(count)
    return calls, in_turn


def _parents(flow: str) -> list[str]:
    # The flow field ends with the parents, space-separated (core/flow.py flow_field).
    return flow.rsplit("|", 1)[1].split() if flow else []
