"""The task / error-type filter of the dead-letter readers (dead_ids, requeue and purge by
filter): a dead job's task is its hash's, else its spec record's. A job parked before its first
claim (a child whose parent ended dead or cancelled) has no task in its hash."""

from __future__ import annotations

from redis.exceptions import ResponseError

from scheduler.core import codec
from scheduler.core.errors import BadArgument
from scheduler.core.keys import QueueKeys
from scheduler.core.spec_record import spec_fields
from scheduler.operations.requests import Commands, Op


def matching(
    keys: QueueKeys, pairs: list[tuple[float, str]], task: str | None, error_type: str | None
) -> Op[list[tuple[float, str]]]:
    """The (dead_ms, id) pairs whose job matches every filter given."""
    for name, value in (("task", task), ("error_type", error_type)):
        if value is not None and not isinstance(value, str):
            raise BadArgument(f"{name} must be a str or None, got {value!r:.80}")
    if not pairs:
        return []
    fields = yield Commands([("HMGET", keys.job(i), "task", "last_error_type") for _, i in pairs])
    tasks = [None if t is None else codec.s(t) for t, _ in fields]
    bare = [k for k, t in enumerate(tasks) if t is None] if task is not None else []
    if bare:
        try:
            specs = yield Commands([("GET", keys.spec(pairs[k][1])) for k in bare])
        except ResponseError:  # one edited by hand into another type: read them one by one
            specs = []
            for k in bare:
                try:
                    specs += yield Commands([("GET", keys.spec(pairs[k][1]))])
                except ResponseError:
                    specs.append(None)  # that one: no task
        for k, text in zip(bare, specs, strict=True):
            read = None if text is None else spec_fields(codec.s(text), None)
            tasks[k] = None if read is None else read["task"]
    kept = []
    for pair, t, (_, et) in zip(pairs, tasks, fields, strict=True):
        if task is not None and t != task:
            continue
        if error_type is not None and (et is None or codec.s(et) != error_type):
            continue
        kept.append(pair)
    return kept
