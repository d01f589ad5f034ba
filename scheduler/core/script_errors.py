"""A script's error reply turned into our exception (the classes: errors.py)."""

from __future__ import annotations

from collections.abc import Sequence

from redis.exceptions import ResponseError

from scheduler.core.errors import BadArgument, CorruptKey, NewerStorage, NoReplicas, SchedulerError


def _queue_of(keys: Sequence[str]) -> str | None:
    """The queue a script ran on: the hash tag of its first key (every script's KEYS[1] is the
    queue's prefix, core/keys.py), or None for a call without one."""
    first = keys[0] if keys else ""
    start = first.find("{")
    end = first.find("}", start + 1)
    return first[start + 1 : end] if 0 <= start < end else None


def translate(exc: ResponseError, keys: Sequence[str] = ()) -> SchedulerError | ResponseError:
    """Turn a script's `CODE detail` error into our exception, a script's WRONGTYPE into
    CorruptKey and NOREPLICAS into NoReplicas; leave Redis's other errors alone. `keys`: the
    script's KEYS, whose queue NewerStorage names (a partition's own name, `<queue>.p<k>`)."""
    text = str(exc)
    if text.startswith("BAD_ARGUMENT"):
        detail = text.split(" ", 1)[1] if " " in text else text
        detail = detail.split(" script:", 1)[0]
        return BadArgument(f"refused by the server: {detail}")
    if text.startswith("NEWER_STORAGE "):
        detail = text[len("NEWER_STORAGE ") :].split(" script:", 1)[0]
        queue = _queue_of(keys)
        which = f" (queue {queue!r})" if queue else ""
        return NewerStorage(
            f"the queue is stored by a newer version: {detail}; upgrade this one{which}"
        )
    if text.startswith("NOREPLICAS"):
        detail = text.split(" script:", 1)[0].rstrip(".")
        why = "fewer good replicas than the master's min-replicas-to-write; nothing was written"
        return NoReplicas(f"{detail} ({why})")
    if text.startswith("CORRUPT "):
        return CorruptKey(text[len("CORRUPT ") :].split(" script:", 1)[0])
    if text.startswith("WRONGTYPE") and " script: " in text:
        # A key a script reads before its first write holds another type (the scripts check
        # what they write after it: tests/test_wrong_type_matrix.py). A plain command's
        # WRONGTYPE stays Redis's: the readers that tolerate one look for it.
        where = text.split(" script: ", 1)[1].strip()
        return CorruptKey(
            "a key of the queue holds another type than the script reads (edited by hand) "
            f"at script {where}: see `scheduler doctor`"
        )
    return exc
