"""At a stop, the outcomes of a queue refused until someone acts: a newer version has taken it
over (NewerStorage until this worker is upgraded, which a stopping worker never is), or a key of
it was edited by hand (CorruptKey until `scheduler doctor`'s fix). They are given up at once
instead of sent again until the settle bound: their leases lapse and another worker runs those
jobs again (at-least-once)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from scheduler.core.errors import REFUSED_UNTIL_FIXED, NewerStorage, newer_storage
from scheduler.core.keys import STORAGE_GENERATION
from scheduler.worker.core import _within

if TYPE_CHECKING:  # reporting.py calls give_up_refused
    from scheduler.worker.execution import Running
    from scheduler.worker.reporting import Reporting

_PROBE_S = (
    1.0  # at most this of the settle bound: a server that does not answer is flushed as before
)


async def give_up_newer(w: Reporting, deadline: float) -> None:
    """Drop the pending outcomes of queues a newer version stores (one HGET of each pending
    queue's generation); logged once, each counted under `stale` (a result refused)."""
    names = sorted({r.queue for r, _ in w._completes} | {r.queue for r, _, _ in w._fails})
    if not names:
        return
    pipe = w.client.pipeline(transaction=False)
    for name in names:
        pipe.hget(w._by_name[name].keys.config, "generation")
    try:
        got = await _within(pipe.execute(), min(deadline - time.monotonic(), _PROBE_S))
    except Exception:
        return  # not read: the flush sends them, as before
    newer = {n for n, g in zip(names, got, strict=True) if newer_storage(n, g, STORAGE_GENERATION)}
    if not newer:
        return
    gone = [(r, "complete") for r, _ in w._completes if r.queue in newer]
    gone += [(r, "fail") for r, _, _ in w._fails if r.queue in newer]
    w._completes[:] = [c for c in w._completes if c[0].queue not in newer]
    w._fails[:] = [f for f in w._fails if f[0].queue not in newer]
    why = "is stored by a newer version (NewerStorage)"
    _given_up(w, gone, ", ".join(sorted(newer)), why, "NewerStorage")


def give_up_refused(w: Reporting, rs: Sequence[Running], exc: BaseException, call: str) -> bool:
    """Once the reporter is stopped: rs's outcomes, refused with `exc`, are given up when it is
    a refusal until a fix or an upgrade (True). The reporter itself sends them again.
    call: "complete" or "fail", the call refused (logged as `refused=<call>`)."""
    if not w._stop_reporter.is_set() or not isinstance(exc, REFUSED_UNTIL_FIXED):
        return False
    newer = isinstance(exc, NewerStorage)
    why = (
        "is stored by a newer version (NewerStorage)"
        if newer
        else f"has a key edited by hand (CorruptKey: {exc}; see `scheduler doctor`)"
    )
    status = "NewerStorage" if newer else "CorruptKey"
    _given_up(w, [(r, call) for r in rs], ", ".join(sorted({r.queue for r in rs})), why, status)
    return True


def _given_up(
    w: Reporting, gone: Sequence[tuple[Running, str]], queues: str, why: str, status: str
) -> None:
    """Each (run, the call refused) counted and logged `stale`, `refused=<call>`, with the
    server's answer as `status` (its error class: the glossary's "the server's status")."""
    for r, call in gone:
        w._forget(r)
        w.metrics.outcome(r.queue, r.job.task, "stale")
        # Its line and hooks, as for any outcome the worker counts (README: on_outcome).
        w._log_job("stale", r, level=logging.WARNING, refused=call, status=status)
    note = w._log_limit.admit(("outcomes given up", why.split(" (", 1)[0]))
    if note is not None:
        w.log.warning(
            "%d outcomes given up at stop: queue %s %s, which refuses them; their leases lapse "
            "and another worker runs those jobs again (at-least-once)%s",
            len(gone),
            queues,
            why,
            note,
        )
