"""A handler's result encoded with a bound (worker/failures.py): read first, so a value far
over the limit never goes whole through the C encoder, which holds the GIL to its end.
The encoder and its typed refusals are json_text.py's."""

from __future__ import annotations

import itertools
from typing import Any

from scheduler.core.errors import InvalidPayload
from scheduler.core.json_text import (
    _ESCAPE,
    _SCALARS,
    _encoded,
    _keys_checked,
    _only_scalars,
    _sized,
)


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
