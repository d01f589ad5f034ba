"""payload_type: a dataclass's fields are checked like a TypedDict's (shallow: plain classes
with isinstance), at enqueue and when the worker decodes; an int passes for a float field (JSON
reads 2.0 back as 2). Before, a dataclass's fields were not checked at all (`D(user="abc")` was
enqueued and reached the handler), and a TypedDict refused 2 for a float field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

import pytest

from scheduler import BadArgument, JobContext, Registry
from scheduler.worker.payloads import decode_payload

registry = Registry()


@dataclass
class Reminder:
    user: int
    score: float = 0.0
    tags: list[str] | None = None


@dataclass(slots=True)
class Slotted:
    user: int


class Point(TypedDict):
    x: float
    label: str


@registry.task("fields.remind", payload_type=Reminder)
def remind(payload: Reminder, ctx: JobContext) -> None: ...


@registry.task("fields.slotted", payload_type=Slotted)
def slotted(payload: Slotted, ctx: JobContext) -> None: ...


@registry.task("fields.point", payload_type=Point)
def point(payload: Point, ctx: JobContext) -> None: ...


def test_a_dataclass_field_of_the_wrong_type_is_refused_at_enqueue() -> None:
    with pytest.raises(BadArgument, match=r"payload\['user'\] must be int, got str"):
        remind.job_spec(Reminder(user="abc"))  # type: ignore[arg-type]
    with pytest.raises(BadArgument, match=r"payload\['user'\] must be int, got list"):
        slotted.job_spec(Slotted(user=[1]))  # type: ignore[arg-type]
    spec = remind.job_spec(Reminder(user=1, score=2, tags=["a"]))  # int for float: fine
    assert spec.payload == {"user": 1, "score": 2, "tags": ["a"]}


def test_a_stored_payload_of_the_wrong_type_fails_the_attempt_when_decoded() -> None:
    assert decode_payload(Reminder, {"user": 1, "score": 3}) == Reminder(1, 3)
    with pytest.raises(BadArgument, match=r"payload\['user'\] must be int"):
        decode_payload(Reminder, {"user": "1"})


def test_a_typeddict_float_field_takes_an_int() -> None:
    assert point.job_spec({"x": 2, "label": "a"}).payload == {"x": 2, "label": "a"}
    with pytest.raises(BadArgument, match=r"payload\['label'\] must be str"):
        point.job_spec({"x": 2.5, "label": 3})


def test_a_hint_that_cannot_be_resolved_is_left_unchecked() -> None:
    local = Registry()

    @dataclass
    class Odd:
        thing: Unresolvable  # type: ignore[name-defined]  # noqa: F821

    handle: Any = local.task("fields.odd", payload_type=Odd)(lambda p, c: None)
    assert handle.job_spec(Odd(thing=1)).payload == {"thing": 1}
