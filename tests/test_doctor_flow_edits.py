"""doctor against flow control's hand edits (docs/flow-control.md): a config field the scripts
read with a silent default, a schedule's flow field read as unset, and a member of a key's
lease set (flow:ck:<key>) that is no lease of that key, which holds a slot for ever. Real
scripts on a private Redis."""

from __future__ import annotations

import pytest
import redis

from scheduler import Queue
from scheduler.admin.doctor import check_queue, repair_queue

FAR_MS = 7_000_000_000_000  # 2191: a score no lease reaches


def codes(client: redis.Redis, q: Queue) -> list[str]:
    return [i.code for i in check_queue(client, q.name)]


@pytest.mark.parametrize(
    ("field", "value", "used"),
    [
        ("priority_aging_ms", "30s", "60000"),
        ("priority_aging_ms", "-1", "60000"),
        ("priority_aging_ms", "999999999999999", "60000"),
        ("dead_max_age_ms", "30d", "no age limit"),
        ("dead_max_count", "ten", "no count limit"),
        ("dead_max_count", "-1", "no count limit"),
    ],
)
def test_doctor_names_a_config_field_the_scripts_cannot_read(
    q: Queue, client: redis.Redis, field: str, value: str, used: str
) -> None:
    client.hset(q.keys.config, field, value)  # by hand
    found = [i for i in check_queue(client, q.name) if i.code == "config-unreadable"]
    assert len(found) == 1  # before: nothing (only `generation` was read)
    assert field in found[0].message and repr(value) in found[0].message
    assert used in found[0].message
    assert found[0].severity == "warning" and not found[0].repair


def test_readable_config_fields_are_no_finding(q: Queue, client: redis.Redis) -> None:
    client.hset(q.keys.config, mapping={"priority_aging_ms": "0", "dead_max_count": "0"})
    q.set_dead_retention(max_age_ms=86_400_000)
    assert "config-unreadable" not in codes(client, q)


def test_doctor_warns_of_a_dead_max_age_of_zero(q: Queue, client: redis.Redis) -> None:
    client.hset(q.keys.config, "dead_max_age_ms", "0")  # set_dead_retention refuses 0
    found = [i for i in check_queue(client, q.name) if i.code == "config-unreadable"]
    assert len(found) == 1 and "every dead letter" in found[0].message


@pytest.mark.parametrize(
    ("field", "value", "severity"),
    [
        ("rcount", "ten", "error"),
        ("rwindow", "1h", "error"),
        ("rkey", "no key", "error"),
        ("ckey", "a b", "error"),
        ("climit", "many", "warning"),
        ("priority", "high", "warning"),
    ],
)
def test_doctor_names_a_schedules_flow_field_read_as_unset(
    q: Queue, client: redis.Redis, field: str, value: str, severity: str
) -> None:
    q.schedule(
        "rated", "report", every_ms=60_000, priority=3, concurrency_key="exp",
        concurrency_limit=2, rate_limit="5/1s", rate_key="api",
    )  # fmt: skip
    assert codes(client, q) == []
    client.hset(q.keys.schedule("rated"), field, value)  # by hand
    found = [i for i in check_queue(client, q.name) if i.code == "schedule-flow-unreadable"]
    assert len(found) == 1  # before: nothing
    assert field in found[0].message and "'rated'" in found[0].message
    assert found[0].severity == severity
    s = q.get_schedule("rated")
    assert s.flow_unreadable == field and s.unreadable == ""


def test_schedules_list_flags_a_flow_field_read_as_unset(
    q: Queue, client: redis.Redis, redis_url: str
) -> None:
    from click.testing import CliRunner

    from scheduler.cli.main import main

    q.schedule("rated", "report", every_ms=60_000, rate_limit="5/1s", rate_key="api")
    client.hset(q.keys.schedule("rated"), "rcount", "ten")  # by hand
    out = CliRunner().invoke(main, ["schedules", "list", "--url", redis_url, "-q", q.name])
    assert out.exit_code == 0, out.output
    assert "rcount" in out.output and "doctor" in out.output


