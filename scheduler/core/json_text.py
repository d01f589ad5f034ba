"""Values as the JSON text the package stores (payloads, results, progress): one encoder, and
a typed refusal (InvalidPayload) that says how to fix a value JSON cannot hold."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
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
# _JSON.encode's C encoder, built once (its two frames and build cost a short value's encode);
# no markers (threads share it): a cycle's RecursionError is told apart by _JSON.encode then.
_make_c: Callable[..., Any] | None = getattr(json.encoder, "c_make_encoder", None)
_ESCAPE = json.encoder.encode_basestring  # a str's JSON text (ensure_ascii off)
_C_JSON: Callable[[Any, int], list[str]] = (  # markers, default, escape, indent, separators;
    _make_c(None, not_json, _ESCAPE, None, ":", ",", 0, 0, 0)  # sort_keys, skipkeys, NaN: off
    if _make_c  # None: no C accelerator (another interpreter)
    else lambda value, _: [_JSON.encode(value)]
)


def _described(exc: Exception) -> str:
    """'Type: message', or the type alone when the message cannot be read."""
    name = type(exc).__name__
    try:
        return f"{name}: {exc}"
    except Exception:
        return f"{name} (its message could not be read)"


def encode_json(value: Any, what: str, limit: int) -> str:
    return _keys_checked(value, _sized(_encoded(value, what), what, limit), what)


def _keys_checked(value: Any, text: str, what: str) -> str:
    try:
        if "{" in text:  # else no dict, so no keys (a list of numbers costs one scan)
            _check_keys(value, text, what)
    except InvalidPayload:
        raise
    except Exception as exc:  # a mapping's items() that raised only when read again
        raise InvalidPayload(f"{what} could not be encoded: {_described(exc)}") from exc
    return text


def _encoded(value: Any, what: str, limit: int | None = None) -> str:
    """value's JSON text, by the C encoder; with a limit, by the Python one's chunks, stopped
    once over it (characters: at least as many bytes)."""
    try:
        if limit is None:
            try:
                return "".join(_C_JSON(value, 0))
            except RecursionError:  # a cycle, or nested too deeply: the encoder with markers says
                return _JSON.encode(value)
        chunks: list[str] = []
        size = 0
        for chunk in _JSON.iterencode(value):
            size += len(chunk)
            if size > limit:
                raise InvalidPayload(f"{what} is over the {limit} byte limit (its encoding was "
                                     f"stopped at {size} characters)")  # fmt: skip
            chunks.append(chunk)
        return "".join(chunks)
    except InvalidPayload:
        raise
    except NotJsonType as exc:
        hint = f", {TYPED_PAYLOAD_HINT}" if what == "payload" else ""
        raise InvalidPayload(f"{what} is not JSON-serialisable: {exc}{hint}") from None
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"{what} is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise InvalidPayload(f"{what} is nested too deeply to encode") from None
    except Exception as exc:  # the value's own method raised (a mapping's items(), ...)
        raise InvalidPayload(f"{what} could not be encoded: {_described(exc)}") from exc


def _sized(text: str, what: str, limit: int) -> str:
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


_SCALARS = frozenset({str, int, float, bool, type(None)})
_only_scalars = _SCALARS.issuperset


def _key_text(key: Any) -> str:
    """A dict key as the JSON encoder writes it (it took the value, so the key is one of these)."""
    if isinstance(key, str):
        return str.__str__(key)
    if key is True or key is False or key is None:
        return "true" if key else "false" if key is False else "null"
    return float.__repr__(key) if isinstance(key, float) else int.__repr__(key)


def _check_keys(value: Any, text: str, what: str) -> None:
    """Two keys of one dict the JSON text writes alike ({1: 'a', '1': 'b'}, {True: .., 'true':
    ..}) would come back as one, a value lost: InvalidPayload naming them and where. Run on a
    value the encoder took, so its containers are lists, tuples and dicts (or subclasses, read
    as the encoder reads them); C-speed scans skip what holds only scalars and str keys."""
    if type(value) is dict and text.count("{") == 1:  # the common payload: no dict inside
        for key in value:
            if type(key) is not str:
                break
        else:
            return
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    push = stack.append
    while stack:
        obj, path = stack.pop()
        kind = type(obj)
        if kind is dict:
            plain = True
            for k, v in obj.items():
                plain = plain and type(k) is str
                if type(v) not in _SCALARS:
                    push((v, (*path, k)))
            if not plain:
                _distinct(list(obj), what, path)
            continue
        inner: Any
        if kind is list or kind is tuple:
            if _only_scalars(map(type, obj)):
                continue
            inner = enumerate(obj)
        elif isinstance(obj, dict):  # a subclass: read through items(), as the encoder does
            inner = list(obj.items())
            _distinct([k for k, _ in inner], what, path)
        elif isinstance(obj, list | tuple):  # a subclass: its items, not its __iter__
            inner = enumerate(list.__iter__(obj) if isinstance(obj, list) else tuple.__iter__(obj))
        else:
            continue  # a scalar's subclass (an IntEnum, a str subclass)
        for k, v in inner:
            if type(v) not in _SCALARS:
                push((v, (*path, k)))


def _distinct(keys: list[Any], what: str, path: tuple[Any, ...]) -> None:
    seen: dict[str, Any] = {}
    for key in keys:
        text = _key_text(key)
        if text in seen:
            where = what + "".join(f"[{k!r:.80}]" for k in path)
            raise InvalidPayload(
                f"{where} has two keys written as the same JSON key {text!r:.80}"
                f" ({seen[text]!r:.80} and {key!r:.80}): JSON keys are text and a reader keeps"
                " only the last, so a value would be lost; use distinct keys"
            )
        seen[text] = key
