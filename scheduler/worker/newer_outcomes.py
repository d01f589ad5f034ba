"""At a stop, the outcomes of a queue a newer version has taken over: its complete / fail are
refused with NewerStorage until this worker is upgraded, which a stopping worker never is, so
they are given up at once instead of sent again until the settle bound: their leases lapse and
a newer worker runs those jobs again (at-least-once)."""

from __future__ import annotations

import time

from scheduler.core.errors import newer_storage
from scheduler.core.keys import STORAGE_GENERATION
from scheduler.worker.core import _within
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
    gone = [r for r, _ in w._completes if r.queue in newer]
    gone += [r for r, _, _ in w._fails if r.queue in newer]
    w._completes[:] = [c for c in w._completes if c[0].queue not in newer]
    w._fails[:] = [f for f in w._fails if f[0].queue not in newer]
    for r in gone:
        w._forget(r)
        w.metrics.outcome(r.queue, r.job.task, "stale")
    w.log.warning(
        "%d outcomes given up at stop: queue %s is stored by a newer version (NewerStorage), "
        "which refuses them; their leases lapse and a newer worker runs those jobs again "
        "(at-least-once)",
        len(gone),
        ", ".join(sorted(newer)),
    )
