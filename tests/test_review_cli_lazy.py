"""Review of 1c2eee0 / b0a2af9 (each CLI command registered from its own module on demand;
the worker's runtime imported in the command body; croniter at the first cron parsed) as an
operator meets it: every command run in a fresh process, the way `scheduler ...` starts.

Each subprocess is fresh for the module it exercises: a group's subcommands are asked in the
process that loaded that group first, so one process per top-level command."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from scheduler.cli import main as cli_main
from scheduler.client.queue import Queue
from scheduler.core.connection import connect

ROOT = Path(__file__).resolve().parents[1]
SCHEDULER = str(Path(sys.executable).parent / "scheduler")
DOC = (ROOT / "docs" / "cli.md").read_text()
ENV = dict(os.environ, COLUMNS="80", PYTHONPATH=str(ROOT))

# Runs main() once per argv given as JSON in argv[1], each output captured; prints a JSON list
# of [exit code, stdout + stderr] and which of a few modules got loaded.
_RUNNER = r"""
import contextlib, io, json, sys
croniter_before = "croniter" in sys.modules
from scheduler.cli.main import main
out = []
for argv in json.loads(sys.argv[1]):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            main(argv, prog_name="scheduler")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out.append([code, buf.getvalue()])
print(json.dumps({"runs": out, "croniter_before": croniter_before,
                  "croniter_after": "croniter" in sys.modules}))
"""


# The whole tree's --help of each argv (every module registered), in a fresh interpreter too:
# in the test's own process click caches each command's help option the first time another
# test invokes it (outside main, without its -h), so an in-process reference can differ.
_WHOLE = r"""
import json, sys
from click.testing import CliRunner
from scheduler.cli.main import main
main.register_all()
runner = CliRunner()
print(json.dumps([runner.invoke(main, argv, prog_name="scheduler", terminal_width=78).output
                  for argv in json.loads(sys.argv[1])]))
