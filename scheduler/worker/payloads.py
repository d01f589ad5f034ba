"""Typed payloads: a task's `payload_type` (dataclass, TypedDict or pydantic model) checked at
enqueue (`encode_payload`) and decoded for the handler (`decode_payload`); the wire stays JSON."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, is_typeddict

from scheduler.core.errors import BadArgument, InvalidPayload
from scheduler.worker.context import JobContext
from scheduler.worker.payload_fields import check_fields, check_typeddict

Handler = Callable[[Any, JobContext], Any]


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (enqueue refuses it: written by hand?)")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text[:40]} is out of a float's range (enqueue refuses it)")
    return value


# A stored payload is read as strictly as enqueue writes it: NaN, Infinity, a number past a
# float's range and a lone surrogate escape (written by hand or by another client) park the job
# as InvalidPayload instead of reaching the handler.
_STORED = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite)
_TEXT_CHECK = json.JSONEncoder(ensure_ascii=False)


def load_stored(text: str) -> Any:
    """The handler's payload from its stored JSON text; ValueError when enqueue would refuse it."""
    value = _STORED.decode(text)
    # Enqueue escapes only control characters, so a \u escape is rare: only then is the decoded
    # text checked (a valid surrogate pair decodes to one character; a lone one stays).
    if "\\u" in text:
        try:
            _TEXT_CHECK.encode(value).encode()
        except UnicodeEncodeError:
            raise ValueError("a lone surrogate escape is not text (enqueue refuses it)") from None
    return value


def payload_kind(tp: type) -> str | None:
    """ "dataclass", "typeddict" or "pydantic"; None for a type that cannot be a payload_type."""
    if dataclasses.is_dataclass(tp):
        return "dataclass"
    if is_typeddict(tp):
        return "typeddict"
    if callable(getattr(tp, "model_validate", None)) and callable(getattr(tp, "model_dump", None)):
        return "pydantic"
    return None


_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def check_payload_type(tp: Any) -> None:
    """A task's payload_type, checked at registration: one the worker could never build from the
    JSON enqueue writes (X(**fields)) is refused here, not at every attempt of every job."""
    kind = payload_kind(tp) if isinstance(tp, type) else None
    if kind is None:
        raise BadArgument(
            f"payload_type must be a dataclass, TypedDict or pydantic model, got {tp!r}"
        )
    if kind != "dataclass":
        return
    fields = dataclasses.fields(tp)
    for f in fields:
        if not f.init:
            raise BadArgument(
                f"payload_type {tp.__name__}: field {f.name!r} is init=False, which the worker"
                f" cannot pass when it builds the payload as {tp.__name__}(**fields)"
            )
    try:
        params = inspect.signature(tp).parameters.values()
    except (TypeError, ValueError):  # no signature to read: left to the first decode
        return
    stored = {f.name for f in fields}
    for p in params:
        if p.name not in stored and p.default is p.empty and p.kind not in _VARIADIC:
            raise BadArgument(
                f"payload_type {tp.__name__}: {p.name!r} (an InitVar or __init__ argument) is not"
                f" stored, so the worker cannot build the payload as {tp.__name__}(**fields)"
            )


