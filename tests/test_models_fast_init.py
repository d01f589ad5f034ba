"""JobSpec's written-out __init__ (scheduler/core/job_spec.py) matches its dataclass fields."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from scheduler import JobSpec
from scheduler.core.models import JobSpec as FromModels


def test_the_parameters_are_the_fields_in_order_with_their_defaults() -> None:
    params = list(inspect.signature(JobSpec.__init__).parameters.values())[1:]
    fields = dataclasses.fields(JobSpec)
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        want = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        assert p.default == want, f.name
        assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD


def test_it_behaves_as_the_generated_one() -> None:
    spec = JobSpec("t", {"a": 1}, 5, priority=3, after=["x"])
    assert (spec.task, spec.payload, spec.delay_ms, spec.priority, spec.after) == (
        "t", {"a": 1}, 5, 3, ["x"],
    )  # fmt: skip
    assert spec == JobSpec("t", {"a": 1}, delay_ms=5, priority=3, after=["x"])
    assert spec != JobSpec("t", {"a": 1}, delay_ms=6, priority=3, after=["x"])
    assert dataclasses.replace(spec, task="u").task == "u"
    assert dataclasses.asdict(spec)["priority"] == 3
    assert "priority=3" in repr(spec)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.task = "v"  # type: ignore[misc]
    with pytest.raises(TypeError):
        JobSpec()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        JobSpec("t", nope=1)  # type: ignore[call-arg]
    assert FromModels is JobSpec