"""


def _whole(argvs: list[list[str]]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", _WHOLE, json.dumps(argvs)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    return [str(o) for o in json.loads(done.stdout.splitlines()[-1])]


def _start(argvs: list[list[str]]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _RUNNER, json.dumps(argvs)],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _finish(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    return dict(json.loads(out.splitlines()[-1]))


def _runs(argvs_per_process: list[list[list[str]]]) -> list[list[tuple[int, str]]]:
    """Each list of argvs in its own fresh interpreter, the interpreters started together."""
    procs = [_start(argvs) for argvs in argvs_per_process]
    results = [_finish(p) for p in procs]
    return [[(int(c), str(o)) for c, o in r["runs"]] for r in results]  # type: ignore[attr-defined]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _documented_paths() -> list[tuple[str, ...]]:
    return [tuple(m.group(1).split()) for m in re.finditer(r"^## scheduler (.+)$", DOC, re.M)]


def _doc_section(path: tuple[str, ...]) -> str:
    head = "## scheduler " + " ".join(path) + "\n"
    start = DOC.index(head) + len(head)
    end = DOC.find("\n## ", start)
    return DOC[start : end if end != -1 else len(DOC)]


def _flat(text: str) -> str:
    return " ".join(text.split())


# -- every documented command's --help, fresh --------------------------------------------------


def test_every_documented_command_and_subcommand_helps_fresh_as_the_whole_tree_does() -> None:
    """docs/cli.md (made from the whole tree, every module registered) names each command; in
    a fresh process each one's --help exits 0 with the very text the whole tree prints, the
    usage line docs/cli.md shows, and every option its table lists."""
    paths = _documented_paths()
    tops = sorted({p[0] for p in paths})
    assert tops == sorted(cli_main.SUMMARIES)  # the doc and the lazy list name the same commands
    groups = [[[*p, "--help"] for p in paths if p[0] == top] for top in tops]
    for argvs in groups:  # the group itself first: what loads its module
        argvs.sort(key=len)
    fresh = _runs(groups)
    wholes = iter(_whole([argv for argvs in groups for argv in argvs]))
    seen = 0
    for argvs, results in zip(groups, fresh, strict=True):
        for argv, (code, text) in zip(argvs, results, strict=True):
            path = tuple(argv[:-1])
            assert (code, text) == (0, next(wholes)), path
            section = _doc_section(path)
            usage = re.search(r"```text\n(.+)\n```", section)
            assert usage is not None, path
            assert _flat(text).startswith("Usage: " + usage.group(1)), path
            for cell in re.findall(r"^\| `([^`]+)` \|", section, re.M):
                assert _flat(cell.replace("\\", "")) in _flat(text), (path, cell)
            seen += 1
    assert seen == len(paths) >= 33


def test_the_entry_point_and_python_m_show_the_command_list_and_the_exit_codes() -> None:
    """`scheduler --help` (the installed entry point) and `python -m scheduler --help`: exit 0,
    every command of docs/cli.md's table with its summary, and docs/cli.md's exit codes."""
    for cmd in ([SCHEDULER, "--help"], [sys.executable, "-m", "scheduler", "--help"]):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT, env=ENV)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("Usage: "), done.stdout[:200]
        for name in cli_main.SUMMARIES:
            assert re.search(rf"^  {re.escape(name)} +\S", done.stdout, re.M), name
        for code in ("0", "1", "2", "3", "4", "5", "130"):
            assert re.search(rf"^ +{code}  \S", done.stdout, re.M), code
        assert "Exit codes (every command, the worker too):" in done.stdout


# -- misspelt commands -------------------------------------------------------------------------


def test_a_misspelt_command_or_subcommand_gets_clicks_suggestion() -> None:
    """A typo of a command (`stat`) or of a group's subcommand (`dead requeu`, `queue mov`,
    ...): click's "No such command" with the right suggestion, exit 2, as before 1c2eee0.
    `help` is not a command (none is documented): refused the same way, no traceback."""
    typos = [(["queue", "mov"], "'mov'. Did you mean 'move'?"),
             (["schedules", "lst"], "'lst'. Did you mean 'list'?"),
             (["jobs", "lst"], "'lst'. Did you mean 'list'?"),
             (["workers", "lis"], "'lis'. Did you mean 'list'?"),
             (["dead", "requeu"], "'requeu'. Did you mean 'requeue'?"),
             (["stat"], "'stat'. Did you mean 'stats'?"),
             (["help"], "No such command 'help'.")]  # fmt: skip
    [results] = _runs([[argv for argv, _ in typos]])
    for (argv, said), (code, text) in zip(typos, results, strict=True):
        assert code == 2, (argv, text)
        assert f"Error: No such command {said}" in text or f"Error: {said}" in text, (argv, text)
        assert "Traceback" not in text, argv
    # through the entry point, a fresh process each (the top-level lookup then loads them all)
    for argv, said in ((["stat"], "Did you mean 'stats'?"), (["dead", "requeu"], "'requeue'?")):
        done = subprocess.run([SCHEDULER, *argv], capture_output=True, text=True, timeout=60,
                              cwd=ROOT, env=ENV)  # fmt: skip
        assert done.returncode == 2 and said in done.stderr, (argv, done.stderr)
        assert f"Usage: scheduler {' '.join(argv[:-1])}".rstrip() in done.stderr, done.stderr


# -- exit codes without a server ---------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["stats"], ["dead", "list"], ["doctor"], ["jobs", "list"], ["pause"], ["schedules", "list"],
     ["queue", "priority-aging"]],
)  # fmt: skip
def test_a_bad_url_exits_2_and_a_closed_port_exits_3_in_a_fresh_process(
    command: list[str],
) -> None:
    """docs/cli.md's exit codes: 2 for a URL no retry mends, 3 for a Redis that cannot be
    reached; one fresh process per command (its own module only loaded)."""
    closed = f"redis://127.0.0.1:{_closed_port()}/0"
    [results] = _runs([[[*command, "--url", "bogus://x"], [*command, "--url", closed]]])
    (bad_code, bad_text), (down_code, down_text) = results
    assert bad_code == 2, bad_text
    assert down_code == 3, down_text
    assert "Traceback" not in bad_text + down_text


def test_the_worker_and_the_demo_refuse_a_closed_port_and_a_bad_url_as_documented() -> None:
    """The worker imports its runtime in the command body now: a bad URL still exits 2, a
    closed port 3, the pool's `--burst` refusal 2 (one line), and `demo --url` a closed port 3
    (its start_failure import moved into the command too)."""
    closed = f"redis://127.0.0.1:{_closed_port()}/0"
    reg = "tests.workers.basic:registry"
    cases = [
        (["worker", reg, "--url", "bogus://x"], 2, None),
        (["worker", reg, "--url", closed, "--burst"], 3, "cannot reach Redis"),
        (["worker", reg, "--url", closed, "--processes", "2", "--burst"], 2,
         "--burst runs one process: drop --processes"),
        (["demo", "--url", closed], 3, "cannot reach Redis"),
    ]  # fmt: skip
    procs = [subprocess.Popen([SCHEDULER, *argv], cwd=ROOT, env=ENV, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for argv, _, _ in cases]  # fmt: skip
    for (argv, code, said), proc in zip(cases, procs, strict=True):
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == code, (argv, out[-2000:])
        assert "Traceback" not in out, argv
        if said is not None:
            assert said in out, (argv, out[-2000:])
        if "--processes" in argv:
            assert out.strip().splitlines() == [f"error: {said}"], out


# -- real commands against a private Redis -----------------------------------------------------


@pytest.fixture
def server(module_server: object) -> Iterator[tuple[str, Queue]]:
    url = str(module_server.url)  # type: ignore[attr-defined]
    client = connect(url)
    client.flushall()
    queue = Queue(client, "lazyq")
    yield url, queue
    client.close()


def test_each_group_runs_for_real_in_a_fresh_process(server: tuple[str, Queue]) -> None:
    """stats, dead list, jobs list, doctor, keys, queue priority-aging (set, then shown),
    schedules add / list with a cron (croniter not loaded at start, loaded at the first cron
    parsed), pause / resume: each in a fresh process, each exit 0 with what it should say."""
    url, q = server
    ids = [q.enqueue("echo", {"n": n}) for n in range(2)]
    q.schedule("nightly", "noop", cron="0 9 * * *", tz="UTC")
    at = ["--url", url, "--queue", q.name]
    plan = [
        [["stats", "--json", *at]],
        [["dead", "list", "--json", *at]],
        [["jobs", "list", "--state", "due", "--json", *at]],
        [["doctor", *at]],
        [["keys", *at]],
        [["queue", "priority-aging", "30s", *at], ["queue", "priority-aging", "--json", *at]],
        [["schedules", "list", "--json", *at]],
        [["schedules", "add", "often", "noop", "--cron", "*/5 * * * *", *at]],
        [["pause", *at], ["resume", *at]],
    ]
    procs = [_start(argvs) for argvs in plan]
    done = [_finish(p) for p in procs]
    runs = [[(int(c), str(o)) for c, o in d["runs"]] for d in done]  # type: ignore[attr-defined]
    for argvs, results in zip(plan, runs, strict=True):
        for argv, (code, text) in zip(argvs, results, strict=True):
            # doctor: exit 1 for the private server's own settings (persistence off), no more
            assert code == (1 if argv[0] == "doctor" else 0), (argv, text[-2000:])
            assert "Traceback" not in text, argv
    assert q.name in runs[0][0][1] and '"due": 2' in runs[0][0][1].replace('"due":2', '"due": 2')
    assert '"total": 0' in runs[1][0][1] or '"jobs": []' in runs[1][0][1], runs[1][0][1]
    assert all(i in runs[2][0][1] for i in ids), runs[2][0][1]
    assert "checked 1 queue(s)" in runs[3][0][1] and "error lazyq" not in runs[3][0][1]
    assert "30000" in runs[5][1][1], runs[5][1][1]
    assert "nightly" in runs[6][0][1] and "0 9 * * *" in runs[6][0][1], runs[6][0][1]
    assert runs[7][0][1].strip() == "often: created", runs[7][0][1]
    assert [t.strip() for _, t in runs[8]] == ["lazyq: paused", "lazyq: resumed"], runs[8]
    for d in done:
        assert d["croniter_before"] is False
    assert done[7]["croniter_after"] is True  # the cron checked at definition, croniter late
    assert sorted(s.name for s in q.list_schedules()) == ["nightly", "often"]


def test_a_burst_worker_runs_its_jobs_and_exits_0(server: tuple[str, Queue]) -> None:
    """`scheduler worker REG --burst` with the worker's runtime imported in the command body:
    each due job done, exit 0."""
    url, q = server
    ids = [q.enqueue("echo", {"n": n}) for n in range(3)]
    env = dict(ENV, TEST_REDIS_URL=url)
    done = subprocess.run(
        [SCHEDULER, "worker", "tests.workers.basic:registry", "--url", url, "--queue", q.name,
         "--burst"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert [str(q.status(i)) for i in ids] == [str(q.status(ids[0]))] * 3
    assert all("done" in str(q.status(i)).lower() for i in ids), [q.status(i) for i in ids]


def test_a_pool_whose_metrics_port_is_taken_exits_1_with_one_line(
    server: tuple[str, Queue],
) -> None:
    """worker --processes 2 --metrics-port on a taken port: exit 1 and one line (b0a2af9
    moved metrics_port_failure's import into that branch)."""
    url, q = server
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [SCHEDULER, "worker", "tests.workers.basic:registry", "--url", url, "--queue",
             q.name, "--processes", "2", "--metrics-port", str(port)],
            capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV,
        )  # fmt: skip
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 1, lines
    assert len(lines) == 1 and f"cannot serve metrics on port {port}" in lines[0], lines


