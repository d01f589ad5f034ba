"""A typed payload's field hints are read once per type (worker/payload_fields.py _class_hints:
get_type_hints on each build cost more than the rest of a typed job's run), and a lookup that
failed (a hint naming what is not defined yet) is read again, not kept as failed."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import pytest

from scheduler.core.errors import BadArgument
from scheduler.worker import payload_fields
from scheduler.worker.payloads import decode_payload


@dataclasses.dataclass
class Point:
    x: int
    y: float


@dataclasses.dataclass
class Later:
    n: int
    when: LaterThing  # type: ignore[name-defined]  # noqa: F821  (defined by the test)


def test_the_hints_are_read_once_per_type(monkeypatch: pytest.MonkeyPatch) -> None:
    payload_fields._class_hints.cache_clear()
    calls: list[type] = []
    real = typing.get_type_hints

    def counted(tp: Any) -> dict[str, Any]:
        calls.append(tp)
        return real(tp)

    monkeypatch.setattr(payload_fields, "get_type_hints", counted)
    for i in range(5):
        assert decode_payload(Point, {"x": i, "y": 1}) == Point(i, 1)
    with pytest.raises(BadArgument, match=r"payload\['x'\] must be int, got str"):
        decode_payload(Point, {"x": "1", "y": 1.5})  # still checked from the kept hints
    assert calls == [Point]


def test_a_failed_lookup_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    payload_fields._class_hints.cache_clear()
    # LaterThing is not defined yet: the fields are left unchecked (as before the cache).
    assert decode_payload(Later, {"n": "not an int", "when": 1}).n == "not an int"
    monkeypatch.setitem(globals(), "LaterThing", int)  # now it is: the hints are read again
    with pytest.raises(BadArgument, match=r"payload\['n'\] must be int, got str"):
        decode_payload(Later, {"n": "not an int", "when": 1})
