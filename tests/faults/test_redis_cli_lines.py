"""The `redis-cli` lines the CLI prints (doctor's fixes, `scheduler keys`' examples) reach the
server the command was given: pasted into a shell as shown, they act on it (a unix socket, a
TCP port and database, TLS with its CA, an ACL user asked for its password), never the
default local server. The password itself is never printed."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable

import click
import pytest
import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.admin.redis_cli import COMMANDS, at_node, connection_flags, with_flags, with_url
from scheduler.cli.main import main
from scheduler.core.keys import QueueKeys
from tests.faults.conftest import Server, Tls, free_port
from tests.redis_server import require_binary

QUEUE = "clilines"


@pytest.mark.parametrize(
    ("url", "flags"),
    [
        ("redis://localhost:6379/0", []),
        ("redis://127.0.0.1", []),
        ("redis://db.internal:7000/2", ["-h", "db.internal", "-p", "7000", "-n", "2"]),
        (
            "redis://u:secret@h:6380?db=1",
            ["-h", "h", "-p", "6380", "-n", "1", "--user", "u", "--askpass"],
        ),
        ("redis://:secret@localhost:6400", ["-p", "6400", "--askpass"]),
        ("unix:///run/r.sock?db=3", ["-s", "/run/r.sock", "-n", "3"]),
        ("rediss://h:6390/0?ssl_cert_reqs=none", ["-h", "h", "-p", "6390", "--tls", "--insecure"]),
        ("redis+cluster://10.0.0.1:7001,10.0.0.2:7002/", ["-h", "10.0.0.1", "-p", "7001", "-c"]),
    ],
)
def test_flags_name_the_server_of_the_url(url: str, flags: list[str]) -> None:
    assert connection_flags(url) == flags
    assert "secret" not in " ".join(connection_flags(url))


def test_a_sentinel_url_without_an_answer_gives_the_bare_line() -> None:
    assert connection_flags("redis+sentinel://127.0.0.1:1/mymaster", client=None) == []


def test_flags_go_after_each_command_word_never_into_quoted_data() -> None:
    flags = ["-p", "7000"]
    line = "redis-cli TYPE 'sched:{redis-cli x}:due', then DEL it"
    quoted = "redis-cli -p 7000 TYPE 'sched:{redis-cli x}:due', then DEL it"
    assert with_flags(line, flags) == quoted
    two = "redis-cli CONFIG SET appendonly yes && redis-cli CONFIG SET appendfsync always"
    assert with_flags(two, flags).count("redis-cli -p 7000 CONFIG") == 2
    inspect = "inspect it (redis-cli GET k; redis-cli TYPE j)"
    assert with_flags(inspect, flags) == (
        "inspect it (redis-cli -p 7000 GET k; redis-cli -p 7000 TYPE j)"
    )
    assert with_flags("see redis-cli's manual", flags) == "see redis-cli's manual"
    assert with_flags("redis-cli GET k", []) == "redis-cli GET k"


def _paste(line: str, stdin: str = "") -> str:
    """Run one printed line in a shell, as an operator pasting it would."""
    done = subprocess.run(["bash", "-c", line], input=stdin, capture_output=True, text=True,
                          timeout=30, check=True)  # fmt: skip
    return done.stdout


def _example(output: str, command: str) -> str:
    return next(ln.strip() for ln in output.splitlines() if ln.strip().startswith("redis-cli")
                and f" {command} " in ln)  # fmt: skip


def test_keys_examples_reach_a_private_tcp_server_and_database(
    start_server: Callable[..., Server],
) -> None:
    require_binary("redis-cli", "the printed lines are run as an operator would")
    server = start_server(tcp=True)
    url = f"redis://127.0.0.1:{server.port}/4"
    job = Queue.from_url(url, QUEUE).enqueue("t", {"n": 1})
    out = CliRunner(env={"COLUMNS": "300"}).invoke(main, ["keys", "--url", url, "-q", QUEUE])
    assert out.exit_code == 0, out.output
    line = _example(out.output, "ZRANGE")
    assert f"-p {server.port} -n 4" in line
    assert job in _paste(line)  # without the flags: the shared server, database 0


def test_doctor_fix_line_reaches_a_unix_socket_server(start_server: Callable[..., Server]) -> None:
    require_binary("redis-cli", "the printed lines are run as an operator would")
    server = start_server()
    url = f"unix://{server.socket}"
    admin = server.admin()
    Queue.from_url(url, QUEUE).enqueue("t", {"n": 1})
    wake = QueueKeys(QUEUE).wake
    admin.delete(wake)
    admin.set(wake, "edited by hand")  # doctor: the wake-up LIST of another type
    runner = CliRunner(env={"COLUMNS": "300"})
    out = runner.invoke(main, ["doctor", "--no-server", "--url", url, "-q", QUEUE])
    fix = next(ln for ln in out.output.splitlines() if "fix: redis-cli" in ln)
    line = fix.split("fix: ", 1)[1].split(" (advisory")[0]
    assert line.startswith(f"redis-cli -s {shlex.quote(server.socket)} DEL ")
    _paste(line)
    assert admin.exists(wake) == 0


def test_tls_and_acl_user_lines_ask_for_the_password(
    start_server: Callable[..., Server], tls_certs: Tls
) -> None:
    require_binary("redis-cli", "the printed lines are run as an operator would")
    port = free_port()
    server = start_server(*tls_certs.server_args(port))
    server.admin().acl_setuser("ops", enabled=True, passwords=["+s3cret pw"], keys=["*"],
                               commands=["+@all"])  # fmt: skip
    url = f"rediss://ops:s3cret%20pw@localhost:{port}/0?ssl_ca_certs={tls_certs.ca}"
    job = Queue.from_url(url, QUEUE).enqueue("t", {"n": 1})
    out = CliRunner(env={"COLUMNS": "400"}).invoke(main, ["keys", "--url", url, "-q", QUEUE])
    assert out.exit_code == 0, out.output
    assert "s3cret" not in out.output
    line = _example(out.output, "ZRANGE")
    assert f"--tls --cacert {tls_certs.ca} --user ops --askpass" in line
    assert job in _paste(line, stdin="s3cret pw\n")


def test_at_node_aims_the_flags_at_one_cluster_node() -> None:
    seed = connection_flags("rediss+cluster://u:pw@10.0.0.1:7001/?ssl_cert_reqs=none")
    assert seed == ["-h", "10.0.0.1", "-p", "7001", "-c", "--tls", "--insecure", "--user", "u",
                    "--askpass"]  # fmt: skip
    assert at_node(seed, "10.0.0.3:7003") == [
        "-h", "10.0.0.3", "-p", "7003", "--tls", "--insecure", "--user", "u", "--askpass"
    ]  # fmt: skip
    assert at_node([], "[::1]:7004") == ["-h", "::1", "-p", "7004"]


def test_scheduler_lines_get_the_url_at_the_end_of_each_command() -> None:
    u = "redis://h:1/0"
    cases = {
        "scheduler doctor --fix --queue q": "scheduler doctor --fix --queue q --url redis://h:1/0",
        "to drop it: scheduler dead purge -q q --id a:b":
            "to drop it: scheduler dead purge -q q --id a:b --url redis://h:1/0",
        "scheduler doctor --fix: it removes":
            "scheduler doctor --fix --url redis://h:1/0: it removes",
        "scheduler doctor --fix   # runs x":
            "scheduler doctor --fix --url redis://h:1/0   # runs x",
        "it (`scheduler schedules pause -q q 'a b'`, then": (
            "it (`scheduler schedules pause -q q 'a b' --url redis://h:1/0`, then"),
        "scheduler jobs show -q q i; (scheduler jobs cancel -q q i)": (
            "scheduler jobs show -q q i --url redis://h:1/0; "
            "(scheduler jobs cancel -q q i --url redis://h:1/0)"),
        "see the scheduler documentation": "see the scheduler documentation",
        "'scheduler doctor' quoted": "'scheduler doctor' quoted",
    }  # fmt: skip
    for text, want in cases.items():
        assert with_url(text, u) == want, text
    assert with_url("scheduler doctor --fix", None) == "scheduler doctor --fix"


def test_the_command_words_are_the_clis() -> None:
    ctx = click.Context(main)
    assert set(main.list_commands(ctx)) == COMMANDS


def test_a_pasted_doctor_fix_repairs_the_checked_server(
    start_server: Callable[..., Server],
) -> None:
    server = start_server(tcp=True)
    url = f"redis://127.0.0.1:{server.port}/3"
    q = Queue.from_url(url, QUEUE)
    job = q.enqueue("t", {"n": 1})
    admin = redis.Redis(port=server.port, db=3, decode_responses=True)
    admin.zrem(q.keys.due, job)  # an orphan: in no place, doctor --fix puts it back in due
    runner = CliRunner(env={"COLUMNS": "300", "REDIS_URL": None})
    data = json.loads(runner.invoke(main, ["doctor", "--json", "--no-server", "--url", url,
                                           "-q", QUEUE]).output)  # fmt: skip
    (fix,) = [f["fix"] for f in data["findings"] if f["job_id"] == job]
    assert fix == f"scheduler doctor --fix --queue {QUEUE} --url {url}"
    bin_dir = os.path.dirname(sys.executable)  # the venv's `scheduler`
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("REDIS_URL", None)
    # Exit 1: the private server's own findings (no persistence) remain; the job is repaired.
    done = subprocess.run(["bash", "-c", fix], env=env, capture_output=True, text=True, timeout=60)
    assert admin.zscore(q.keys.due, job) is not None, done.stdout + done.stderr


def test_a_url_with_a_password_is_shown_redacted_in_scheduler_lines(
    start_server: Callable[..., Server],
) -> None:
    server = start_server(tcp=True)
    server.admin().config_set("requirepass", "hunter2")
    url = f"redis://:hunter2@127.0.0.1:{server.port}/0"
    q = Queue.from_url(url, QUEUE)
    job = q.enqueue("t", {"n": 1})
    redis.Redis(port=server.port, password="hunter2").zrem(q.keys.due, job)
    out = CliRunner(env={"COLUMNS": "300", "REDIS_URL": None}).invoke(
        main, ["doctor", "--no-server", "--url", url, "-q", QUEUE]
    )
    assert "hunter2" not in out.output
    assert f"--url 'redis://:***@127.0.0.1:{server.port}/0'" in out.output
