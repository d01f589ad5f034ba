"""A typed payload's shallow field checks (worker/payloads.py): a TypedDict's keys, and each
field hinted with a plain class, at enqueue (`encoding`: refused if JSON would not read it back
as that class) and at decode."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, get_type_hints

from scheduler.core.errors import BadArgument


def check_typeddict(tp: type, payload: Any, encoding: bool = False) -> None:
    if not isinstance(payload, dict):
        raise BadArgument(f"payload must be a {tp.__name__} (a dict), got {type(payload).__name__}")
    required: frozenset[str] = getattr(tp, "__required_keys__", frozenset())
    optional: frozenset[str] = getattr(tp, "__optional_keys__", frozenset())
    missing = sorted(required - payload.keys())
    unknown = sorted(payload.keys() - required - optional, key=repr)  # keys of any type
    if missing or unknown:
        raise BadArgument(f"payload for {tp.__name__}: missing {missing}, unknown {unknown}")
    check_fields(tp, payload, encoding)


_JSON_TYPES = (dict, list, str, int, float, bool, type(None))


@functools.cache
def _json_can_be(hint: type) -> bool:
    """Some value JSON reads back passes the decode's isinstance check of `hint` (a StrEnum,
    an IntEnum, a tuple or a NamedTuple does not: JSON gives a str, an int, a list)."""
    try:
        return any(issubclass(j, hint) for j in _JSON_TYPES)
    except TypeError:  # a class whose __subclasscheck__ refuses: left to the decode
        return True


def _json_name(value: Any) -> str | None:
    """The JSON type `value` is written as (and read back as); None when it is not JSON."""
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, dict) or dataclasses.is_dataclass(value):
        return "dict"
    return next((j.__name__ for j in _JSON_TYPES if isinstance(value, j)), None)


@functools.cache
def _class_hints(tp: type) -> tuple[tuple[str, type], ...]:
    """tp's fields hinted with a plain class, read once per type: get_type_hints on each build
    cost more than the rest of a typed job's run (bench/worker_hot_path.py with a dataclass
    payload: ~317k instructions per job against 133k untyped). A lookup that raises is not
    kept (functools.cache keeps returns only): a hint importable later is read then."""
    return tuple((k, h) for k, h in get_type_hints(tp).items() if isinstance(h, type))


def check_fields(tp: type, values: dict[str, Any], encoding: bool = False) -> None:
    """Shallow: a field hinted with a plain class is checked with isinstance (an int passes
    for a float, as JSON reads 1.0 back as 1); generics (list[int], ...) and unions are not.
    `encoding` (enqueue): a value whose JSON form the decode's check would refuse is refused."""
    try:
        hints = _class_hints(tp)
    except Exception:  # a hint naming what is not importable here: left unchecked
        return
    for key, hint in hints:
        if key not in values:
            continue
        value = values[key]
        try:
            fits = isinstance(value, hint)
        except TypeError:  # typing.Any is a class from 3.11 on, and others refuse isinstance
            continue
        if fits or (hint is float and type(value) is int):
            if encoding and not _json_can_be(hint):
                back = _json_name(value)
                why = f"JSON reads it back as {back}" if back else "it is not JSON"
                raise BadArgument(
                    f"payload[{key!r}] is hinted {hint.__name__}: {why}, which the worker's"
                    " decode refuses: hint the field with a JSON type, or use a pydantic model"
                    " (it converts)"
                )
            continue
        raise BadArgument(f"payload[{key!r}] must be {hint.__name__}, got {type(value).__name__}")
