"""A review of the lazy loads (scheduler/__init__.py's and scheduler/_lazy.py's PEP 562
`__getattr__`s, every load under one RLock) from a user's side, each probe in a fresh
interpreter: threads first reading public names at once, a tasks module importing
`from scheduler import Queue` in a thread while others read lazy names, the import system's own
hasattr never waiting for the lock (also with `-X frozen_modules=off`), a fork while another
thread holds the lock, and what introspection (hasattr, dunders, dir, help, inspect, doctest,
reload, mock.patch) gets. A hang is reported as a failure: every wait is bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUBPACKAGES = ("admin", "client", "core", "operations", "schedules", "worker")


def _fresh(code: str, *flags: str, cwd: Path = ROOT) -> list[object] | dict[str, object]:
    """Run `code` in a new interpreter; its last line of output, read as JSON."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, *flags, "-c", textwrap.dedent(code)]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    result: list[object] | dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


# A thread that holds the lazy lock for as long as the test wants: its load (scheduler.AsyncQueue)
# imports scheduler.client.aio through a loader that waits for `release` first (a slow import).
_HOLD_THE_LOCK = """
import importlib, importlib.abc, importlib.machinery, json, os, sys, threading, time
import scheduler

entered, release = threading.Event(), threading.Event()

class _Slow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "scheduler.client.aio":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        real = spec.loader

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return None

            def exec_module(self, module):
                entered.set()
                release.wait()
                real.exec_module(module)

        spec.loader = _Loader()
        return spec

sys.meta_path.insert(0, _Slow())
holder = threading.Thread(target=lambda: scheduler.AsyncQueue, daemon=True)
holder.start()
entered.wait()  # the holder is inside scheduler._lazy.load, holding the lock
"""


def test_threads_first_reading_every_public_name_at_once_get_them_all() -> None:
    code = """
    import json, os, threading, time, scheduler
    reads = [(scheduler, n) for n in [*scheduler.__all__, *SUBPACKAGES]]
    jobs = [lambda p=p, n=n: getattr(p, n) for p, n in reads]
    core = ("errors", "codec", "models", "scripts")
    jobs += [lambda n=n: getattr(scheduler.core, n) for n in core]
    jobs += [lambda: scheduler.worker.Worker, lambda: scheduler.client.aio,
             lambda: scheduler.operations.producing, lambda: scheduler.schedules.stored]
    errors, barrier = [], threading.Barrier(len(jobs))
    def run(job):
        barrier.wait()
        try:
            job()
        except BaseException as exc:
            errors.append(repr(exc))
    threads = [threading.Thread(target=run, args=(j,), daemon=True) for j in jobs]
    for t in threads:
        t.start()
    end = time.monotonic() + 60
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    print(json.dumps([sum(t.is_alive() for t in threads), errors]), flush=True)
    os._exit(0)
    """.replace("SUBPACKAGES", repr(SUBPACKAGES))
    for _ in range(3):
        assert _fresh(code) == [0, []]


def test_a_tasks_module_importing_lazy_names_in_a_thread_while_others_read_them(
    tmp_path: Path,
) -> None:
    """A user's tasks modules (`from scheduler import Queue` at their top) imported in threads
    while other threads read lazy names: nothing raises, nothing waits forever (the lock against
    the tasks modules' import locks)."""
    (tmp_path / "tasks_a.py").write_text(
        "from scheduler import JobNotFound, Queue, Registry\n"
        "import scheduler.core.codec\n"
        "registry = Registry()\n"
    )
    (tmp_path / "tasks_b.py").write_text(
        "import scheduler\n"
        "from scheduler.worker import Worker\n"
        "from scheduler.core import codec, errors\n"
        "MODELS = scheduler.core.models\n"
        "from scheduler import AsyncQueue\n"
    )
    (tmp_path / "tasks_c.py").write_text(
        "from scheduler.client import queue\n"
        "import tasks_a\n"
        "from scheduler import Schedule, open_queue\n"
    )
    code = """
    import importlib, json, os, sys, threading, time, scheduler
    sys.path.insert(0, os.getcwd())
    jobs = [("read", lambda n=n: getattr(scheduler, n)) for n in scheduler.__all__]
    tasks = ["tasks_a", "tasks_b", "tasks_c"] * 3
    jobs += [("import", lambda m=m: importlib.import_module(m)) for m in tasks]
    errors, barrier = [], threading.Barrier(len(jobs))
    def run(kind, job):
        barrier.wait()
        try:
            job()
        except BaseException as exc:
            errors.append([kind, repr(exc)])
    threads = [threading.Thread(target=run, args=j, daemon=True) for j in jobs]
    for t in threads:
        t.start()
    end = time.monotonic() + 60
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    print(json.dumps([sum(t.is_alive() for t in threads), errors]), flush=True)
    os._exit(0)
    """
    for _ in range(3):
        assert _fresh(code, cwd=tmp_path) == [0, []]


