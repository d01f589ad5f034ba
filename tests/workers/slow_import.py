"""A registry for tests/test_worker_start_signals.py whose import takes a minute (an app's
module that loads a model, warms a cache): it touches the file TEST_IMPORT_MARKER names, then
sleeps, so a test can signal the worker while it is starting."""

from __future__ import annotations

import os
import time
from pathlib import Path

from scheduler.worker.registry import Registry

registry = Registry()

Path(os.environ["TEST_IMPORT_MARKER"]).touch()
time.sleep(60)
