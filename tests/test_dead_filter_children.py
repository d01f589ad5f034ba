"""A child parked before its first claim (its parent ended dead or cancelled) has its task in its
spec record alone: the dead-letter task filter (dead_ids, requeue and purge by task, `dead list
--task`) reads it there too. It found none of them."""

from __future__ import annotations

import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.cli.main import main


def test_children_parked_with_their_parent_match_their_task(redis_url: str, q: Queue) -> None:
    parent = q.enqueue("parent.t", 1, max_attempts=1)
    children = {q.enqueue("child.t", i, after=[parent]) for i in range(3)}
    (job,) = q.claim("w", limit=5).jobs
    q.fail(job.id, job.token, ("E", "m", ""))  # its children are parked with it
    late = q.enqueue("child.t", 9, after=[parent])  # its parent already dead: parked at once
    children.add(late)
    assert set(q.dead_ids()) == children | {parent}
    assert set(q.dead_ids(task="child.t")) == children
    assert q.dead_ids(task="parent.t") == [parent]
    assert q.dead_ids(task="child.t", error_type="E") == []  # never ran: no error of their own
    out = CliRunner().invoke(
        main, ["dead", "list", "-q", q.name, "--task", "child.t", "--url", redis_url]
    )
    assert out.exit_code == 0 and all(c in out.stdout for c in children), out.stdout
    purge = ["dead", "purge", "-q", q.name, "--task", "child.t", "--yes", "--url", redis_url]
    assert CliRunner().invoke(main, purge).exit_code == 0
    assert q.dead_ids() == [parent]


def test_one_spec_record_edited_into_another_type_hides_only_itself(
    client: redis.Redis, q: Queue
) -> None:
    parent = q.enqueue("parent.t", 1, max_attempts=1)
    children = [q.enqueue("child.t", i, after=[parent]) for i in range(3)]
    (job,) = q.claim("w", limit=5).jobs
    q.fail(job.id, job.token, ("E", "m", ""))
    client.delete(q.keys.spec(children[0]))
    client.hset(q.keys.spec(children[0]), "by", "hand")
    assert set(q.dead_ids(task="child.t")) == set(children[1:])
