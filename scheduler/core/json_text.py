"""Values as the JSON text the package stores (payloads, results, progress): one encoder, and
a typed refusal (InvalidPayload) that says how to fix a value JSON cannot hold."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, NoReturn

from scheduler.core.errors import InvalidPayload


class NotJsonType(TypeError):
    """A dataclass or pydantic model met by the JSON encoder (not_json): encode_json adds the
    typed-task hint only where the value is a payload, not a result or progress."""


TYPED_PAYLOAD_HINT = (
    "or enqueue a typed task's payload with the task's handle: task.enqueue(q, value)"
)


def not_json(value: object) -> NoReturn:
    """The JSON encoder's `default` (codec.encode_json), reached only for a value it cannot
    encode: a dataclass or pydantic model, most often a typed task's payload enqueued by name,
    is told how to fix it (the TypeError becomes InvalidPayload). Not converted silently: by
    name the task's payload_type check would be skipped, and a result would read back a dict."""
    kind = type(value).__name__
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        raise NotJsonType(f"{kind} is a dataclass, not JSON: pass dataclasses.asdict(value)")
    if callable(getattr(value, "model_dump", None)) and not isinstance(value, type):
        raise NotJsonType(f"{kind} is a pydantic model: pass value.model_dump(mode='json')")
    raise TypeError(f"Object of type {kind} is not JSON serializable")  # json's own words


# One encoder for every call: json.dumps with options builds a new one each time (slow).
_JSON = json.JSONEncoder(
    separators=(",", ":"), allow_nan=False, ensure_ascii=False, default=not_json
)


def _described(exc: Exception) -> str:
    """'Type: message', or the type alone when the message cannot be read."""
    name = type(exc).__name__
    try:
        return f"{name}: {exc}"
    except Exception:
        return f"{name} (its message could not be read)"


def encode_json(value: Any, what: str, limit: int) -> str:
    try:
        text = _JSON.encode(value)
    except NotJsonType as exc:
        hint = f", {TYPED_PAYLOAD_HINT}" if what == "payload" else ""
        raise InvalidPayload(f"{what} is not JSON-serialisable: {exc}{hint}") from None
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"{what} is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise InvalidPayload(f"{what} is nested too deeply to encode") from None
    except Exception as exc:  # the value's own method raised (a mapping's items(), ...)
        raise InvalidPayload(f"{what} could not be encoded: {_described(exc)}") from exc
    if not text.isascii():
        # A lone surrogate ('\ud800') is a str but not UTF-8: refuse it here, typed.
        try:
            size = len(text.encode())
        except UnicodeEncodeError as exc:
            raise InvalidPayload(f"{what} is not valid Unicode text: {exc.reason}") from None
    else:
        size = len(text)
    if size > limit:
        raise InvalidPayload(f"{what} is {size} bytes, over the {limit} limit")
    return text
