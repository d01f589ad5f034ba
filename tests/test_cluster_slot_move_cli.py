"""The CLI while a queue's hash slot is being migrated between Redis Cluster nodes (a reshard,
docs/cluster.md "Moving a queue's slot"): every read of the queue is refused for now, TRYAGAIN
('Multiple keys request during rehashing of slot') or redis-py's 'TTL exhausted' once its
redirections are used up. Exit 3 as before, with a line that says what is going on and what to
do instead of those words ('cannot reach Redis: Command # 1 (EXISTS ...) of pipeline caused
error: TTL exhausted.'). The move is made by tests/fixtures/slot_move.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler.cli.main import main
from scheduler.core.connection import connect
from scheduler.dashboard import Auth, create_app
from tests.conftest import delete_queue
from tests.fixtures.slot_move import partitioned_on_the_move, queue_on_the_move

SAYS = "is being migrated to another Redis Cluster node"
AGAIN = "run the command again once the move is done"


@pytest.fixture(params=["keys-split", "all-moved"])
def moving(request: pytest.FixtureRequest, cluster_url: str, queue_name: str) -> Iterator[Queue]:
    """A queue whose slot is split: some of its keys moved (keys-split), or all (all-moved)."""
    most = 4 if request.param == "keys-split" else None
    with queue_on_the_move(cluster_url, queue_name, jobs=6, most=most) as q:
        yield q


@pytest.mark.parametrize(
    "args",
    [["doctor", "-q"], ["stats", "-q"], ["jobs", "list", "-q"], ["dead", "list", "-q"]],
    ids=lambda a: " ".join(a[:-1]),
)
def test_a_command_on_a_queue_being_moved_says_so(
    cluster_url: str, moving: Queue, args: list[str]
) -> None:
    result = CliRunner().invoke(main, [*args, moving.name, "--url", cluster_url])
    assert result.exit_code == 3, result.output
    line = result.stderr
    assert f"queue {moving.name}'s hash slot {SAYS}" in line and AGAIN in line, line


def test_commands_over_every_queue_say_so_too(cluster_url: str, moving: Queue) -> None:
    doctor = CliRunner().invoke(main, ["doctor", "--url", cluster_url])
    assert doctor.exit_code == 3 and SAYS in doctor.stderr and AGAIN in doctor.stderr, doctor.output
    stats = CliRunner(env={"COLUMNS": "300"}).invoke(main, ["stats", "--url", cluster_url])
    assert stats.exit_code == 3  # the other queues' rows, this one's says why it is missing
    assert f"{moving.name}: its hash slot {SAYS}" in stats.stdout and AGAIN in stats.stdout, (
        stats.output
    )


@pytest.fixture
def moving_partition(cluster_url: str, queue_name: str) -> Iterator[tuple[str, str]]:
    """A partitioned queue (2 partitions) whose first partition's slot has all its keys moved:
    (queue, that partition's name). The other partition answers."""
    with partitioned_on_the_move(cluster_url, queue_name, jobs=3) as pq:
        yield queue_name, pq.parts[0].name


@pytest.mark.parametrize("args", [["dead", "list", "-q"], ["jobs", "list", "-q"]], ids=" ".join)
def test_a_partitioned_queues_partition_being_moved_is_named_so(
    cluster_url: str, moving_partition: tuple[str, str], args: list[str]
) -> None:
    """Its reads print the other partition's and named this one with redis-py's raw words
    ('not read: partition <p>: TTL exhausted.')."""
    name, part = moving_partition
    result = CliRunner().invoke(main, [*args, name, "--url", cluster_url])
    assert result.exit_code == 3, result.output
    line = result.stderr
    assert f"not read: partition {part}: its hash slot {SAYS}" in line and AGAIN in line, line


def test_the_dashboard_overview_says_a_queues_slot_is_being_moved(
    cluster_url: str, moving: Queue, queue_name: str
) -> None:
    """Its "Not shown" line said 'Redis did not answer (TTL exhausted.)' or 'Redis refused for
    now (Multiple keys request during rehashing of slot)'."""
    other = Queue(connect(cluster_url), f"{queue_name}-other")
    other.enqueue("t", None)
    try:
        app = create_app(url=cluster_url, queues=(moving.name, other.name), auth=Auth())
        with TestClient(app) as web:
            page = web.get("/api/overview")
        assert page.status_code == 200, page.text[-500:]
        (said,) = [u for u in page.json()["unreachable"] if moving.name in u]
        assert said.startswith(f"queue {moving.name}: its hash slot {SAYS}") and AGAIN in said
    finally:
        delete_queue(other.client, other)


def test_keys_names_a_partition_being_moved_so(
    cluster_url: str, moving_partition: tuple[str, str]
) -> None:
    """`keys -q` of a partitioned queue built 'partition <p>: <exc>' on its own, with
    redis-py's raw words ('TTL exhausted.'), and took the moving slot's node for one down: its
    other partitions were not read either (a slot on the move is that partition's alone)."""
    name, part = moving_partition
    result = CliRunner().invoke(main, ["keys", "-q", name, "--url", cluster_url])
    assert result.exit_code == 3, result.output
    assert f"partition {part}: its hash slot {SAYS}" in result.output, result.output
    assert f"keys of partition '{part}'" not in result.output
    assert result.output.count("keys of partition") == 1, result.output  # the other one
