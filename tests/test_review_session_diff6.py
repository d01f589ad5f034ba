"""Review of this session's own changes (git diff c605778..HEAD -- scheduler lua), from a
user's or operator's side on a real Redis: a reschedule's start window, the demo's signal
handlers, the CLI's confirmation without a terminal, a partitioned queue's pause and dead
retention checked first (sync and asyncio), doctor's new findings on healthy queues, the CLI on
an empty partition its layout lists."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import pytest
import redis
from click.testing import CliRunner

from scheduler import JobNotFound, Queue
from scheduler.admin.doctor import check_queue
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.core.connection import connect_async
from scheduler.core.errors import CorruptKey
from scheduler.core.keys import QueueKeys
from tests.conftest import Clock, dump_queue

HOUR_MS = 3_600_000
MIN_MS = 60_000
T0 = 1_000_000_000  # the test clock's start, far from the machine's clock
SCHEDULER = str(Path(sys.executable).with_name("scheduler"))
Run = subprocess.CompletedProcess[str]


def at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def cli(url: str, *args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, [*args, "--url", url], catch_exceptions=False)
    return r.exit_code, r.output


# -- lua/reschedule.lua: a start window counted from max(run_at, now) ------------------------


def test_a_second_reschedule_keeps_the_window_it_was_given(tq: tuple[Queue, Clock]) -> None:
    # A reminder with a 15-minute window, run now by "09:00" (an hour ago), then, before any
    # claim, moved to 10 minutes from now: it starts within 15 minutes of that, or not at all.
    q, clock = tq
    clock.set_ms(T0)
    job_id = q.enqueue("remind", None, run_at=at(T0 + HOUR_MS), start_within_ms=15 * MIN_MS)
    assert q.reschedule(job_id, run_at=at(T0 - HOUR_MS)) == "rescheduled"
    assert q.reschedule(job_id, delay_ms=10 * MIN_MS) == "rescheduled"
    # 1 ms past the window counted from the new run time (T0 + 25 min): parked, never run.
    clock.set_ms(T0 + 25 * MIN_MS + 1)
    assert q.claim("w").jobs == []
    assert q.status(job_id) == "dead"


def test_a_reschedule_of_a_future_job_keeps_its_window_from_the_new_time(
    tq: tuple[Queue, Clock],
) -> None:
    # The common case (no past run_at): the window moves with the run time, both ways.
    q, clock = tq
    clock.set_ms(T0)
    job_id = q.enqueue("remind", None, run_at=at(T0 + HOUR_MS), start_within_ms=15 * MIN_MS)
    assert q.reschedule(job_id, delay_ms=10 * MIN_MS) == "rescheduled"
    clock.set_ms(T0 + 25 * MIN_MS + 1)
    assert q.claim("w").jobs == []
    assert q.status(job_id) == "dead"


@pytest.mark.parametrize("how", ["in0", "now", "past"])
def test_an_overdue_job_moved_to_now_gets_its_window_from_now(
    tq: tuple[Queue, Clock], how: str
) -> None:
    # Overdue: its run time and its whole window have passed, no claim came. Moved to now
    # (delay 0, Run now, a past run_at), its window counts from now: run on its last ms.
    q, clock = tq
    clock.set_ms(T0)
    job_id = q.enqueue("remind", None, delay_ms=MIN_MS, start_within_ms=5 * MIN_MS)
    now = T0 + HOUR_MS
    clock.set_ms(now)
    if how == "in0":
        assert q.reschedule(job_id, delay_ms=0) == "rescheduled"
    elif how == "now":
        assert str(q._run(q.ops.run_now(job_id))) == "due"  # due already: nothing moved
    else:
        assert q.reschedule(job_id, run_at=at(T0 - HOUR_MS)) == "rescheduled"
    clock.set_ms(now + 5 * MIN_MS - 1)
    got = [j.id for j in q.claim("w").jobs]
    if how == "now":  # Run now leaves a due job as it is: its deadline passed, it is parked
        assert got == [] and q.status(job_id) == "dead"
    else:
        assert got == [job_id], q.get_job(job_id).dead_reason


def test_a_past_run_at_moves_a_job_without_a_window_and_runs_it(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    clock.set_ms(T0)
    job_id = q.enqueue("t", {"n": 1}, delay_ms=HOUR_MS)
    assert q.reschedule(job_id, run_at=at(T0 - HOUR_MS)) == "rescheduled"
    clock.set_ms(T0 + 30 * 24 * HOUR_MS)  # long after: no window, it still runs
    assert [j.id for j in q.claim("w").jobs] == [job_id]


def test_a_job_flow_control_holds_is_not_moved_and_nothing_is_written(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    first = q.enqueue("t", None, concurrency_key="k", concurrency_limit=1)
    held = q.enqueue("t", None, concurrency_key="k", concurrency_limit=1, start_within_ms=MIN_MS)
    assert [j.id for j in q.claim("w", limit=5).jobs] == [first]
    q.claim("w2", limit=5)  # its claim sets the second job aside: its key's slot is taken
    assert q.status(held) == "held"
    before = dump_queue(client, q)
    assert q.reschedule(held, run_at=at(T0 - HOUR_MS)) == "held"
    assert dump_queue(client, q) == before


# -- scheduler/cli/demo.py: SIGTERM / SIGHUP handlers ----------------------------------------


def test_the_demo_keeps_an_ignored_hangup_ignored() -> None:
    from scheduler.cli import demo

    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts it
    try:
        with demo._stop_on_signals():
            signal.raise_signal(signal.SIGHUP)  # the terminal closed: nohup's to ignore
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


def test_the_demo_puts_an_ignored_signal_back_after_it() -> None:
    from scheduler.cli import demo

    before = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with demo._stop_on_signals():
            pass
        assert [signal.getsignal(s) for s in before] == [signal.SIG_IGN, signal.SIG_IGN]
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


# -- scheduler/cli/confirm.py: a confirmation without a terminal -----------------------------


def dead_job(q: Queue) -> str:
    job_id = q.enqueue("t", None, max_attempts=1)
    (job,) = q.claim("w").jobs
    q.fail(job.id, job.token, ("E", "boom", ""))
    assert q.status(job_id) == "dead"
    return job_id


def gone(q: Queue, job_id: str) -> bool:
    try:
        return q.status(job_id) != "dead"
    except JobNotFound:
        return True


def purge(url: str, q: Queue, stdin: int | IO[str], *extra: str) -> Run:
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("REDIS_URL", None)
    return subprocess.run(
        [SCHEDULER, "dead", "purge", "--url", url, "-q", q.name, *extra],
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_a_file_answering_yes_confirms_and_json_stays_one_object(
    redis_url: str, q: Queue, tmp_path: Path
) -> None:
    job_id = dead_job(q)
    answer = tmp_path / "answer"
    answer.write_text("y\n")
    with answer.open() as f:
        r = purge(redis_url, q, f, "--json")
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)  # stdout: the answer alone, the question went to stderr
    assert "[y/N]" in r.stderr and "[y/N]" not in r.stdout
    assert gone(q, job_id)


def test_an_answer_without_a_newline_before_eof_is_taken(redis_url: str, q: Queue) -> None:
    job_id = dead_job(q)
    r = subprocess.run(
        ["sh", "-c", f"printf yes | {SCHEDULER} dead purge --url {redis_url} -q {q.name}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert gone(q, job_id)


@pytest.mark.parametrize("stdin", ["devnull", "empty line", "no", "closed"])
def test_no_yes_on_stdin_refuses_saying_why_and_changes_nothing(
    redis_url: str, q: Queue, tmp_path: Path, stdin: str
) -> None:
    job_id = dead_job(q)
    if stdin == "closed":
        r = subprocess.run(
            ["sh", "-c", f"exec <&-; {SCHEDULER} dead purge --url {redis_url} -q {q.name}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    elif stdin == "devnull":
        r = purge(redis_url, q, subprocess.DEVNULL)
    else:
        answer = tmp_path / "answer"
        answer.write_text("\n" if stdin == "empty line" else "no\n")
        with answer.open() as f:
            r = purge(redis_url, q, f)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    if stdin in ("devnull", "closed"):
        assert "--yes" in r.stderr, r.stderr
    else:
        assert "declined" in r.stderr, r.stderr
    assert q.status(job_id) == "dead"


# -- partitioned pause / resume / dead retention: every partition checked first --------------


@pytest.mark.parametrize("call", ["pause", "resume", "retention"])
def test_a_refusing_partition_refuses_the_change_whole_sync(
    client: redis.Redis, pq: PartitionedQueue, call: str
) -> None:
    if call == "resume":
        pq.parts[0].pause()
        pq.parts[2].pause()
    client.delete(pq.parts[1].keys.config)
    client.set(pq.parts[1].keys.config, "x")  # by hand: another type
    before = [dump_queue(client, p) for p in pq.parts]
    with pytest.raises(CorruptKey) as err:
        if call == "retention":
            pq.set_dead_retention(max_count=5)
        else:
            getattr(pq, call)()
    assert pq.parts[1].keys.config in str(err.value)
    assert [dump_queue(client, p) for p in pq.parts] == before


@pytest.mark.parametrize("call", ["pause", "resume", "retention"])
def test_a_refusing_partition_refuses_the_change_whole_async(
    client: redis.Redis, redis_url: str, pq: PartitionedQueue, call: str
) -> None:
    if call == "resume":
        pq.parts[0].pause()
    client.delete(pq.parts[2].keys.config)
    client.set(pq.parts[2].keys.config, "x")
    before = [dump_queue(client, p) for p in pq.parts]

    async def go() -> str:
        ac = connect_async(redis_url)
        try:
            apq = await AsyncPartitionedQueue.open(ac, pq.name)
            try:
                if call == "retention":
                    await apq.set_dead_retention(max_count=5)
                else:
                    await getattr(apq, call)()
            except CorruptKey as exc:
                return str(exc)
            return "no error"
        finally:
            await ac.aclose()

    assert pq.parts[2].keys.config in asyncio.run(go())
    assert [dump_queue(client, p) for p in pq.parts] == before


def test_a_sound_partitioned_pause_and_resume_round_trip(
    client: redis.Redis, redis_url: str, pq: PartitionedQueue
) -> None:
    assert pq.parts[1].pause() == "paused"
    assert pq.pause() == "paused"  # any not yet paused
    assert all(client.hexists(p.keys.config, "paused_ms") for p in pq.parts)
    assert pq.pause() == "already"
    assert pq.resume() == "resumed"
    assert pq.resume() == "active"
    assert not any(client.hexists(p.keys.config, "paused_ms") for p in pq.parts)


# -- doctor's new findings: none on a healthy queue ------------------------------------------


def codes(client: redis.Redis, name: str) -> list[str]:
    return [i.code for i in check_queue(client, name)]


def test_doctor_finds_nothing_new_on_a_paused_partitioned_queue_with_retention(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    pq.enqueue("t", None)
    pq.set_dead_retention(max_age_ms=HOUR_MS, max_count=10)
    pq.set_priority_aging(5_000)
    assert pq.pause() == "paused"
    for p in pq.parts:
        found = codes(client, p.name)
        assert "paused-unreadable" not in found and "config-unread" not in found, found


def test_doctor_finds_nothing_new_on_a_paused_plain_queue(client: redis.Redis, q: Queue) -> None:
    q.enqueue("t", None)
    q.set_dead_retention(max_age_ms=HOUR_MS, max_count=10)
    assert q.pause() == "paused"
    found = codes(client, q.name)
    assert "paused-unreadable" not in found and "config-unread" not in found, found


def test_doctor_names_a_hand_edited_pause_and_a_logical_retention_field(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    client.hset(pq.parts[0].keys.config, "paused_ms", "soon")
    client.hset(QueueKeys(pq.name).config, "dead_max_count", "3")  # by hand, on its own name
    found = check_queue(client, pq.parts[0].name)
    assert [i.code for i in found].count("paused-unreadable") == 1
    assert any(i.code == "config-unread" and "dead_max_count" in i.message for i in found), [
        (i.code, i.message) for i in found
    ]


# -- require_queue: an empty partition its layout lists ---------------------------------------


def test_cli_takes_an_empty_listed_partition_and_refuses_an_unlisted_one(
    redis_url: str, pq: PartitionedQueue
) -> None:
    listed = pq.parts[-1].name
    code, out = cli(redis_url, "jobs", "list", "-q", listed, "--json")
    assert code == 0, out
    code, out = cli(redis_url, "jobs", "list", "-q", f"{pq.name}.p{len(pq.parts) + 5}")
    assert code == 1 and "no queue named" in out, out


def test_cli_on_a_partition_of_a_damaged_layout_record_does_not_crash(
    client: redis.Redis, redis_url: str, queue_name: str
) -> None:
    from scheduler.core.partitions import meta_key

    logical = queue_name + "-dmg"
    client.set(meta_key(logical), "not a layout")
    try:
        code, out = cli(redis_url, "jobs", "list", "-q", f"{logical}.p0")
        assert code == 1 and "Traceback" not in out, out
    finally:
        client.delete(meta_key(logical))


# -- CLI notes of a pause; jobs list in a pipe -----------------------------------------------


def cli_split(url: str, *args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, [*args, "--url", url], catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def test_run_now_on_a_paused_partition_names_it_and_json_says_queue_paused(
    redis_url: str, pq: PartitionedQueue
) -> None:
    job_id = pq.enqueue("t", None, delay_ms=HOUR_MS)
    part = next(p for p in pq.parts if _has(p, job_id))
    assert part.pause() == "paused"
    code, out, err = cli_split(redis_url, "jobs", "reschedule", "-q", pq.name, "--now", job_id)
    assert code == 0 and out.strip() == f"{job_id}: rescheduled", (out, err)
    assert "paused" in err and part.name in err, err
    pq.reschedule(job_id, delay_ms=HOUR_MS)
    code, out, err = cli_split(
        redis_url, "jobs", "reschedule", "-q", pq.name, "--now", job_id, "--json"
    )
    assert code == 0 and json.loads(out)["queue_paused"] is True, (out, err)
    assert pq.resume() == "resumed"
    pq.reschedule(job_id, delay_ms=HOUR_MS)
    code, out, err = cli_split(
        redis_url, "jobs", "reschedule", "-q", pq.name, "--now", job_id, "--json"
    )
    assert code == 0 and "queue_paused" not in json.loads(out) and "paused" not in err


def _has(p: Queue, job_id: str) -> bool:
    try:
        p.status(job_id)
    except JobNotFound:
        return False
    return True


def test_reschedule_in_zero_on_a_paused_queue_says_it_waits_for_a_resume(
    redis_url: str, q: Queue
) -> None:
    job_id = q.enqueue("t", None, delay_ms=HOUR_MS)
    assert q.pause() == "paused"
    code, out, err = cli_split(redis_url, "jobs", "reschedule", "-q", q.name, "--in", "0s", job_id)
    assert code == 0 and out.strip() == f"{job_id}: rescheduled", (out, err)
    assert "paused" in err, err


def test_a_piped_leased_list_keeps_long_ids_task_names_and_worker_ids_whole(
    redis_url: str, q: Queue
) -> None:
    task = "reports.generate_" + "quarterly_" * 6 + "summary"
    worker = "worker-" + "host-abcdef0123456789-" * 3 + "pid-4242"
    job_id = q.enqueue(task, None, job_id="id-" + "0123456789" * 6)
    assert [j.id for j in q.claim(worker).jobs] == [job_id]
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("COLUMNS", None)
    r = subprocess.run(
        [SCHEDULER, "jobs", "list", "--url", redis_url, "-q", q.name, "--state", "leased"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    for whole in (job_id, task, worker):
        assert any(whole in line for line in r.stdout.splitlines()), r.stdout
