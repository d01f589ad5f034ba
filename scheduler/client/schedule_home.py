"""A schedule defined on a partition's own queue (`Queue("<name>.p<k>")`, `schedules add -q
<name>.p<k>`) must be one its partitioned queue routes there (core/partitions.py
Layout.check_schedule_home): else the logical queue holds two schedules of one name. One GET of
the parent's layout record, only for a queue named as a partition (PARTITION_NAME)."""

from __future__ import annotations

from typing import Any

from scheduler.core import loop_guard
from scheduler.core.partitions import PARTITION_NAME, Layout, meta_key


def check_schedule_home(client: Any, queue: str, name: str) -> None:
    """BadArgument (nothing written) when `queue` is a partition and `name` routes elsewhere."""
    m = PARTITION_NAME.match(queue)
    if m is not None:
        _check(queue, name, m.group(1), client.get(meta_key(m.group(1))))


async def check_schedule_home_async(client: Any, queue: str, name: str) -> None:
    """check_schedule_home for a redis.asyncio client."""
    m = PARTITION_NAME.match(queue)
    if m is not None:
        loop_guard.check(client, "AsyncQueue")  # the GET is the call's first (as AsyncQueue's)
        _check(queue, name, m.group(1), await client.get(meta_key(m.group(1))))


def _check(queue: str, name: str, parent: str, raw: Any) -> None:
    if raw is None:
        return  # `parent` is not partitioned: `queue` is a plain queue
    # Whatever the client's decode_responses; a record that is not UTF-8 Layout.parse refuses
    # (UnreadableRecord, a BadArgument: `queue` may be a partition, see `scheduler doctor`).
    text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else str(raw)
    Layout.parse(parent, text).check_schedule_home(queue, name)
