"""One backoff serialiser: core/backoff_text.py writes and reads 'base_ms,factor,cap_ms,jitter'
for the job hash, the schedule hash and the CLI's --backoff."""

from __future__ import annotations

import pathlib
import re

import pytest

from scheduler.cli.common import parse_backoff
from scheduler.core.backoff import Backoff
from scheduler.core.backoff_text import backoff_text, parse_backoff_text, parse_stored_backoff
from scheduler.core.codec import enqueue_fields
from scheduler.core.errors import BadArgument
from scheduler.core.models import JobSpec
from scheduler.schedules import recurring

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "scheduler"


def test_text_round_trips() -> None:
    b = Backoff(base_ms=250, factor=3.0, cap_ms=60_000, jitter=0.5)
    assert backoff_text(b) == "250,3.0,60000,0.5"
    assert parse_backoff_text(backoff_text(b)) == b
    assert parse_stored_backoff(backoff_text(b)) == b


def test_job_and_schedule_store_the_same_text() -> None:
    b = Backoff(base_ms=250, factor=3.0, cap_ms=60_000, jitter=0.5)
    fields = enqueue_fields(JobSpec("t", None, backoff=b), 1000)
    d = recurring.define(
        "s",
        "t",
        "null",
        cron=None,
        every_ms=1000,
        tz=None,
        jitter_ms=0,
        misfire="run_once",
        max_attempts=5,
        backoff=b,
        timeout_ms=0,
    )
    assert fields[6] == d.backoff == backoff_text(b)


def test_cli_reads_through_the_same_parser() -> None:
    assert parse_backoff(" 500 , 2 , 10000 , 0 ") == Backoff(500, 2.0, 10_000, 0.0)
    for bad, word in (("x,2,3,0", "base_ms"), ("1,0.5,3,0", "factor"), ("1,2", "give")):
        with pytest.raises(BadArgument, match=word):
            parse_backoff(bad)
    # Stored text the CLI refuses is unreadable when stored too (one rule for both).
    assert parse_stored_backoff("1000,inf,60000,0.1") is None
    with pytest.raises(BadArgument, match="factor"):
        parse_backoff("1000,inf,60000,0.1")


def test_no_second_writer_of_the_form() -> None:
    writer = re.compile(r"b\.base_ms\}?,\{?float\(b\.factor\)")
    places = [p.name for p in PACKAGE.rglob("*.py") if writer.search(p.read_text())]
    assert places == ["backoff_text.py"]