def test_a_stray_member_of_a_keys_lease_set_blocks_it_until_doctor_fix(
    q: Queue, client: redis.Redis
) -> None:
    ck = q.keys.prefix + "flow:ck:tenant:1"
    client.zadd(ck, {"ghost": FAR_MS})  # by hand: no lease of the key
    a = q.enqueue("sync", 1, concurrency_key="tenant:1", concurrency_limit=1)
    assert q.claim("w", limit=5).jobs == []  # the key is full of the ghost
    assert client.zscore(q.keys.flow_held, a) is not None
    found = [i for i in check_queue(client, q.name) if i.code == "flow-slot-stray"]
    assert len(found) == 1 and "ghost" in found[0].message  # before: nothing
    assert found[0].repair
    report = repair_queue(client, q.name)
    assert [i.code for i in report.fixed] == ["flow-slot-stray"]
    assert report.remaining == []
    assert client.zscore(ck, "ghost") is None
    assert [j.id for j in q.claim("w", limit=5).jobs] == [a]  # its held job went back to due


def test_a_real_lease_of_a_key_is_no_stray_and_the_fix_spares_it(
    q: Queue, client: redis.Redis
) -> None:
    a = q.enqueue("sync", 1, concurrency_key="k", concurrency_limit=2)
    other = q.enqueue("sync", 2, concurrency_key="other", concurrency_limit=1)
    assert {j.id for j in q.claim("w", limit=5).jobs} == {a, other}
    ck = q.keys.prefix + "flow:ck:k"
    client.zadd(ck, {other: FAR_MS})  # a lease, but of another key
    found = [i for i in check_queue(client, q.name) if i.code == "flow-slot-stray"]
    assert [other in i.message for i in found] == [True]
    repair_queue(client, q.name)
    assert [str(m) for m in client.zrange(ck, 0, -1)] == [a]
    assert client.zscore(q.keys.prefix + "flow:ck:other", other) is not None
    assert codes(client, q) == []


def test_a_bad_flow_field_is_repaired_by_removing_and_adding_not_by_redefining(
    q: Queue, client: redis.Redis
) -> None:
    """What the finding's fix says (docs/flow-control.md): a definition with the same options
    has the same digest, so it changes nothing; removed and added again, it is written whole."""
    opts: dict[str, object] = {"every_ms": 60_000, "rate_limit": "5/1s", "rate_key": "api"}
    q.schedule("rated", "report", **opts)  # type: ignore[arg-type]
    client.hset(q.keys.schedule("rated"), "rcount", "ten")  # by hand
    q.schedule("rated", "report", **opts)  # type: ignore[arg-type]
    assert q.get_schedule("rated").flow_unreadable == "rcount"
    q.remove_schedule("rated")
    q.schedule("rated", "report", **opts)  # type: ignore[arg-type]
    assert q.get_schedule("rated").flow_unreadable == ""
    assert codes(client, q) == []


def test_the_cli_finds_and_frees_a_stray_slot_on_a_cluster(cluster_url: str) -> None:
    """On a Redis Cluster the queue's flow:ck:* keys are found by SCAN of its own node (they
    share its slot) and --fix runs there; the key's held job then runs."""
    import json

    from click.testing import CliRunner
    from redis.cluster import RedisCluster

    from scheduler.cli.main import main
    from scheduler.core.connection import connect

    rc = connect(cluster_url)
    assert isinstance(rc, RedisCluster)
    q = Queue(rc, "stray-slot-cluster")
    ck = q.keys.prefix + "flow:ck:tenant:1"
    try:
        rc.zadd(ck, {"ghost": FAR_MS})
        a = q.enqueue("sync", 1, concurrency_key="tenant:1", concurrency_limit=1)
        assert q.claim("w", limit=5).jobs == []
        args = ["doctor", "--url", cluster_url, "-q", q.name, "--no-server", "--json"]
        found = CliRunner().invoke(main, args)
        assert found.exit_code == 1, found.output
        assert [f["code"] for f in json.loads(found.output)["findings"]] == ["flow-slot-stray"]
        fixed = CliRunner().invoke(main, [*args, "--fix"])
        assert fixed.exit_code == 0, fixed.output
        assert [f["code"] for f in json.loads(fixed.output)["fixed"]] == ["flow-slot-stray"]
        assert [j.id for j in q.claim("w", limit=5).jobs] == [a]
    finally:
        for key in list(rc.scan_iter(match=q.keys.prefix + "*")):
            rc.delete(key)
        rc.close()