@pytest.mark.parametrize("flags", [(), ("-X", "frozen_modules=off")], ids=["frozen", "unfrozen"])
def test_the_import_systems_own_hasattr_never_waits_for_the_lazy_lock(
    flags: tuple[str, ...],
) -> None:
    """scheduler/_lazy.py:45's frame check: while another thread holds the lock, a plain import of
    a subpackage's module, by each spelling, completes; `from scheduler.core import nope` is a
    clean ImportError (the import system's getattr after its own hasattr takes no lock either)."""
    code = (
        _HOLD_THE_LOCK
        + """
def from_import():
    from scheduler.core import codec
    return codec.__name__

def from_import_two():
    from scheduler.operations import leasing, producing
    return producing.__name__

def dunder_import():
    return __import__("scheduler.core", fromlist=["models"]).models.__name__

def import_module():
    return importlib.import_module("scheduler.core.errors").__name__

def import_as():
    import scheduler.core.backoff as backoff
    return backoff.__name__

def missing():
    try:
        from scheduler.core import nope  # noqa: F401
    except ImportError as exc:
        return type(exc).__name__ + ": " + str(exc).split(" (")[0]

out = {}
for fn in (from_import, from_import_two, dunder_import, import_module, import_as, missing):
    box = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t.start()
    t.join(30)
    out[fn.__name__] = "hung" if t.is_alive() else box[0]
release.set()
holder.join(30)
out["holder"] = "hung" if holder.is_alive() else "done"
print(json.dumps(out), flush=True)
os._exit(0)
"""
    )
    assert _fresh(code, *flags) == {
        "from_import": "scheduler.core.codec",
        "from_import_two": "scheduler.operations.producing",
        "dunder_import": "scheduler.core.models",
        "import_module": "scheduler.core.errors",
        "import_as": "scheduler.core.backoff",
        "missing": "ImportError: cannot import name 'nope' from 'scheduler.core'",
        "holder": "done",
    }


_FORK = (
    _HOLD_THE_LOCK
    + """
import multiprocessing
HOW, RESET = sys.argv[1], sys.argv[2] == "reset"

def child():
    if RESET:  # what an os.register_at_fork(after_in_child=...) re-creating the lock would do
        sys.modules["scheduler._lazy"]._LOCK = threading.RLock()
    return scheduler.Queue.__name__  # first read of another name, in the child

if HOW == "multiprocessing":  # the default start method on Linux before Python 3.14
    proc = multiprocessing.get_context("fork").Process(target=child)
    proc.start()
    release.set()
    proc.join(15)
    outcome = "hung" if proc.is_alive() else proc.exitcode
    if proc.is_alive():
        proc.kill()
        proc.join()
else:
    pid = os.fork()
    if pid == 0:
        try:
            child()
            os._exit(0)
        except BaseException:
            os._exit(3)
    release.set()
    end, outcome = time.monotonic() + 15, "hung"
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            outcome = os.waitstatus_to_exitcode(status)
            break
        time.sleep(0.05)  # polling the child's exit, not a synchronisation
    if outcome == "hung":
        os.kill(pid, 9)
        os.waitpid(pid, 0)
holder.join(30)
print(json.dumps([outcome, holder.is_alive()]), flush=True)
os._exit(0)
"""
)


