"""Typed payloads: a task's `payload_type` (dataclass, TypedDict or pydantic model) checked at
enqueue (`encode_payload`) and decoded for the handler (`decode_payload`); the wire stays JSON."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any, get_type_hints, is_typeddict

from scheduler.core.errors import BadArgument
from scheduler.worker.context import JobContext

Handler = Callable[[Any, JobContext], Any]


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (enqueue refuses it: written by hand?)")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text[:40]} is out of a float's range (enqueue refuses it)")
    return value


# A stored payload is read as strictly as enqueue writes it: NaN, Infinity and a number past a
# float's range (edited by hand) park the job as InvalidPayload instead of reaching the handler.
_STORED = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite)
load_stored = _STORED.decode


def payload_kind(tp: type) -> str | None:
    """ "dataclass", "typeddict" or "pydantic"; None for a type that cannot be a payload_type."""
    if dataclasses.is_dataclass(tp):
        return "dataclass"
    if is_typeddict(tp):
        return "typeddict"
    if callable(getattr(tp, "model_validate", None)) and callable(getattr(tp, "model_dump", None)):
        return "pydantic"
    return None


def _check_typeddict(tp: type, payload: Any) -> None:
    if not isinstance(payload, dict):
        raise BadArgument(f"payload must be a {tp.__name__} (a dict), got {type(payload).__name__}")
    required: frozenset[str] = getattr(tp, "__required_keys__", frozenset())
    optional: frozenset[str] = getattr(tp, "__optional_keys__", frozenset())
    missing = sorted(required - payload.keys())
    unknown = sorted(payload.keys() - required - optional)
    if missing or unknown:
        raise BadArgument(f"payload for {tp.__name__}: missing {missing}, unknown {unknown}")
    _check_fields(tp, payload)


def _check_fields(tp: type, values: dict[str, Any]) -> None:
    """Shallow: a field hinted with a plain class is checked with isinstance (an int passes
    for a float, as JSON reads 1.0 back as 1); generics (list[int], ...) and unions are not."""
    try:
        hints = get_type_hints(tp)
    except Exception:  # a hint naming what is not importable here: left unchecked
        return
    for key, hint in hints.items():
        if key not in values or not isinstance(hint, type):
            continue
        value = values[key]
        if isinstance(value, hint) or (hint is float and type(value) is int):
            continue
        raise BadArgument(f"payload[{key!r}] must be {hint.__name__}, got {type(value).__name__}")


def encode_payload(tp: type, payload: Any) -> Any:
    """Check `payload` against `tp`; returns its JSON-able form (BadArgument if it does not fit)."""
    kind = payload_kind(tp)
    if kind == "typeddict":
        _check_typeddict(tp, payload)
        return payload
    if kind == "dataclass":
        if not isinstance(payload, tp):
            raise BadArgument(f"payload must be a {tp.__name__}, got {type(payload).__name__}")
        _check_fields(tp, {f.name: getattr(payload, f.name) for f in dataclasses.fields(tp)})
        return dataclasses.asdict(payload)  # type: ignore[call-overload]
    if kind == "pydantic":
        if not isinstance(payload, tp):
            raise BadArgument(f"payload must be a {tp.__name__}, got {type(payload).__name__}")
        return payload.model_dump(mode="json")  # type: ignore[attr-defined]
    raise BadArgument(f"unsupported payload_type {tp!r}")


def decode_payload(tp: type, payload: Any) -> Any:
    """The handler's view of a JSON payload. A payload that does not fit raises BadArgument,
    which fails the attempt (the job retries or parks like any handler error)."""
    kind = payload_kind(tp)
    if kind == "typeddict":
        _check_typeddict(tp, payload)
        return payload
    if not isinstance(payload, dict):
        raise BadArgument(f"payload for {tp.__name__} must be a JSON object")
    if kind == "dataclass":
        _check_fields(tp, payload)
        try:
            return tp(**payload)
        except TypeError as exc:
            raise BadArgument(f"payload does not fit {tp.__name__}: {exc}") from None
    try:
        return tp.model_validate(payload)  # type: ignore[attr-defined]
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise BadArgument(f"payload does not fit {tp.__name__}: {exc}") from None


def decoding(fn: Callable[..., Any], tp: type, is_async: bool) -> Handler:
    """`fn` wrapped to receive its payload decoded into `tp` (sync or async like `fn`)."""
    if is_async:

        async def run_async(payload: Any, ctx: JobContext) -> Any:
            return await fn(decode_payload(tp, payload), ctx)

        return run_async

    def run(payload: Any, ctx: JobContext) -> Any:
        return fn(decode_payload(tp, payload), ctx)

    return run
