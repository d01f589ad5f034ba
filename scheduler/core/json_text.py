"""Values as the JSON text the package stores (payloads, results, progress): one encoder, and
a typed refusal (InvalidPayload) that says how to fix a value JSON cannot hold."""

from __future__ import annotations

import dataclasses
import itertools
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


def encode_json_bounded(value: Any, what: str, limit: int) -> str:
    """encode_json, for a value that may be far over the limit (a handler's result): the C
    encoder, which holds the GIL to its end (a 34 MB result: 1-2 s, every other job's
    heartbeat held), runs only on a value read whole within the limit (_read); any other goes
    through the Python encoder's chunks, stopped at the limit (tens of ms, and Python code
    that lets other threads run)."""
    kind = type(value)
    if kind in _SCALARS:
        if kind is str and len(value) > limit:
            raise InvalidPayload(f"{what} is over the {limit} byte limit ({len(value)} characters)")
        return _sized(_ESCAPE(value) if kind is str else _encoded(value, what), what, limit)
    try:
        read = _read(value, limit)
    except _LongStr as long:  # not to the chunks: a str is one, encoded whole
        raise InvalidPayload(
            f"{what} is over the {limit} byte limit (it holds a str of {long.args[0]} characters)"
        ) from None
    except Exception:  # a key's own __class__ or __len__: the encoder says what is wrong
        read = None
    if read is not None and read[0] <= limit:
        text = _sized(_encoded(value, what), what, limit)
        return text if read[1] else _keys_checked(value, text, what)
    return _keys_checked(value, _sized(_encoded(value, what, limit), what, limit), what)


class _LongStr(Exception):
    """_read met a str longer than the limit: over it, cycle or not."""


def _longest(strs: Any, limit: int) -> None:  # _LongStr for the longest str, if over the limit
    if (n := max(map(len, filter(_is_str, strs)), default=0)) > limit:
        raise _LongStr(n)


_only_str = frozenset({str}).issuperset
_only_dicts = frozenset({dict}).issuperset
_is_str = str.__instancecheck__
_flat = itertools.chain.from_iterable


def _read(value: Any, limit: int) -> tuple[int, bool] | None:
    """(A lower bound of value's JSON text length, cut short once over `limit`, where a cycle
    ends too; whether all dict keys are exact str: none written alike), read through exact
    JSON types and scalar subclasses (None at another). Item by item in a short container (the
    common result: cheaper than C-speed passes), by C-speed passes in a long one (rows: as one)."""
    size = 0
    plain = True
    stack = [value]
    pop, push, push_all = stack.pop, stack.append, stack.extend
    while stack:
        obj = pop()
        kind = type(obj)
        keys: Any = ()
        if kind is dict:  # braces, commas and colons
            size += 2 * len(obj) + 1
            keys, items = obj, obj.values()
        elif kind is list or kind is tuple:
            size += len(obj) + 1
            items = obj
            if len(obj) > _SHORT and size <= limit and _only_dicts(map(type, obj)):  # rows
                size += len(obj) + 2 * sum(map(len, obj))
                if size <= limit:
                    keys, items = list(_flat(obj)), list(_flat(map(dict.values, obj)))
        elif isinstance(obj, str):  # a subclass (of str, int, float: an enum) is written as its
            if (n := str.__len__(obj)) > limit:  # base type's value, by the C encoder too
                raise _LongStr(n)
            size += n + 2
            continue
        elif kind in _SCALARS or isinstance(obj, int | float):
            size += _digits(obj) if isinstance(obj, int) else 1
            continue
        else:
            return None
        if size > limit:  # before reading the items: 2,000,000 of them cost nothing
            return size, plain
        if len(items) <= _SHORT:
            for key in keys:  # a key's text is at least its str's (a number's: not counted)
                if type(key) is not str:
                    plain = False
                elif (n := len(key)) > limit:
                    raise _LongStr(n)
                else:
                    size += n
            for item in items:
                kind = type(item)
                if kind is str:
                    if (n := len(item)) > limit:
                        raise _LongStr(n)
                    size += n + 2
                elif kind is int:  # a short one: no call
                    size += 1 if -_SHORT_INT < item < _SHORT_INT else _digits(item)
                elif kind in _SCALARS:
                    size += 1
                else:
                    push(item)  # a container, or a type read when popped
            continue
        if keys:
            if _only_str(map(type, keys)):
                size += sum(map(len, keys))
            else:
                plain = False
                size += sum(map(len, filter(_is_str, keys)))
            if size > limit:
                _longest(keys, limit)
        if _only_scalars(map(type, items)):  # a character each at least, an int's digits
            size += len(items) + sum(map(len, filter(_is_str, items)))
            size += max(0, 3 * sum(map(int.bit_length, filter(_is_int, items))) // 10 - len(items))
            if size > limit:
                _longest(items, limit)
        else:
            push_all(items)
    return size, plain


def _digits(number: int) -> int:
    """At least as many characters as an int's JSON text: a b-bit int has at least 0.3 * b
    digits (b * log10(2) - 0.302 + 1 > 0.3 * b), up to 4,300 of them, so ints count too."""
    return max(1, 3 * int.bit_length(number) // 10)


_is_int = int.__instancecheck__
_SHORT_INT = 10**30  # below it, one character is the read's bound (30 at most: far under the limit)
_SHORT = 8  # items of a container read one by one, at most
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
