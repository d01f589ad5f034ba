"""A worker's presence hash edited by hand into another type: the listings that read it
(`scheduler workers`, `workers stop`, the dashboard, doctor's live workers) name the key and the
remedy (a CorruptKey), where they raised a bare WRONGTYPE ("a key edited by hand?")."""

from __future__ import annotations

import shlex

import pytest
import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.admin.inspection import live_workers
from scheduler.cli.main import main
from scheduler.core.errors import CorruptKey
from tests.test_worker_remote_stop import beat


def _edit(client: redis.Redis, q: Queue) -> None:
    beat(q, "w1")
    beat(q, "w2")
    client.delete(q.keys.worker("w1"))
    client.set(q.keys.worker("w1"), "edited")


def test_live_workers_names_the_presence_hash_of_another_type(
    client: redis.Redis, q: Queue
) -> None:
    _edit(client, q)
    with pytest.raises(CorruptKey, match=r"worker 'w1'.*another type") as err:
        live_workers(client, q.keys)
    assert q.keys.worker("w1") in str(err.value)


@pytest.mark.parametrize("args", [["workers"], ["workers", "stop", "w1", "--yes"]])
def test_the_cli_names_the_key_and_its_remedy(
    client: redis.Redis, q: Queue, redis_url: str, args: list[str]
) -> None:
    _edit(client, q)
    got = CliRunner().invoke(main, [*args, "-q", q.name, "--url", redis_url])
    assert got.exit_code != 0
    assert q.keys.worker("w1") in got.output, got.output
    assert "delete it" in got.output
    assert client.get(q.keys.worker("w1")) == "edited"  # nothing written


def test_doctor_reports_the_presence_hash_of_another_type(client: redis.Redis, q: Queue) -> None:
    """The listings' remedy names `scheduler doctor`'s findings: it reports the key, and its fix
    (deleting it) makes the listing whole again."""
    from scheduler.admin.doctor import check_queue

    _edit(client, q)
    found = [i for i in check_queue(client, q.name) if q.keys.worker("w1") in i.message]
    assert [i.code for i in found] == ["wrong-type"], found
    assert found[0].fix.startswith(f"redis-cli DEL {shlex.quote(q.keys.worker('w1'))}")
    client.delete(q.keys.worker("w1"))
    assert [w.id for w in live_workers(client, q.keys)[0]] == ["w2"]