def test_a_pool_parent_does_not_load_the_workers_runtime(server: tuple[str, Queue]) -> None:
    """b0a2af9: a --processes pool's parent only starts and watches children, so it does not
    load the worker's runtime. Its children here fail to import their registry (exit 4), the
    parent stops, and says what it had loaded."""
    url, q = server
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('LOADED', sorted(m for m in ('scheduler.cli.worker_start',"
        " 'scheduler.worker.runtime') if m in sys.modules), file=sys.stderr))\n"
        "from scheduler.cli.main import main\n"
        "main(sys.argv[1:], prog_name='scheduler')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "worker", "tests.no_such_module:registry", "--url", url,
         "--queue", q.name, "--processes", "2"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV,
    )  # fmt: skip
    assert done.returncode == 4, done.stderr[-2000:]
    loaded = [line for line in done.stderr.splitlines() if line.startswith("LOADED")]
    assert loaded == ["LOADED []"], loaded


def test_click_sees_every_command_of_the_table() -> None:
    """The top-level list in a fresh interpreter (no command loaded) names what register_all
    gives: LAZY and SUMMARIES agree with the commands click ends up with."""
    group = click.Group("probe")
    for module in cli_main.MODULES:
        __import__(f"scheduler.cli.{module}", fromlist=["register"]).register(group)
    assert sorted(group.commands) == sorted(cli_main.LAZY) == sorted(cli_main.SUMMARIES)
