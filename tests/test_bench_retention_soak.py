"""bench/retention_soak.py's plateau check: a backlog series counts as bounded only when the
workers keep up. Pure function on hand-made series; no server, no soak run."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def soak() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module("retention_soak")
    finally:
        sys.path.remove(str(BENCH))


def test_a_flat_small_backlog_is_bounded(soak: Any) -> None:
    points = [(float(t), 100.0 + (t % 3) * 40) for t in range(225, 300)]
    assert soak.backlog_bounded(points, 1500)


def test_a_growing_backlog_is_not_bounded(soak: Any) -> None:
    # 20 jobs/s more arriving than completing (over 1% of 1,500/s), still under 2 s of arrivals.
    points = [(float(t), 20.0 * (t - 225)) for t in range(225, 300)]
    assert max(b for _, b in points) < 2 * 1500
    assert not soak.backlog_bounded(points, 1500)


def test_a_stall_the_workers_recover_from_is_bounded(soak: Any) -> None:
    # As seen at load 18: ~10 s at up to 2 s of arrivals, then back to one tick's batch.
    points = [(float(t), 3200.0 if 260 <= t < 270 else 30.0) for t in range(225, 300)]
    assert soak.backlog_bounded(points, 1500)


def test_a_flat_but_large_backlog_is_not_bounded(soak: Any) -> None:
    points = [(float(t), 30_000.0) for t in range(225, 300)]
    assert not soak.backlog_bounded(points, 1500)


def test_too_few_samples_are_not_bounded(soak: Any) -> None:
    assert not soak.backlog_bounded([(1.0, 0.0)], 1500)
