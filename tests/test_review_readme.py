"""README.md checked against the code, as a newcomer reads it: the "Using it" snippet runs as
written, the key table names every key a job's life writes, the CLI's `--json` / `--queue`
exceptions and `--strict`'s refusals are the ones README states, and `make demo` installs what
`scheduler demo --keep` tells the user to run."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import redis

from scheduler import JobState, Queue
from scheduler.admin.health import check_server
from scheduler.cli.main import main
from tests.conftest import delete_queue

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _flat(text: str) -> str:
    return " ".join(text.split())


def _section(heading: str) -> str:
    start = README.index(f"\n{heading}\n")
    level = heading.split(" ", 1)[0]
    end = README.find(f"\n{level} ", start + len(heading) + 2)
    return README[start : end if end != -1 else None]


def _python_blocks(section: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", section, re.S)


# -- the "Using it" snippet, run as written ------------------------------------------------
@pytest.fixture
def emails(client: redis.Redis, queue_name: str) -> Iterator[str]:
    yield queue_name
    delete_queue(client, Queue(client, queue_name))


def test_using_it_snippet_runs(redis_url: str, emails: str) -> None:
    code = _python_blocks(_section("## Using it"))[0]
    assert '"redis://localhost:6379/0", "emails"' in code
    # Only where it runs changes: this run's server and a queue of its own.
    code = code.replace('"redis://localhost:6379/0", "emails"', f"{redis_url!r}, {emails!r}")
    first: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), first)
    q = first["q"]
    assert isinstance(q, Queue)
    job_id = str(first["job_id"])
    assert q.status(job_id) == JobState.SCHEDULED  # the comment: 5 min ahead
    counts = q.counts()
    assert (counts.due, counts.scheduled, counts.leased, counts.dead) == (0, 1, 0, 0)
    again: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), again)  # "a retry returns the same id"
    assert again["job_id"] == job_id
    assert q.counts().scheduled == 1
    q.client.close()
    again_q = again["q"]
    assert isinstance(again_q, Queue)
    again_q.client.close()


# -- the key table ---------------------------------------------------------------------------
def test_the_key_table_names_every_key_of_a_jobs_life(q: Queue) -> None:
    done = q.enqueue("t", {"n": 1}, key="k1")
    parked = q.enqueue("t", {"n": 2}, max_attempts=1)
    q.cancel(q.enqueue("t", {"n": 3}, delay_ms=60_000))
    for job in q.claim("w", limit=10).jobs:
        if job.id == done:
            q.complete(job.id, job.token, result=1)
        else:
            assert job.id == parked
            q.fail(job.id, job.token, RuntimeError("x"))
    table = _section("### Key schema")
    prefix = q.keys.prefix
    kinds = {k[len(prefix) :].split(":")[0] for k in q.client.scan_iter(match=q.keys.pattern())}
    assert {"dead", "job", "spec", "idem", "stats", "claim"} <= kinds
    missing = sorted(kind for kind in kinds if f"`sched:{{q}}:{kind}" not in table)
    assert not missing, f"README's key table does not name sched:{{q}}:{missing}"


# -- the CLI's common options ----------------------------------------------------------------
def _commands(cmd: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[str, set[str]]]:
    if isinstance(cmd, click.Group):  # list_commands: the root loads its commands lazily
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None, name
            yield from _commands(sub, (*path, name))
    else:
        yield " ".join(path), {o for p in cmd.params for o in getattr(p, "opts", [])}


def test_json_and_queue_exceptions_are_the_ones_readme_names() -> None:
    commands = dict(_commands(main))
    assert all("--url" in opts for opts in commands.values())
    assert {c for c, opts in commands.items() if "--queue" not in opts} == {"demo", "queue move"}
    assert {"--from", "--to"} <= commands["queue move"]
    no_json = {c for c, opts in commands.items() if "--json" not in opts}
    assert no_json == {"worker", "dashboard", "demo"}
    text = _flat(_section("## Operating it"))
    assert (
        "and `--queue` (not `demo`; `queue move` names its two queues with `--from` / `--to`)"
        in text
    )
    assert "every other command but `dashboard` and `demo` takes `--json`" in text


# -- --strict --------------------------------------------------------------------------------
def test_strict_refuses_what_readme_says() -> None:
    safe = {"redis_version": "7.2.0", "aof_enabled": 1}
    good = {"maxmemory-policy": "noeviction", "appendfsync": "always", "save": ""}

    def severities(info: dict[str, object], config: dict[str, str]) -> set[str]:
        return {f.severity for f in check_server(info, config)}

    assert severities(safe, good) == set()
    # Refused with --strict ('error'): persistence off, an evicting policy, Redis < 7.
    assert severities({**safe, "aof_enabled": 0}, good) == {"error"}
    assert severities(safe, {**good, "maxmemory-policy": "allkeys-lru"}) == {"error"}
    assert severities({**safe, "redis_version": "6.2.14"}, good) == {"error"}
    # Only warned about: RDB snapshots only, AOF with everysec.
    rdb_only = {**good, "save": "3600 1"}
    assert severities({**safe, "aof_enabled": 0}, rdb_only) == {"warning"}
    assert severities(safe, {**good, "appendfsync": "everysec"}) == {"warning"}
    text = _flat(_section("## Durability, security, failure"))
    assert "persistence off, an evicting policy, Redis < 7" in text
    assert "(RDB snapshots only, or AOF with `everysec`, stay a warning)" in text


# -- make demo -------------------------------------------------------------------------------
def test_make_demo_installs_the_dashboard_demo_keep_prints() -> None:
    demo = (ROOT / "scheduler/cli/demo.py").read_text()
    assert "{cmd} dashboard{where}" in demo  # printed by `scheduler demo --keep`
    makefile = (ROOT / "Makefile").read_text()
    (stamp,) = re.findall(r"^install: (\S+)$", makefile, re.M)
    rule = makefile.split(f"\n{stamp}:", 1)[1].split("\n\n", 1)[0]
    extras = re.search(r"pip install -q -e '\.\[([^]]*)\]'", rule)
    assert extras is not None, rule
    assert {"embedded", "dashboard"} <= set(extras.group(1).split(","))
    assert re.search(r"^demo: install$", makefile, re.M)
