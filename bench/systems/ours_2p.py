"""'ours' with two worker processes (`scheduler worker --processes 2`): the same driver and
handler as systems/ours.py, for `bench/run.py --systems ours,ours-2p` to show both in one run.
Not a peer and not in the headline ratios (those compare one process with one process)."""

from __future__ import annotations

from typing import Any

from systems import ours

ours.PROCESSES = 2
BASE = ours  # whose settings (CONCURRENCY) a bench sets


def __getattr__(name: str) -> Any:
    return getattr(ours, name)