def _dataclass_in(value: Any) -> type | None:
    """The class of the first dataclass instance inside `value` (lists, tuples, dict values)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value)
    inner = value.values() if isinstance(value, dict) else value
    if isinstance(inner, list | tuple) or isinstance(value, dict):
        for v in inner:
            if (found := _dataclass_in(v)) is not None:
                return found
    return None


def _as_dict(tp: type, payload: Any) -> dict[str, Any]:
    """asdict, refusing a dataclass inside a field: asdict makes it a dict, and the worker's
    decode would hand the handler that dict (or refuse it), never the dataclass."""
    made = 0

    def count(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal made
        made += 1
        return dict(pairs)

    try:  # asdict deep-copies each field: a lock, a generator cannot be copied
        out: dict[str, Any] = dataclasses.asdict(payload, dict_factory=count)
    except Exception as exc:
        raise InvalidPayload(f"payload is not JSON-serialisable: {exc}") from None
    if made > 1:
        for f in dataclasses.fields(tp):
            inner = _dataclass_in(getattr(payload, f.name))
            if inner is not None:
                raise BadArgument(
                    f"payload[{f.name!r}] holds a dataclass ({inner.__name__}), which the worker"
                    f" would decode as a dict: make {tp.__name__} a pydantic model (it"
                    " validates nested models) or store the field as JSON"
                )
    return out


def encode_payload(tp: type, payload: Any) -> Any:
    """Check `payload` against `tp`; returns its JSON-able form (BadArgument if it does not fit)."""
    kind = payload_kind(tp)
    if kind == "typeddict":
        check_typeddict(tp, payload, encoding=True)
        return payload
    if kind == "dataclass":
        if not isinstance(payload, tp):
            raise BadArgument(f"payload must be a {tp.__name__}, got {type(payload).__name__}")
        out = _as_dict(tp, payload)
        fields = {f.name: getattr(payload, f.name) for f in dataclasses.fields(tp)}
        check_fields(tp, fields, encoding=True)
        return out
    if kind == "pydantic":
        if not isinstance(payload, tp):
            raise BadArgument(f"payload must be a {tp.__name__}, got {type(payload).__name__}")
        try:
            out = payload.model_dump(mode="json")  # type: ignore[attr-defined]
        except Exception as exc:  # a field holding what pydantic cannot write as JSON
            raise InvalidPayload(f"payload is not JSON-serialisable: {exc}") from None
        decode_payload(tp, out)  # what the worker does: a misfit is refused here, not per attempt
        return out
    raise BadArgument(f"unsupported payload_type {tp!r}")


def decode_payload(tp: type, payload: Any) -> Any:
    """The handler's view of a JSON payload. A payload that does not fit raises BadArgument
    (in the worker PayloadMisfit, which parks the job at once), as does a ValueError or
    TypeError of the type's own checks (a dataclass's __post_init__, a pydantic validator), or
    an AssertionError of a dataclass's __post_init__ (`assert` as validation: a handler's own
    assert is not raised here, so it stays a failure that is retried)."""
    kind = payload_kind(tp)
    if kind == "typeddict":
        check_typeddict(tp, payload)
        return payload
    if not isinstance(payload, dict):
        raise BadArgument(f"payload for {tp.__name__} must be a JSON object")
    if kind == "dataclass":
        check_fields(tp, payload)
        try:
            return tp(**payload)
        except (TypeError, ValueError, AssertionError) as exc:  # a wrong field, or its checks
            why = str(exc) or f"{type(exc).__name__} in __post_init__"  # a bare `assert x`
            raise BadArgument(f"payload does not fit {tp.__name__}: {why}") from None
    computed = getattr(tp, "model_computed_fields", None)
    if isinstance(computed, dict) and not computed.keys().isdisjoint(payload):
        # model_dump writes them; they are outputs (a model forbidding extra inputs refused them).
        payload = {k: v for k, v in payload.items() if k not in computed}
    try:
        return tp.model_validate(payload, **_by_name_too(tp))  # type: ignore[attr-defined]
    except (ValueError, TypeError) as exc:  # ValidationError, or a validator's own TypeError
        raise BadArgument(f"payload does not fit {tp.__name__}: {exc}") from None


@functools.cache
def _by_name_too(tp: type) -> dict[str, bool]:
    """model_validate's options to take a field by its name as well as its alias: enqueue dumps
    by name (model_dump's default), a model validates by alias (its default); pydantic 2.11+."""
    try:
        params = inspect.signature(tp.model_validate).parameters  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        return {}
    return {"by_alias": True, "by_name": True} if "by_name" in params else {}


class PayloadMisfit(BadArgument):
    """The stored payload does not fit the task's payload_type: every attempt would decode it
    the same way, so the job is parked at once as InvalidPayload (failures.failure_of)."""


# While an async handler runs on a large payload (payload_decode.run_async): its build into the
# payload_type, made off the loop with its decode; a big model's validation held the loop.
OFF_LOOP: ContextVar[Any] = ContextVar("scheduler_off_loop_payload", default=None)


def built(tp: type, payload: Any) -> Any:
    """The handler's payload_type object of `payload`; PayloadMisfit when it does not fit."""
    try:
        return decode_payload(tp, payload)
    except BadArgument as exc:
        raise PayloadMisfit(
            f"{exc} (the task's payload_type {tp.__name__} refuses the stored payload; not"
            " retried: every attempt would decode it the same way)"
        ) from None


def decoding(fn: Callable[..., Any], tp: type, is_async: bool) -> Handler:
    """`fn` wrapped to receive its payload decoded into `tp` (sync or async like `fn`)."""
    if is_async:

        async def run_async(payload: Any, ctx: JobContext) -> Any:
            big = OFF_LOOP.get()  # a payload_decode.OffLoop: a large payload's run only
            typed = built(tp, payload) if big is None else await big.typed(tp, payload)
            return await fn(typed, ctx)

        return run_async

    def run(payload: Any, ctx: JobContext) -> Any:
        return fn(built(tp, payload), ctx)

    return run
