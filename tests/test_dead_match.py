"""The dead-letter task / error-type filter reads a page of ids in one lua/dead_match.lua call
(not one HMGET reply per id) and keeps exactly the old results: the task from the hash, else
from the spec record; a field that is not UTF-8, a job key of another type, a hash gone, an
empty task, a filter that is no UTF-8 text, each as the per-id reads decided them."""

from __future__ import annotations

from typing import cast

import pytest

from scheduler import Queue
from scheduler.core.errors import UnreadableRecord
from scheduler.operations import dead_filter
from tests.test_dead_paths import Counter, counted, park

__all__ = ["counted"]  # the fixture, imported for these tests


def both_ways(q: Queue, task: str | None, error_type: str | None) -> list[str]:
    """matching over the whole dead list, checked against the per-id reads it replaces."""
    raw = cast(list[tuple[str, float]], q.client.zrange(q.keys.dead, 0, -1, withscores=True))
    pairs = [(float(score), str(i)) for i, score in raw]
    got = q._run(dead_filter.matching(q.keys, pairs, task, error_type))
    assert got == q._run(dead_filter._read_matching(q.keys, pairs, task, error_type))
    return [i for _, i in got]


def test_a_page_is_matched_in_one_call_per_1000_ids(counted: tuple[Queue, Counter]) -> None:
    q, c = counted
    a = park(q, 1500, task="a")
    park(q, 600, task="b")
    c.reset()
    assert sorted(q.dead_ids(task="a")) == sorted(a)
    assert c.named("HMGET") == [] and c.named("GET") == []  # no per-id read
    assert len(c.matched()) == 2100 and c.scripts("dead_match") == 3  # pages of 1,000
    c.reset()
    assert sorted(q.dead_ids(error_type="ValueError")) == sorted(q.dead_ids())
    assert q.dead_ids(error_type="KeyError") == [] and c.named("HMGET") == []


def test_every_odd_record_matches_as_the_per_id_reads_decided(
    counted: tuple[Queue, Counter],
) -> None:
    q, c = counted
    ids = park(q, 8, task="a")
    r = q.client
    r.hdel(q.keys.job(ids[0]), "task")  # no task in its hash: its spec record's ("a")
    r.hdel(q.keys.job(ids[1]), "task")
    r.set(q.keys.spec(ids[1]), "garbage")  # and a spec record no version wrote: no task
    r.delete(q.keys.job(ids[4]), q.keys.spec(ids[4]))  # its records gone, its id still dead
    r.hset(q.keys.job(ids[5]), "task", "")  # an empty task is a task: not the spec's
    r.hdel(q.keys.job(ids[6]), "task")
    r.delete(q.keys.spec(ids[6]))
    r.hset(q.keys.spec(ids[6]), "task", "a")  # a spec record of another type: no task
    c.reset()
    want = [ids[0], ids[2], ids[3], ids[7]]
    assert sorted(both_ways(q, "a", None)) == sorted(want)
    assert sorted(both_ways(q, "a", "ValueError")) == sorted(want)
    assert both_ways(q, "", None) == [ids[5]]
    assert both_ways(q, "a\udcff", None) == []  # no UTF-8 text: compared as before
    assert both_ways(q, None, "KeyError") == []
    # matching decided every id on the server (the spec records too) but for the
    # lone-surrogate filter's 8; _read_matching (the check) read all 8 each time.
    assert len(c.named("HMGET")) == 8 + 5 * 8


def test_a_field_that_is_not_utf8_is_read_as_before(counted: tuple[Queue, Counter]) -> None:
    q, _ = counted
    ids = park(q, 3, task="a")
    q.client.hset(q.keys.job(ids[1]), "task", b"a\xff")  # edited by hand
    with pytest.raises(UnreadableRecord):  # this client decodes strictly, as the reads did
        q.dead_ids(task="a")
    with pytest.raises(UnreadableRecord):
        q._run(dead_filter._read_matching(q.keys, [(0.0, i) for i in ids], "a", None))
    q.client.hdel(q.keys.job(ids[1]), "task")
    q.client.set(q.keys.spec(ids[1]), b"2|a\xff|||||||{}")  # its spec record's task
    with pytest.raises(UnreadableRecord):
        q.dead_ids(task="a")


def test_the_spec_record_is_read_by_its_head_only(counted: tuple[Queue, Counter]) -> None:
    """The task is read from the record's first 1,024 bytes: a payload is never read (a page
    of 1,000 records of 500 KB payloads, each read and checked whole, held Redis for 7 s),
    so bytes in it that are not UTF-8 no longer fail the listing (the per-id reads decoded
    the whole record); a head with no end of its fields in 1,024 bytes is read as before."""
    q, c = counted
    ids = park(q, 4, task="a")
    r = q.client
    for i in ids:
        r.hdel(q.keys.job(i), "task")
    r.set(q.keys.spec(ids[0]), b"2|a|||||||" + b"\xff" * 600_000)  # a big, broken payload
    r.set(q.keys.spec(ids[1]), "2|b|||||||" + "x" * 600_000)
    r.set(q.keys.spec(ids[2]), "2|" + "a" * 2_000 + "|||||||{}")  # a task edited long
    c.reset()
    assert sorted(q.dead_ids(task="a")) == sorted([ids[0], ids[3]])
    assert [cmd[1] for cmd in c.named("GET")] == [q.keys.spec(ids[2])]  # the long head only
    assert q.dead_ids(task="a" * 2_000) == [ids[2]]


def test_a_job_key_of_another_type_is_left_out(counted: tuple[Queue, Counter]) -> None:
    """Read as a hash without fields: its spec record's task, no error type (its WRONGTYPE
    failed the whole read before: tests/test_dead_letters_audit.py)."""
    q, _ = counted
    ids = park(q, 3, task="a")
    q.client.delete(q.keys.job(ids[1]))
    q.client.set(q.keys.job(ids[1]), "x")  # a hash edited into a string by hand
    assert q.dead_ids(task="a") == q.dead_ids()
    assert q.dead_ids(error_type="ValueError") == [i for i in q.dead_ids() if i != ids[1]]
