"""Upgrades and rolling deploys, reviewed against three older commits of this repository run in
subprocesses beside this version on one private Redis (the supported mixed-version window of
docs/guide/workers.md, "Upgrading across a storage-layout change", is e75411e on):

- 3da7550, ~100 commits back: the newest layout but for the clock-step rate fixes;
- 0746687, ~300 back: before 174a2e8 (a job no worker holds names no worker) and 5c37b34 (a
  lapsed job on its last attempt is a suspect);
- 87a49fe, ~500 back: before 6dedb37 (script-call bounds: 500 reaped, 1,000 enqueued per call),
  fbeacb5 (a key's held jobs placed by priority), d454a66 (queue move). 285b023 (~600 back) is
  tests/test_rolling_deploy.py's.

Each tree is `git archive <rev> scheduler lua`, exported once per module: its code finds its
own `lua/` beside its package (scheduler/core/scripts.py lua_dir), and a client loads its own
scripts by digest, so each version runs its own rules. Checked: what either version wrote
(waiting, delayed, keyed, flow, leased by a worker that dies, dead, retried, schedules) is run,
listed, requeued and doctored by the other; workers of both on one queue; an old worker's
SIGTERM and SIGKILL handing jobs over; an old pool's SIGHUP reload into this code; a newer
storage generation refused by the old versions. Defects first, as strict xfails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.cli.main import main
from scheduler.client.partitioned import open_queue
from scheduler.core.backoff import Backoff
from scheduler.core.connection import connect
from tests.conftest import dump_queue
from tests.redis_server import RedisProcess
from tests.workers.procs import SPAWNED_LOGS, stop_all, wait_for

ROOT = Path(__file__).resolve().parent.parent
NEWEST, MIDDLE, OLDEST = "3da7550", "0746687", "87a49fe"
REVS = [NEWEST, MIDDLE, OLDEST]

# Imported by workers of either version: every start and end goes to a ledger with the server's
# time, the job's attempt and which tree ran it (VER, or the resolved package path).
REGISTRY = """
import json, os, time
from pathlib import Path
import redis
import scheduler
from scheduler.worker.registry import Registry

registry = Registry()
_c = redis.Redis.from_url(os.environ["TEST_REDIS_URL"], decode_responses=True)
_TREE = str(Path(scheduler.__file__).resolve().parents[1])


def mark(ctx, what):
    sec, usec = _c.time()
    entry = {"id": ctx.job_id, "attempt": ctx.attempt, "what": what,
             "ver": os.environ.get("VER", "?"), "tree": _TREE, "pid": os.getpid(),
             "t": int(sec) * 1000 + int(usec) // 1000}
    _c.rpush("ru:ledger:" + ctx.queue, json.dumps(entry))


@registry.task(name="work")
def work(payload, ctx):
    payload = payload or {}
    mark(ctx, "start")
    deadline = time.time() + payload.get("s", 0)
    while time.time() < deadline:
        time.sleep(0.02)
    if payload.get("fail_until", 0) >= ctx.attempt:
        raise RuntimeError("planned")
    mark(ctx, "end")
    return payload.get("i")


@registry.task(name="tick")
def tick(payload, ctx):
    mark(ctx, "start")
    mark(ctx, "end")
"""


# -- fixtures and helpers ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`tree(rev)`: the package and Lua of `rev`, exported once per module (git archive, never a
    worktree or checkout of this repository)."""
    made: dict[str, Path] = {}

    def tree(rev: str) -> Path:
        if rev not in made:
            where = tmp_path_factory.mktemp(f"old-{rev}")
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "scheduler", "lua"],
                                     capture_output=True)  # fmt: skip
            if archive.returncode != 0:
                pytest.skip(f"git cannot export {rev}: {archive.stderr.decode()[:200]}")
            subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
            made[rev] = where
        return made[rev]

    return tree


@pytest.fixture(scope="module")
def reg_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The registry both versions import; also the neutral cwd of every subprocess (with
    `python -c` / `-m` the cwd comes first on sys.path: never a tree's or this repository's)."""
    where = tmp_path_factory.mktemp("ru-reg")
    (where / "ru_reg.py").write_text(REGISTRY)
    return where


@pytest.fixture
def url(module_server: RedisProcess) -> str:
    return module_server.url


@pytest.fixture
def c(url: str) -> Iterator[redis.Redis]:
    client = connect(url)
    yield client
    client.close()


@pytest.fixture
def qname() -> str:
    return "ru-" + uuid.uuid4().hex[:10]


def run_old(tree: Path, url: str, code: str, cwd: Path, **env: str) -> Any:
    """`code` run by `tree`'s package with this venv's python; its stdout's last line, JSON."""
    full = dict(os.environ, PYTHONPATH=str(tree), U=url, **env)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def spawn(code_root: Path, reg: Path, url: str, queues: list[str], ver: str, log: Path,
          *extra: str) -> subprocess.Popen[bytes]:  # fmt: skip
    """`scheduler worker` of the package under `code_root` (an old tree, or this repository)."""
    env = dict(os.environ, PYTHONPATH=f"{code_root}{os.pathsep}{reg}", TEST_REDIS_URL=url,
               VER=ver)  # fmt: skip
    qs = [a for q in queues for a in ("--queue", q)]
    SPAWNED_LOGS.append(str(log))
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "scheduler", "worker", "ru_reg:registry", "--url", url, *qs,
             "--json-logs", *extra],
            cwd=reg, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
        )  # fmt: skip


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            stop_all([p])


def server_ms(client: redis.Redis) -> int:
    sec, usec = client.time()
    return int(sec) * 1000 + int(usec) // 1000