def _fork_while_the_lock_is_held(how: str, reset: bool) -> list[object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", _FORK, how, "reset" if reset else "keep"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    result: list[object] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize("how", ["multiprocessing", "os.fork"])
def test_a_child_forked_while_another_thread_loads_a_lazy_name_can_read_one(how: str) -> None:
    assert _fork_while_the_lock_is_held(how, reset=False) == [0, False]


def test_the_forked_child_hangs_on_the_lock_alone_not_on_the_import_systems_locks() -> None:
    """The same child, with the lock re-created in it (what an at-fork hook would do), reads its
    name: the importlib module lock the holder keeps (scheduler.client.aio) is not in its way."""
    assert _fork_while_the_lock_is_held("os.fork", reset=True) == [0, False]


def test_introspection_after_a_bare_import_gets_what_a_plain_package_gives() -> None:
    out = _fresh(
        """
        import doctest, importlib, inspect, json, pickle, pydoc, sys, unittest.mock
        import scheduler
        out = {}
        out["hasattr"] = [hasattr(getattr(scheduler, p), "nope") for p in SUBPACKAGES]
        out["top_hasattr"] = hasattr(scheduler, "nope")
        probes = ("__wrapped__", "__signature__", "__test__", "__all__", "_fields", "__qualname__")
        out["dunders"] = sorted({repr(getattr(scheduler.core, d, "absent")) for d in probes})
        out["path"] = [getattr(scheduler, p).__path__ == [str(ROOT / "scheduler" / p)]
                       for p in SUBPACKAGES]
        with unittest.mock.patch("scheduler.core.errors.JobNotFound", KeyError):
            out["patched"] = scheduler.core.errors.JobNotFound is KeyError
        out["restored"] = scheduler.core.errors.JobNotFound.__name__
        out["dir_core_codec_once_loaded"] = "codec" in dir(scheduler.core)
        out["help"] = "class Queue" in pydoc.render_doc(scheduler, renderer=pydoc.plaintext)
        members = dict(inspect.getmembers(scheduler))
        out["getmembers"] = set(scheduler.__all__) <= set(members)
        out["doctest"] = len(doctest.DocTestFinder().find(scheduler.core)) == 1
        out["pickle"] = pickle.loads(pickle.dumps(scheduler.Queue)) is scheduler.Queue
        queue = scheduler.Queue
        again = importlib.reload(scheduler)
        out["reload"] = [again is scheduler, scheduler.Queue is queue,
                         scheduler.JobDead is sys.modules["scheduler.core.errors"].JobDead]
        importlib.reload(scheduler.core)
        out["reload_core"] = [hasattr(scheduler.core, "nope"), scheduler.core.scripts.__name__]
        importlib.reload(scheduler.worker)
        out["reload_worker"] = scheduler.worker.Worker.__name__
        print(json.dumps(out))
        """.replace("SUBPACKAGES", repr(SUBPACKAGES)).replace(
            "ROOT", f"__import__('pathlib').Path({str(ROOT)!r})"
        )
    )
    assert out == {
        "hasattr": [False] * len(SUBPACKAGES),
        "top_hasattr": False,
        "dunders": ["'absent'"],
        "path": [True] * len(SUBPACKAGES),
        "patched": True,
        "restored": "JobNotFound",
        "dir_core_codec_once_loaded": True,
        "help": True,
        "getmembers": True,
        "doctest": True,
        "pickle": True,
        "reload": [True, True, True],
        "reload_core": [False, "scheduler.core.scripts"],
        "reload_worker": "Worker",
    }


def test_getattr_with_a_default_of_a_dotted_name_answers_the_default() -> None:
    out = _fresh(
        """
        import json, scheduler
        out = []
        for name in ("a.b", "codec.x", ".codec"):
            try:
                out.append([getattr(scheduler.core, name, None), hasattr(scheduler.core, name)])
            except Exception as exc:
                out.append(type(exc).__name__)
        print(json.dumps(out))
        """
    )
    assert out == [[None, False]] * 3
