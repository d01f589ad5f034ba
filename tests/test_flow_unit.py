"""The flow arguments at the boundary (scheduler/core/flow.py): every bad value is refused with a
BadArgument naming the field; the scripts' copy of the ranges agrees."""

from __future__ import annotations

import re
from typing import Any

import pytest

from scheduler import BadArgument, JobSpec
from scheduler.core.codec import enqueue_fields
from scheduler.core.flow import (
    FLOW_LIMITS,
    Flow,
    RateLimit,
    check_flow,
    flow_field,
)
from scheduler.core.scripts import lua_dir


def test_plain_is_the_default() -> None:
    flow = check_flow("t")
    assert flow.plain
    assert flow_field(flow) == ""


def test_every_field_is_carried() -> None:
    flow = check_flow(
        "t",
        priority=9,
        concurrency_key="tenant:7",
        concurrency_limit=2,
        rate_limit="10/1s",
        after=["a", "b", "a"],
    )
    assert not flow.plain
    # The rate key defaults to the task name; parents are deduplicated, order kept.
    assert flow_field(flow) == "9|tenant:7|2|t|10|1000|a b"


@pytest.mark.parametrize(
    ("spec", "count", "window_ms"),
    [
        ("10/1s", 10, 1_000),
        ("100/m", 100, 60_000),
        ("5/250ms", 5, 250),
        (" 3 / 2h ", 3, 7_200_000),
        ("1/1d", 1, 86_400_000),
        ((7, 30), 7, 30),
    ],
)
def test_rate_limit_spellings(spec: Any, count: int, window_ms: int) -> None:
    assert RateLimit.parse(spec) == RateLimit(count, window_ms)


BAD_FLOW = [
    ({"priority": 10}, "priority"),
    ({"priority": -1}, "priority"),
    ({"priority": True}, "priority"),
    ({"priority": 1.0}, "priority"),
    ({"concurrency_key": "k"}, "together"),
    ({"concurrency_limit": 2}, "together"),
    ({"concurrency_key": "a b", "concurrency_limit": 2}, "concurrency_key"),
    ({"concurrency_key": "", "concurrency_limit": 2}, "concurrency_key"),
    ({"concurrency_key": "k", "concurrency_limit": 0}, "concurrency_limit"),
    ({"concurrency_key": "k", "concurrency_limit": 10_001}, "concurrency_limit"),
    ({"rate_limit": "10/s/x"}, "rate_limit"),
    ({"rate_limit": "0/1s"}, "rate.count"),
    ({"rate_limit": "10/2d"}, "rate.window_ms"),
    ({"rate_limit": "10/0s"}, "rate.window_ms"),
    ({"rate_limit": 10}, "rate_limit"),
    ({"rate_limit": "10/1s", "rate_key": "bad key"}, "rate_key"),
    ({"rate_key": "k"}, "rate_limit"),
    ({"after": "abc"}, "after"),
    ({"after": ["ok", "no spaces"]}, "job id"),
    ({"after": [f"j{i}" for i in range(101)]}, "after"),
    ({"priority": False}, "priority"),
    ({"priority": 0.0}, "priority"),
]


@pytest.mark.parametrize(("kwargs", "word"), BAD_FLOW)
def test_bad_flow_arguments_are_refused(kwargs: dict[str, Any], word: str) -> None:
    with pytest.raises(BadArgument, match=re.escape(word)):
        check_flow("t", **kwargs)


@pytest.mark.parametrize(("kwargs", "word"), BAD_FLOW)
def test_enqueue_refuses_the_same_flow_arguments(kwargs: dict[str, Any], word: str) -> None:
    # codec.enqueue_fields skips check_flow for a spec with no flow argument: a value that only
    # looks like a default (False, 0.0) must still reach it and be refused.
    with pytest.raises(BadArgument, match=re.escape(word)):
        enqueue_fields(JobSpec("t", 1, **kwargs), 1 << 20)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"priority": 0},
        {"priority": 3},
        {"concurrency_key": "k", "concurrency_limit": 2},
        {"rate_limit": "10/1s"},
        {"after": []},
        {"after": ["a"]},
    ],
)
def test_enqueue_sends_the_checked_flow_field(kwargs: dict[str, Any]) -> None:
    assert enqueue_fields(JobSpec("t", 1, **kwargs), 1 << 20)[-1] == flow_field(
        check_flow("t", **kwargs)
    )


def test_flow_is_a_value() -> None:
    assert Flow() == check_flow("t", priority=0)
    assert check_flow("t", priority=3) != Flow()


def test_the_scripts_use_the_same_flow_limits() -> None:
    text = (lua_dir() / "lib" / "flow.lua").read_text()
    m = re.search(r"local FLOW_LIM = \{(.*?)\}", text, flags=re.DOTALL)
    assert m
    lua = {k: int(v) for k, v in re.findall(r"(\w+) = (\d+)", m.group(1))}
    assert lua == {
        "priority": FLOW_LIMITS["priority"][1],
        "climit": FLOW_LIMITS["concurrency_limit"][1],
        "rate_count": FLOW_LIMITS["rate.count"][1],
        "rate_window_ms": FLOW_LIMITS["rate.window_ms"][1],
        "after": FLOW_LIMITS["after"][1],
    }