def ledger(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    return [json.loads(e) for e in client.lrange(f"ru:ledger:{queue}", 0, -1)]


def doctor(url: str, queue: str, *extra: str) -> list[dict[str, Any]]:
    """This version's doctor on one queue: its findings about that queue (the private server's
    own persistence finding left out)."""
    got = CliRunner().invoke(main, ["doctor", "--json", *extra, "--url", url, "-q", queue])
    assert got.exception is None or isinstance(got.exception, SystemExit), got.output
    return [f for f in json.loads(got.output)["findings"] if f["queue"] == queue]


def assert_clean_logs(*logs: Path) -> None:
    for log in logs:
        text = log.read_text()
        assert "Traceback" not in text and '"level": "error"' not in text, text[-3000:]


# -- defects -----------------------------------------------------------------------------------
def test_an_older_clients_claim_reaps_up_to_its_own_limit_as_documented(
    trees: Callable[[str], Path], reg_dir: Path, url: str, c: redis.Redis, qname: str
) -> None:
    q = Queue(c, qname)
    ids = [q.enqueue("work", {"i": i}) for i in range(700)]
    assert len(q.claim("crashed", limit=700, lease_ms=1).jobs) == 700
    time.sleep(0.02)  # every lease lapsed
    old = """
        import json, os
        from scheduler import Queue
        from scheduler.core.connection import connect
        q = Queue(connect(os.environ['U']), os.environ['Q'])
        print(json.dumps(len(q.claim('old-w', limit=1, reap_limit=10_000).jobs)))
    """
    assert run_old(trees(OLDEST), url, old, reg_dir, Q=qname) == 1
    # docs/limits.md: a client from before 6dedb37 runs its own claim.lua, which reaps up to its
    # reap_limit in one call (the docs said it was clamped to 500 like this version's).
    assert q.counts().leased == 1 and q.counts().due == len(ids) - 1


def test_an_older_clients_batch_over_1000_is_one_call_as_documented(
    trees: Callable[[str], Path], reg_dir: Path, url: str, c: redis.Redis, qname: str
) -> None:
    old = """
        import json, os
        from scheduler import Queue, JobSpec
        from scheduler.core.connection import connect
        q = Queue(connect(os.environ['U']), os.environ['Q'])
        try:
            q.enqueue_many([JobSpec('work', {'i': i}) for i in range(1_001)], batch_size=1_001)
            err = None
        except Exception as exc:
            err = [type(exc).__name__, str(exc)]
        print(json.dumps(err))
    """
    err = run_old(trees(OLDEST), url, old, reg_dir, Q=qname)
    # docs/limits.md: a client from before 6dedb37 runs its own enqueue.lua, which takes up to
    # 10,000 in one call (the docs said this version's refused it).
    assert err is None, err
    assert Queue(c, qname).counts().due == 1_001


def test_an_older_versions_finished_and_parked_jobs_name_no_worker(
    trees: Callable[[str], Path], reg_dir: Path, url: str, c: redis.Redis, qname: str
) -> None:
    old = """
        import json, os, time
        from scheduler import Queue
        from scheduler.core.connection import connect
        q = Queue(connect(os.environ['U']), os.environ['Q'])
        ids = {'crashed': q.enqueue('work', {'i': 1}, max_attempts=1),
               'cancelled': q.enqueue('work', {'i': 2}),
               'done': q.enqueue('work', {'i': 3}, keep_payload=True)}
        js = {j.id: j for j in q.claim('w-1', limit=3, lease_ms=60_000).jobs}
        q.cancel(ids['cancelled'])
        q.complete(ids['done'], js[ids['done']].token, 3)
        q.heartbeat([(ids['crashed'], js[ids['crashed']].token)], lease_ms=1)  # then it dies
        time.sleep(0.02)
        q.claim('w-2', limit=0)  # reaps: its last attempt, parked 'lease expired'
        print(json.dumps(ids))
    """
    ids = run_old(trees(MIDDLE), url, old, reg_dir, Q=qname)
    q = Queue(c, qname)
    assert q.get_job(ids["crashed"]).dead_reason == "lease expired"
    states = {name: q.status(jid).value for name, jid in ids.items()}
    assert states == {"crashed": "dead", "cancelled": "cancelled", "done": "done"}
    for name, jid in ids.items():
        # models.Job.worker: "The worker id holding the lease (None when not leased)"; jobs show
        # and the dashboard print it as the job's worker.
        assert q.get_job(jid).worker is None, (name, q.get_job(jid).worker)
        got = CliRunner().invoke(main, ["jobs", "show", jid, "--json", "--url", url, "-q", qname])
        assert json.loads(got.output)["worker"] is None, got.output


# -- what an older version wrote, read and run here --------------------------------------------
OLD_WRITER = """
    import json, os
    from scheduler import Queue
    from scheduler.core.backoff import Backoff
    from scheduler.core.connection import connect
    q = Queue(connect(os.environ['U']), os.environ['Q'])
    ids = {}
    ids['tolease'] = q.enqueue('work', {'n': 'tolease'}, max_attempts=5)
    ids['todie'] = q.enqueue('work', {'n': 'todie'}, max_attempts=1, keep_payload=True)
    ids['retry'] = q.enqueue('work', {'n': 'retry'}, max_attempts=3,
                             backoff=Backoff(3_600_000, 2.0, 3_600_000, 0.0))
    # An old worker claims three jobs and dies holding one (its lease lapses in 1.5 s).
    got = {j.payload()['n']: j for j in q.claim('old-w', limit=3, lease_ms=1_500).jobs}
    q.fail(got['todie'].id, got['todie'].token, ('E', 'boom', ''), retryable=False)
    q.fail(got['retry'].id, got['retry'].token, ('E', 'again', ''), retryable=True)
    ids['plain'] = q.enqueue('work', {'n': 'plain'})
    ids['delayed'] = q.enqueue('work', {'n': 'delayed'}, delay_ms=3_600_000)
    ids['keyed'] = q.enqueue('work', {'n': 'keyed'}, key='idem-1')
    ids['keyed_again'] = q.enqueue('work', {'n': 'keyed-again'}, key='idem-1')
    ids['prio'] = q.enqueue('work', {'n': 'prio'}, priority=7, max_attempts=3, timeout_ms=4_000)
    ids['ck1'] = q.enqueue('work', {'n': 'ck1'}, concurrency_key='ck', concurrency_limit=1)
    ids['ck2'] = q.enqueue('work', {'n': 'ck2'}, concurrency_key='ck', concurrency_limit=1)
    ids['rate'] = q.enqueue('work', {'n': 'rate'}, rate_limit=(1, 3_600_000), rate_key='rk')
    ids['rate2'] = q.enqueue('work', {'n': 'rate2'}, rate_limit=(1, 3_600_000), rate_key='rk')
    ids['parent'] = q.enqueue('work', {'n': 'parent'}, delay_ms=3_600_000)
    ids['child'] = q.enqueue('work', {'n': 'child'}, after=[ids['parent']])
    ids['window'] = q.enqueue('work', {'n': 'window'}, start_within_ms=3_600_000, keep_payload=True)
    q.schedule('every', 'tick', {'s': 1}, every_ms=3_600_000, concurrency_key='sk',
               concurrency_limit=1, priority=2)
    q.schedule('cron', 'tick', {'s': 2}, cron='0 3 * * *', tz='Europe/Paris')
    print(json.dumps(ids))
"""


@pytest.mark.parametrize("rev", REVS)
def test_an_older_versions_jobs_are_listed_doctored_run_and_requeued_here(
    trees: Callable[[str], Path], reg_dir: Path, url: str, c: redis.Redis, qname: str, rev: str
) -> None:
    ids = run_old(trees(rev), url, OLD_WRITER, reg_dir, Q=qname)
    q = Queue(c, qname)
    assert ids["keyed_again"] == ids["keyed"]
    # This version's doctor finds nothing to say of it, and --fix writes nothing.
    before = dump_queue(c, q)
    assert doctor(url, qname) == []
    assert doctor(url, qname, "--fix") == []
    assert dump_queue(c, q) == before
    want = {"tolease": "leased", "todie": "dead", "retry": "scheduled", "delayed": "scheduled",
            "parent": "scheduled", "child": "held"}  # fmt: skip
    waiting = ("plain", "keyed", "prio", "ck1", "ck2", "rate", "rate2", "window")
    want |= dict.fromkeys(waiting, "due")
    assert {n: q.status(ids[n]).value for n in want} == want
    runner = CliRunner()
    for state in ("due", "scheduled", "held", "leased", "dead"):
        got = runner.invoke(main, ["jobs", "list", "--state", state, "--json", "--url", url,
                                   "-q", qname])  # fmt: skip
        assert got.exit_code == 0, got.output
        listed = {j["id"] for j in json.loads(got.output)["jobs"]}
        assert {ids[n] for n, s in want.items() if s == state} <= listed, (state, got.output)
    scheds = {s.name: s for s in q.list_schedules()}
    assert set(scheds) == {"every", "cron"}
    assert scheds["every"].concurrency_key == "sk" and scheds["every"].priority == 2
    assert all(s.next_run_ms is not None and s.next_run_ms > server_ms(c) for s in scheds.values())

    # Claimed here: the waiting ones at once, the dead worker's after its lease, nothing early.
    seen: dict[str, int] = {}
    deadline = time.monotonic() + 10
    while "tolease" not in seen and time.monotonic() < deadline:
        for j in q.claim("new-w", limit=50).jobs:
            seen[j.payload()["n"]] = j.attempts
            if j.id == ids["prio"]:
                assert (j.max_attempts, j.timeout_ms) == (3, 4_000)
            q.complete(j.id, j.token, None)
        time.sleep(0.1)
    assert set(seen) == {"plain", "keyed", "prio", "ck1", "ck2", "rate", "window", "tolease"}
    assert seen["tolease"] == 2
    assert q.status(ids["rate2"]).value == "held"  # its window's one start was 'rate'
    assert {q.status(ids[n]).value for n in ("delayed", "parent", "retry")} == {"scheduled"}
    assert q.get_job(ids["window"]).payload() == {"n": "window"}
    # The old version's dead letter requeued and run here; its schedule run now.
    assert q.requeue_dead([ids["todie"]]) == 1
    [job] = q.claim("new-w", limit=50).jobs
    assert (job.id, job.payload(), job.attempts) == (ids["todie"], {"n": "todie"}, 1)
    q.complete(job.id, job.token, None)
    run = q.run_schedule_now("every")
    [job] = q.claim("new-w", limit=50).jobs
    assert (job.id, job.task, job.payload()) == (run, "tick", {"s": 1})
    q.complete(job.id, job.token, None)
    assert doctor(url, qname) == []


def test_an_older_versions_live_state_gives_this_doctor_nothing_to_fix(
    trees: Callable[[str], Path], reg_dir: Path, url: str, c: redis.Redis, qname: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    """A suspect isolated on its worker, parked children, held jobs, a paused schedule, a
    retention, a paused queue and a live worker of the oldest version."""
    old = """
        import json, os, time
        from scheduler import Queue
        from scheduler.core.connection import connect
        q = Queue(connect(os.environ['U']), os.environ['Q'])
        ids = {'sus': q.enqueue('work', {'n': 'sus'})}
        for _ in range(2):  # two crashed batches: a suspect
            q.claim('crash-w', limit=1, lease_ms=30)
            time.sleep(0.06)
        ids['suspect'] = q.claim('iso-w', limit=1, lease_ms=600_000).suspect
        ids['p'] = q.enqueue('work', {'n': 'p'}, max_attempts=1)
        ids['kid'] = q.enqueue('work', {'n': 'kid'}, after=[ids['p']])
        ids['grandkid'] = q.enqueue('work', {'n': 'gk'}, after=[ids['kid']])
        ids['ck_a'] = q.enqueue('work', {}, concurrency_key='k', concurrency_limit=1)
        ids['ck_b'] = q.enqueue('work', {}, concurrency_key='k', concurrency_limit=1, priority=9)
        ids['r1'] = q.enqueue('work', {}, rate_limit=(1, 3_600_000), rate_key='r')
        ids['r2'] = q.enqueue('work', {}, rate_limit=(1, 3_600_000), rate_key='r')
        ids['late'] = q.enqueue('work', {}, start_within_ms=1)
        time.sleep(0.01)
        for j in q.claim('w2', limit=20, lease_ms=600_000).jobs:
            if j.id == ids['p']:
                q.fail(j.id, j.token, ('E', 'x', ''), retryable=False)
        ids['cancelled'] = q.enqueue('work', {}, delay_ms=100_000)
        q.cancel(ids['cancelled'])
        q.schedule('sp', 'work', {'n': 's'}, every_ms=60_000, concurrency_key='sk',
                   concurrency_limit=1, priority=3)
        q.schedule('sp2', 'work', None, cron='*/5 * * * *')
        q.pause_schedule('sp2')
        q.set_dead_retention(max_age_ms=86_400_000, max_count=1_000)
        p = Queue(connect(os.environ['U']), os.environ['Q'] + '-paused')
        p.enqueue('work', {})
        p.pause()
        print(json.dumps(ids))
    """
    ids = run_old(trees(OLDEST), url, old, reg_dir, Q=qname)
    q = Queue(c, qname)
    assert ids["suspect"] == ids["sus"]
    assert {q.status(ids[n]).value for n in ("p", "kid", "grandkid", "late")} == {"dead"}
    assert {q.status(ids[n]).value for n in ("ck_a", "r2")} == {"held"}
    w = spawn(trees(OLDEST), reg_dir, url, [qname + "-idle"], "old", tmp_path / "old.log")
    try:
        wait_for(lambda: c.zcard(Queue(c, qname + "-idle").keys.workers) == 1, 60, "old worker")
        for name in (qname, qname + "-paused", qname + "-idle"):
            before = dump_queue(c, Queue(c, name))
            assert doctor(url, name) == [], name
            assert doctor(url, name, "--fix") == [], name
            after = dump_queue(c, Queue(c, name))
            if name.endswith("-idle"):  # its live worker beats meanwhile
                before = {k: v for k, v in before.items() if ":worker" not in k}
                after = {k: v for k, v in after.items() if ":worker" not in k}
            assert after == before, name
        got = CliRunner().invoke(main, ["workers", "--json", "--url", url, "-q", qname + "-idle"])
        [listed] = json.loads(got.output)["workers"]
        assert listed["hears_stop"] is True and listed["queues"] == [qname + "-idle"]
        got = CliRunner().invoke(main, ["stats", "--json", "--url", url, "-q", qname + "-paused"])
        assert json.loads(got.output)["queues"][0]["paused_ms"] is not None, got.output
    finally:
        stop([w])
    assert_clean_logs(tmp_path / "old.log")


# -- what this version wrote, run by an older one ----------------------------------------------
OLD_CLAIMER = """
    import json, os, time
    from scheduler import Queue
    from scheduler.core.connection import connect
    q = Queue(connect(os.environ['U']), os.environ['Q'])
    ids = json.loads(os.environ['IDS'])
    seen = []
    deadline = time.time() + 5
    while time.time() < deadline and not {'tolease', 'ck_lo'} <= {s[0] for s in seen}:
        for j in q.claim('old-w', limit=50).jobs:
            seen.append([j.payload()['n'], j.attempts, j.max_attempts, j.timeout_ms])
            q.complete(j.id, j.token, None)
        time.sleep(0.1)
    out = {'seen': seen, 'requeued': q.requeue_dead([ids['todie']])}
    out['after_requeue'] = [[j.payload(), j.attempts] for j in q.claim('old-w', limit=50).jobs]
    run = q.run_schedule_now('every')
    out['run_now'] = [[j.id == run, j.start_by_ms, j.task] for j in q.claim('old-w', limit=50).jobs]
    print(json.dumps(out))
"""


@pytest.mark.parametrize("rev", REVS)
def test_this_versions_jobs_are_run_by_an_older_claimer(
    trees: Callable[[str], Path], reg_dir: Path, url: str, c: redis.Redis, qname: str, rev: str
) -> None:
    q = Queue(c, qname)
    ids = {"tolease": q.enqueue("work", {"n": "tolease"}),
           "todie": q.enqueue("work", {"n": "todie"}, max_attempts=1, keep_payload=True),
           "retry": q.enqueue("work", {"n": "retry"}, max_attempts=3,
                              backoff=Backoff(3_600_000, 2.0, 3_600_000, 0.0)),
           "ckrun": q.enqueue("work", {"n": "ckrun"}, concurrency_key="ck",
                              concurrency_limit=1)}  # fmt: skip
    got = {j.payload()["n"]: j for j in q.claim("new-w", limit=4, lease_ms=1_000).jobs}
    q.fail(got["todie"].id, got["todie"].token, ("E", "boom", ""), retryable=False)
    q.fail(got["retry"].id, got["retry"].token, ("E", "again", ""), retryable=True)
    # Held by this version's claim (the key full): placed by priority in flow:ckheld.
    ids["ck_lo"] = q.enqueue("work", {"n": "ck_lo"}, concurrency_key="ck", concurrency_limit=1)
    ids["ck_hi"] = q.enqueue("work", {"n": "ck_hi"}, concurrency_key="ck", concurrency_limit=1,
                             priority=9)  # fmt: skip
    assert q.claim("new-w", limit=10).jobs == []
    assert {q.status(ids["ck_lo"]).value, q.status(ids["ck_hi"]).value} == {"held"}
    rest: list[tuple[str, dict[str, Any]]] = [
        ("plain", {}), ("delayed", {"delay_ms": 3_600_000}), ("keyed", {"key": "i"}),
        ("prio", {"priority": 7, "max_attempts": 3, "timeout_ms": 4_000}),
        ("rate", {"rate_limit": (1, 3_600_000), "rate_key": "rk"}),
        ("rate2", {"rate_limit": (1, 3_600_000), "rate_key": "rk"}),
        ("parent", {"delay_ms": 3_600_000}),
        ("window", {"start_within_ms": 3_600_000, "keep_payload": True}),
    ]  # fmt: skip
    for name, kw in rest:
        ids[name] = q.enqueue("work", {"n": name}, **kw)
    ids["child"] = q.enqueue("work", {"n": "child"}, after=[ids["parent"]])
    q.enqueue("work", {"n": "deb1"}, key="d", debounce=True)
    ids["deb"] = q.enqueue("work", {"n": "deb2"}, key="d", debounce=True)
    q.schedule("every", "tick", None, every_ms=3_600_000, start_within_ms=600_000,
               concurrency_key="sk", concurrency_limit=1)  # fmt: skip
    q.schedule("cron", "tick", None, cron="0 3 * * *", tz="Europe/Paris")
    time.sleep(1.05)  # this version's worker died: its two leases lapsed
    out = run_old(trees(rev), url, OLD_CLAIMER, reg_dir, Q=qname, IDS=json.dumps(ids))
    seen = {s[0]: s[1:] for s in out["seen"]}
    assert len(out["seen"]) == len(seen)  # none twice
    assert set(seen) == {"tolease", "ckrun", "ck_hi", "ck_lo", "plain", "keyed", "prio", "rate",
                         "window", "deb2"}  # fmt: skip
    assert seen["tolease"][0] == 2 and seen["ckrun"][0] == 2  # the lapsed attempts counted
    assert seen["prio"] == [1, 3, 4_000]
    order = [s[0] for s in out["seen"]]
    assert order.index("ck_hi") < order.index("ck_lo")  # the key's held jobs by priority
    assert out["requeued"] == 1 and out["after_requeue"] == [[{"n": "todie"}, 1]]
    [(is_run, start_by, task)] = out["run_now"]
    assert is_run and task == "tick" and start_by is not None  # the schedule's start window
    states = {n: q.status(ids[n]).value for n in ("delayed", "parent", "retry", "child", "rate2")}
    assert states == {"delayed": "scheduled", "parent": "scheduled", "retry": "scheduled",
                      "child": "held", "rate2": "held"}  # fmt: skip
    assert q.get_job(ids["window"]).payload() == {"n": "window"}
    assert doctor(url, qname) == []


SCHEDULES: list[tuple[str, dict[str, Any]]] = [
    ("a", {"every_ms": 60_000}),
    (
        "b",
        {"cron": "*/5 * * * *", "tz": "Europe/Paris", "jitter_ms": 1_000, "misfire": "catch_up:3"},
    ),
    (
        "c",
        {
            "every_ms": 3_600_000,
            "priority": 4,
            "concurrency_key": "sk",
            "concurrency_limit": 2,
            "max_attempts": 3,
            "timeout_ms": 5_000,
        },
    ),
    ("d", {"every_ms": 600_000, "rate_limit": [2, 60_000], "rate_key": "rr"}),
    ("e", {"cron": "0 * * * * *", "misfire": "skip"}),
    ("f", {"every_ms": 600_000, "start_within_ms": 30_000}),
]
SCHEDULER_CODE = """
    import json, os
    from scheduler import Queue
    from scheduler.core.connection import connect
    q = Queue(connect(os.environ['U']), os.environ['Q'])
    out = {}
    for name, kw in json.loads(os.environ['DEFS']):
        if 'rate_limit' in kw:
            kw['rate_limit'] = tuple(kw['rate_limit'])
        out[name] = q.schedule(name, 'tick', {'x': name}, **kw)
    print(json.dumps(out))
"""


@pytest.mark.parametrize("rev", REVS)
def test_schedules_defined_at_every_start_up_stay_unchanged_across_versions(
    trees: Callable[[str], Path], reg_dir: Path, url: str, c: redis.Redis, rev: str
) -> None:
    """Old and new app instances each call schedule(...) at start-up during a deploy: the same
    definition is 'unchanged' whichever wrote it, and no pending run is replaced."""

    def new_side(q: Queue) -> dict[str, str]:
        out = {}
        for name, kw in SCHEDULES:
            kw = {**kw, "rate_limit": tuple(kw["rate_limit"])} if "rate_limit" in kw else kw
            out[name] = q.schedule(name, "tick", {"x": name}, **kw)
        return out

    defs = json.dumps(SCHEDULES)
    for first in ("old", "new"):
        q = Queue(c, "ru-" + uuid.uuid4().hex[:10])
        env = {"Q": q.name, "DEFS": defs}
        made = run_old(trees(rev), url, SCHEDULER_CODE, reg_dir, **env) if first == "old" else (
            new_side(q))  # fmt: skip
        assert set(made.values()) == {"created"}
        before = dump_queue(c, q)
        again = new_side(q) if first == "old" else run_old(trees(rev), url, SCHEDULER_CODE,
                                                           reg_dir, **env)  # fmt: skip
        assert set(again.values()) == {"unchanged"}, again
        assert dump_queue(c, q) == before


# -- workers of both versions ------------------------------------------------------------------
OLD_PRODUCER = """
    import json, os, time
    from scheduler import Queue
    from scheduler.core.backoff import Backoff
    from scheduler.core.connection import connect
    q = Queue(connect(os.environ['U']), os.environ['Q'])
    q.schedule('tick200', 'tick', None, every_ms=200)
    out = {}
    for i in range(30):
        s, u = q.client.time()
        delay = (0, 200, 500)[i % 3]
        kw = {}
        if i % 3 == 1:
            kw = {'concurrency_key': 'ck', 'concurrency_limit': 2}
        if i % 4 == 2:
            kw = {'max_attempts': 3, 'backoff': Backoff(50, 2.0, 200, 0.0)}
        payload = {'i': 1000 + i, 's': 0.03, 'fail_until': 1 if i % 4 == 2 else 0}
        at = int(s) * 1000 + int(u) // 1000 + delay
        out[q.enqueue('work', payload, delay_ms=delay, **kw)] = at
        time.sleep(0.04)
    print(json.dumps(out))
"""


@pytest.mark.parametrize("rev", REVS)
def test_old_and_new_workers_and_producers_share_one_queue(
    trees: Callable[[str], Path], reg_dir: Path, url: str, c: redis.Redis, qname: str, rev: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    """An old and a new worker, an old and a new producer at once, and an interval schedule the
    old producer defined: every job runs, each attempt once, none before its run time, the key
    never past its limit, each schedule slot once."""
    tree = trees(rev)
    logs = [tmp_path / "old.log", tmp_path / "new.log"]
    workers = [
        spawn(tree, reg_dir, url, [qname], "old", logs[0], "--concurrency", "4"),
        spawn(ROOT, reg_dir, url, [qname], "new", logs[1], "--concurrency", "4"),
    ]
    q = Queue(c, qname)
    try:
        wait_for(lambda: c.zcard(q.keys.workers) == 2, 60, "both workers up")
        env = dict(os.environ, PYTHONPATH=str(tree), U=url, Q=qname)
        producer = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(OLD_PRODUCER)],
            cwd=reg_dir,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        not_before: dict[str, int] = {}
        for i in range(30):
            delay = (0, 200, 500)[i % 3]
            kw: dict[str, Any] = {}
            if i % 3 == 1:
                kw = {"concurrency_key": "ck", "concurrency_limit": 2}
            if i % 4 == 2:
                kw = {"max_attempts": 3, "backoff": Backoff(50, 2.0, 200, 0.0)}
            if i % 4 == 3:
                kw = {"priority": 5, "start_within_ms": 60_000}
            t0 = server_ms(c)
            payload = {"i": i, "s": 0.03, "fail_until": 1 if i % 4 == 2 else 0}
            not_before[q.enqueue("work", payload, delay_ms=delay, **kw)] = t0 + delay
            time.sleep(0.04)
        out, _ = producer.communicate(timeout=60)
        assert producer.returncode == 0
        not_before |= json.loads(out.splitlines()[-1])
        wait_for(lambda: {q.status(j).value for j in not_before} == {"done"}, 60, "all done")
        q.remove_schedule("tick200")
    finally:
        stop(workers)
    starts = [e for e in ledger(c, qname) if e["what"] == "start"]
    assert {e["ver"] for e in starts} == {"old", "new"}
    assert [k for k, n in Counter((e["id"], e["attempt"]) for e in starts).items() if n > 1] == []
    assert set(not_before) <= {e["id"] for e in starts}
    assert [e for e in starts if e["t"] < not_before.get(e["id"], 0)] == []  # none early
    runs = [e for e in starts if e["id"].startswith("schedule:tick200:")]
    slots = sorted(int(e["id"].rsplit(":", 1)[1]) for e in runs)
    assert len(slots) >= 5 and len(set(slots)) == len(slots)  # each slot once
    assert [e for e in runs if e["t"] < int(e["id"].rsplit(":", 1)[1])] == []
    running, most = 0, 0  # the key's jobs at once, by the marks' server times
    keyed = {j for j in not_before if q.get_job(j).fields.get("ckey") == "ck"}
    marks = [e for e in ledger(c, qname) if e["id"] in keyed]
    for e in sorted(marks, key=lambda e: (e["t"], e["what"])):
        running += 1 if e["what"] == "start" else -1
        most = max(most, running)
    assert most <= 2
    assert_clean_logs(*logs)


@pytest.mark.parametrize("rev", [NEWEST, OLDEST])
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_an_old_workers_stop_or_crash_hands_its_jobs_to_a_new_one(
    trees: Callable[[str], Path], reg_dir: Path, url: str, c: redis.Redis, qname: str, rev: str,
    sig: str, tmp_path: Path,
) -> None:  # fmt: skip
    """The deploy itself: an old worker running jobs is stopped (SIGTERM: released, their
    attempt given back) or killed (SIGKILL: leases lapse, an attempt spent), and a new worker
    runs them; none lost, none parked."""
    q = Queue(c, qname)
    ids = [q.enqueue("work", {"i": i, "s": 1.5}) for i in range(3)]
    old = spawn(trees(rev), reg_dir, url, [qname], "old", tmp_path / "old.log", "--grace", "0.2",
                "--lease-ms", "900", "--heartbeat-ms", "300")  # fmt: skip
    new = None
    try:
        wait_for(lambda: sum(e["what"] == "start" for e in ledger(c, qname)) == 3, 60, "running")
        old.send_signal(getattr(signal, sig))
        assert old.wait(20) == (0 if sig == "SIGTERM" else -signal.SIGKILL)
        if sig == "SIGTERM":
            assert {q.status(j).value for j in ids} == {"due"}
        new = spawn(ROOT, reg_dir, url, [qname], "new", tmp_path / "new.log")
        wait_for(lambda: {q.status(j).value for j in ids} == {"done"}, 30, "the new worker")
    finally:
        stop([p for p in (old, new) if p is not None])
    ends = [e for e in ledger(c, qname) if e["what"] == "end"]
    assert sorted(e["id"] for e in ends) == sorted(ids) and {e["ver"] for e in ends} == {"new"}
    assert {e["attempt"] for e in ends} == {1 if sig == "SIGTERM" else 2}
    assert_clean_logs(tmp_path / "new.log")


@pytest.mark.parametrize("rev", [NEWEST, OLDEST])
def test_an_old_pools_sighup_reload_swaps_in_the_new_code(
    trees: Callable[[str], Path], reg_dir: Path, url: str, c: redis.Redis, qname: str, rev: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    """README: SIGHUP replaces a pool's children with new processes running the code on disk
    now. The supervisor is the old version; the code on disk changes under it (a symlink, as a
    release directory switched): its new children run this version, jobs keep flowing."""
    current = tmp_path / "current"
    current.symlink_to(trees(rev))
    env = dict(os.environ, PYTHONPATH=f"{current}{os.pathsep}{reg_dir}", TEST_REDIS_URL=url,
               VER="pool")  # fmt: skip
    log = tmp_path / "pool.log"
    SPAWNED_LOGS.append(str(log))
    with open(log, "ab") as out:
        pool = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "worker", "ru_reg:registry", "--url", url,
             "--queue", qname, "--processes", "2", "--concurrency", "2", "--json-logs"],
            cwd=reg_dir, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    q = Queue(c, qname)
    try:
        wait_for(lambda: c.zcard(q.keys.workers) == 2, 60, "the pool's two workers")
        ids = [q.enqueue("work", {"i": i, "s": 0.05}) for i in range(10)]
        wait_for(lambda: {q.status(j).value for j in ids} == {"done"}, 30, "the old code's runs")
        current.unlink()
        current.symlink_to(ROOT)  # the deploy
        pool.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # jobs keep coming while the children are replaced
            ids.append(q.enqueue("work", {"i": len(ids), "s": 0.05}))
            new_pids = {e["pid"] for e in ledger(c, qname) if e["tree"] == str(ROOT)}
            if len(new_pids) == 2:
                break
            time.sleep(0.1)
        wait_for(lambda: {q.status(j).value for j in ids} == {"done"}, 30, "every job done")
    finally:
        pool.send_signal(signal.SIGTERM)
        try:
            assert pool.wait(30) == 0
        except subprocess.TimeoutExpired:
            stop_all([pool])
            raise
    starts = [e for e in ledger(c, qname) if e["what"] == "start"]
    assert Counter(e["id"] for e in starts) == Counter(ids)  # each once
    assert {e["tree"] for e in starts} == {str(trees(rev).resolve()), str(ROOT)}
    assert len({e["pid"] for e in starts if e["tree"] == str(ROOT)}) == 2
    assert_clean_logs(log)


# -- a newer storage generation, seen by the older versions -------------------------------------
GUARDED_CALLS = """
    import json, os
    from scheduler import Queue
    from scheduler.core.connection import connect
    q = Queue(connect(os.environ['U']), os.environ['Q'])
    jid = os.environ['JID']
    out = {}
    calls = {'enqueue': lambda: q.enqueue('work', {}), 'claim': lambda: q.claim('old', limit=9),
             'counts': q.counts, 'status': lambda: q.status(jid), 'cancel': lambda: q.cancel(jid),
             'get_job': lambda: q.get_job(jid), 'dead_ids': q.dead_ids, 'pause': q.pause,
             'schedule': lambda: q.schedule('s2', 'tick', None, every_ms=1000),
             'remove_schedule': lambda: q.remove_schedule('s'),
             'list_jobs': lambda: q.list_jobs('due')}
    for name, call in calls.items():
        try:
            call()
            out[name] = 'answered'
        except Exception as exc:
            out[name] = type(exc).__name__
    print(json.dumps(out))
"""


@pytest.mark.parametrize("rev", REVS)
def test_an_older_version_refuses_a_queue_a_newer_one_stores(
    trees: Callable[[str], Path], reg_dir: Path, url: str, c: redis.Redis, qname: str, rev: str
) -> None:
    """docs/guide/workers.md: once a later version raises `generation`, every call of this one
    raises NewerStorage with nothing written, and its worker refuses to start (exit 1)."""
    q = Queue(c, qname)
    jid = q.enqueue("work", {})
    q.schedule("s", "tick", None, every_ms=60_000)
    c.hset(q.keys.config, "generation", "2")
    before = dump_queue(c, q)
    out = run_old(trees(rev), url, GUARDED_CALLS, reg_dir, Q=qname, JID=jid)
    assert out == dict.fromkeys(out, "NewerStorage"), out
    env = dict(os.environ, PYTHONPATH=f"{trees(rev)}{os.pathsep}{reg_dir}", TEST_REDIS_URL=url)
    done = subprocess.run([sys.executable, "-m", "scheduler", "worker", "ru_reg:registry",
                           "--url", url, "--queue", qname], cwd=reg_dir, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1 and "newer version" in done.stderr, done.stderr[-2000:]
    assert dump_queue(c, q) == before


@pytest.mark.parametrize("rev", [NEWEST, OLDEST])
def test_a_running_old_worker_leaves_a_queue_a_newer_version_took(
    trees: Callable[[str], Path], reg_dir: Path, url: str, c: redis.Redis, qname: str, rev: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    """The generation raised under a running old worker: it reports nothing of the job it ran
    there (its lease lapses for the newer workers), claims nothing more from that queue, and
    goes on serving its other queue."""
    qa, qb = Queue(c, qname), Queue(c, qname + "-b")
    ja = qa.enqueue("work", {"s": 0.8})
    ja2 = qa.enqueue("work", {}, delay_ms=3_600_000)
    w = spawn(trees(rev), reg_dir, url, [qa.name, qb.name], "old", tmp_path / "old.log",
              "--heartbeat-ms", "200", "--lease-ms", "3000", "--grace", "0.5")  # fmt: skip
    try:
        wait_for(lambda: qa.status(ja).value == "leased", 60, "the old worker's run")
        c.hset(qa.keys.config, "generation", "2")  # a newer version took the queue over
        c.zadd(qa.keys.due, {ja2: server_ms(c)})  # and made a job due (as its write would)
        held = dump_queue(c, qa)
        jb = qb.enqueue("work", {})
        wait_for(lambda: qb.status(jb).value == "done", 30, "the other queue served")
        wait_for(lambda: any(e["what"] == "end" for e in ledger(c, qa.name)), 30, "its run's end")
        time.sleep(0.5)  # its complete and heartbeats refused meanwhile
        # Its beat and its wake-up pops are not refused (advisory keys); the rest stays.
        job_keys = {
            k for k in held if not k.endswith((":workers", ":wake")) and ":worker:" not in k
        }
        assert {k: v for k, v in dump_queue(c, qa).items() if k in job_keys} == {
            k: held[k] for k in job_keys}  # fmt: skip
    finally:
        stop([w])
    c.hdel(qa.keys.config, "generation")
    assert qa.status(ja).value == "leased" and qa.status(ja2).value == "due"
    assert [e["id"] for e in ledger(c, qa.name) if e["what"] == "start"] == [ja]


# -- partitioned queues ------------------------------------------------------------------------
PARTITIONED = """
    import json, os
    from scheduler.client.partitioned import PartitionedQueue, open_queue
    from scheduler.core.connection import connect
    c = connect(os.environ['U'])
    q = (PartitionedQueue.create(c, os.environ['Q'], partitions=4) if os.environ.get('CREATE')
         else open_queue(c, os.environ['Q']))
    out = {'k%d' % i: q.enqueue('work', {'i': i}, key='key-%d' % i) for i in range(8)}
    out['deb'] = q.enqueue('work', {'v': os.environ['V']}, key='deb', debounce=True)
    out['tag'] = q.enqueue('work', {}, job_id='p2.tagged-' + os.environ['V'])
    out['sched'] = q.schedule('sch', 'tick', None, every_ms=3_600_000)
    out['home'] = [p.name for p in q.parts if p.list_schedules()]
    out['seen'] = {j: q.status(j).value for j in json.loads(os.environ.get('OTHER', '[]'))}
    print(json.dumps(out))
"""


@pytest.mark.parametrize("rev", REVS)
def test_a_partitioned_queue_routes_alike_in_both_versions(
    trees: Callable[[str], Path], reg_dir: Path, url: str, c: redis.Redis, qname: str, rev: str
) -> None:
    """Keys, a debounced key, a tagged id and a schedule name route to the same partition from
    either version (else an idempotency key would make two jobs during a deploy)."""
    first = run_old(trees(rev), url, PARTITIONED, reg_dir, Q=qname, CREATE="1", V="old")
    pq = open_queue(c, qname)
    again = {f"k{i}": pq.enqueue("work", {"i": i}, key=f"key-{i}") for i in range(8)}
    assert again == {k: first[k] for k in again}
    assert pq.enqueue("work", {"v": "new"}, key="deb", debounce=True) == first["deb"]
    assert pq.get_job(first["deb"]).payload() == {"v": "new"}
    assert pq.schedule("sch", "tick", None, every_ms=3_600_000) == "unchanged"
    ids = [v for k, v in first.items() if k.startswith("k") or k in ("deb", "tag")]
    assert {pq.status(j).value for j in ids} == {"due"}
    back = run_old(trees(rev), url, PARTITIONED, reg_dir, Q=qname, V="new2",
                   OTHER=json.dumps(ids))  # fmt: skip
    assert {k: back[k] for k in again} == again and back["deb"] == first["deb"]
    assert back["home"] == first["home"] and len(first["home"]) == 1
    assert set(back["seen"].values()) == {"due"}
    assert pq.counts().due == 8 + 1 + 2  # keyed, debounced, two tagged ids


def test_trees_are_what_they_claim(trees: Callable[[str], Path], reg_dir: Path, url: str) -> None:
    """The exports import their own package and find their own Lua (not this repository's)."""
    probe = """
        import json, scheduler
        from scheduler.core.scripts import lua_dir
        print(json.dumps([scheduler.__file__, str(lua_dir())]))
    """
    for rev in REVS:
        tree = trees(rev)
        pkg, lua = run_old(tree, url, probe, reg_dir)
        assert pkg == str(tree / "scheduler" / "__init__.py") and lua == str(tree / "lua")
