"""The client's and the claim parser's hot-path shortcuts (issue 16) keep their answers: the
digit fast path reads what stored_int reads, the task-name memo refuses what TASK_RE refuses and
stays bounded, the cached backoff argument still refuses bad ones, ids stay unique across
random.seed() and fork, and a None result is sent as JSON null."""

from __future__ import annotations

import os
import random
import time
from typing import Any

import pytest

from scheduler.core import claim_reply, codec, ids
from scheduler.core.backoff import Backoff
from scheduler.core.connection import is_cluster
from scheduler.core.errors import BadArgument
from scheduler.core.limits import LIMITS, stored_int_in
from scheduler.core.models import JobSpec

FIELD_VALUES: list[Any] = [
    "0", "5", "007", "1000000", "1000001", "9" * 16, "9" * 17, "", " 7", "7 ", "-1", "+1", "1e3",
    "0x10", "7.0", "\u0663", "\uff17", "²", b"5", b"\xff", 5, True, None, 1.0, "1764590000000",
    "7300000000000", "72000000000000",
]  # fmt: skip


@pytest.mark.parametrize("name", ["attempts", "max_attempts", "run_at_ms", "timeout_ms"])
def test_digit_fast_path_reads_what_stored_int_reads(name: str) -> None:
    for v in FIELD_VALUES:
        want = stored_int_in(v, name)
        try:
            got: int | None = claim_reply._field_int(v, name)
        except claim_reply._Unreadable:
            got = None
        assert got == want, (name, v)
    _lo, hi = LIMITS[name]
    assert claim_reply._field_int(str(hi), name) == hi
    with pytest.raises(claim_reply._Unreadable):
        claim_reply._field_int(str(hi + 1), name)


def _raw(task: Any, **over: Any) -> list[Any]:
    raw: list[Any] = ["J1", "17-abc", "0", "5", task, "{}", "1000", "1000,2.0,3600000,0.25"]
    raw += ["0", "", ""]
    for i, v in over.items():
        raw[int(i[1:])] = v
    return raw


def test_task_memo_refuses_what_the_pattern_refuses_and_is_bounded() -> None:
    assert claim_reply._claimed_job(_raw("good.task"), 1).task == "good.task"
    for bad in ("", "has space", "x" * 201, "tab\t", "é"):
        with pytest.raises(claim_reply._Unreadable, match="task"):
            claim_reply._claimed_job(_raw(bad), 1)
        assert bad not in claim_reply._TASKS_OK
    for i in range(claim_reply._TASKS_OK_MAX + 50):
        claim_reply._claimed_job(_raw(f"t{i}"), 1)
    assert len(claim_reply._TASKS_OK) <= claim_reply._TASKS_OK_MAX
    # bytes still go through the UTF-8 check, whatever the memo holds
    with pytest.raises(claim_reply._Unreadable, match="task: not UTF-8"):
        claim_reply._claimed_job(_raw(b"\xff"), 1)


def test_parse_claim_puts_a_bad_job_aside_and_keeps_the_rest() -> None:
    reply = ["1000", "-1", "3", *_raw("a"), *_raw("a", f2="x"), *_raw("a", f1="no token")]
    batch = claim_reply.parse_claim(reply)
    assert [j.task for j in batch.jobs] == ["a"]
    assert [u[2] for u in batch.unreadable] == [
        "invalid job: attempts",
        "invalid job: token",
    ]


def test_cached_backoff_argument_still_refuses_bad_ones() -> None:
    ok = codec.enqueue_fields(JobSpec("t", None, backoff=Backoff(1, 2.0, 10, 0.0)), 1000)
    assert ok[6] == "1,2.0,10,0.0"
    # equal to Backoff(1, ...) for a cache, but a bool is not an integer argument
    for bad in (Backoff(True, 2.0, 10, 0.0), Backoff(1, 2.0, True, 0.0)):
        with pytest.raises(BadArgument):
            codec.enqueue_fields(JobSpec("t", None, backoff=bad), 1000)
    for not_backoff in ({"base_ms": 1}, [1], "1,2,3,0"):
        with pytest.raises(BadArgument, match="backoff must be a Backoff"):
            codec.enqueue_fields(JobSpec("t", None, backoff=not_backoff), 1000)  # type: ignore[arg-type]
    with pytest.raises(BadArgument, match="cap_ms"):
        codec.enqueue_fields(JobSpec("t", None, backoff=Backoff(1, 2.0, 10**15, 0.0)), 1000)


def test_a_none_result_is_sent_as_json_null() -> None:
    args = codec.complete_args([("J1", "1-a", None), ("J2", "1-b", {"x": 1})], 1000, 100)
    assert args == ["1000", "J1", "1-a", "null", "J2", "1-b", '{"x":1}']


def _random_bits(job_id: str) -> str:
    return job_id[10:]  # the last 36 bits (6 characters) are random; 10 is a safe margin


def test_ids_do_not_repeat_after_random_seed() -> None:
    random.seed(1)
    a = ids.new_job_id()
    random.seed(1)
    b = ids.new_job_id()
    assert a != b and _random_bits(a) != _random_bits(b)


def test_a_forked_child_draws_other_ids_than_its_parent() -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: write 50 ids and leave at once
        os.write(w, " ".join(ids.new_job_id() for _ in range(50)).encode())
        os._exit(0)
    os.close(w)
    parent = [ids.new_job_id() for _ in range(50)]
    os.waitpid(pid, 0)
    child = os.read(r, 65536).decode().split()
    os.close(r)
    assert len(child) == 50
    assert not {_random_bits(i) for i in parent} & {_random_bits(i) for i in child}


def test_ids_are_unique_and_sorted_by_time() -> None:
    made = [ids.new_job_id() for _ in range(20_000)]
    assert len(set(made)) == len(made)
    assert all(len(i) == 16 for i in made)
    first = ids.new_job_id()
    time.sleep(0.002)
    assert first < ids.new_job_id()  # a later ms sorts after


def test_is_cluster_answer_is_per_client_class() -> None:
    import redis
    import redis.asyncio as aredis

    assert is_cluster(redis.Redis()) is False
    assert is_cluster(aredis.Redis()) is False

    class NotAClient:
        pass

    assert is_cluster(NotAClient()) is False


def test_ids_made_in_one_ms_sort_in_the_order_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 16-bit sequence from a random start wrapped within a ms (~5% of 3,000-id batches):
    later ids sorted first, and jobs due at one instant were claimed out of enqueue order
    (tests/test_flow_rate_backlog.py failed so). 70,000 ids in one frozen ms: past the
    sequence's 65,536, the next ms is borrowed."""
    monkeypatch.setattr(ids, "_time_ns", lambda: 1_700_000_000_000 * 1_000_000)
    made = [ids.new_job_id() for _ in range(70_000)]
    assert made == sorted(made) and len(set(made)) == len(made)
    monkeypatch.setattr(ids, "_time_ns", lambda: 1_699_999_999_000 * 1_000_000)  # stepped back
    assert ids.new_job_id() > made[-1]
