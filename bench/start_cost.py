"""What a process pays to start: `import scheduler`, a producer's `from scheduler import Queue`
and the CLI's `--help`, at two (or more) git revisions of this checkout, with `import redis` as
the floor. Each revision is a `git archive` in a temp dir, run with this checkout's venv; the
revisions alternate each round, and the best of N rounds is kept (wall and the child's CPU).

    python bench/start_cost.py --rounds 11 cc5d351 HEAD
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = "from scheduler.cli.main import main; main(prog_name='scheduler')"
COMMANDS = {
    "import redis (floor)": ["-c", "import redis"],
    "import scheduler": ["-c", "import scheduler"],
    "from scheduler import Queue": ["-c", "from scheduler import Queue"],
    "scheduler --help": ["-c", CLI, "--help"],
    "scheduler worker --help": ["-c", CLI, "worker", "--help"],
    "scheduler stats --help": ["-c", CLI, "stats", "--help"],
    "scheduler dead --help": ["-c", CLI, "dead", "--help"],
}


def unpack(rev: str, into: Path) -> Path:
    """The tree of `rev` (its scheduler/ and lua/) in a directory of its own."""
    out = into / rev.replace("/", "_")
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "scheduler", "lua"],
                             check=True, capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def measure(rounds: int, dirs: dict[str, Path]) -> dict[tuple[str, str], tuple[float, float]]:
    """(command, rev) -> (best wall ms, best child CPU ms) over `rounds` alternating rounds."""
    best: dict[tuple[str, str], tuple[float, float]] = {}
    for i in range(rounds):
        order = list(dirs.items()) if i % 2 == 0 else list(dirs.items())[::-1]
        for name, args in COMMANDS.items():
            for rev, d in order:
                c0, t0 = os.times(), time.perf_counter()
                done = subprocess.run([sys.executable, *args], cwd=d, capture_output=True)
                wall, c1 = time.perf_counter() - t0, os.times()
                if done.returncode != 0:
                    raise SystemExit(f"{name} at {rev}: {done.stderr.decode()[-400:]}")
                cpu = c1.children_user + c1.children_system - c0.children_user - c0.children_system
                was = best.get((name, rev), (1e9, 1e9))
                best[name, rev] = (min(was[0], wall * 1e3), min(was[1], cpu * 1e3))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("revs", nargs="+", help="git revisions to compare (e.g. cc5d351 HEAD)")
    ap.add_argument("--rounds", type=int, default=11)
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {rev: unpack(rev, Path(tmp)) for rev in opts.revs}
        best = measure(opts.rounds, dirs)
    print(f"best of {opts.rounds} rounds, ms (wall / child CPU); load {os.getloadavg()[0]:.1f}")
    print("| command | " + " | ".join(opts.revs) + " |")
    print("|---|" + "---|" * len(opts.revs))
    for name in COMMANDS:
        cells = [f"{best[name, r][0]:.0f} / {best[name, r][1]:.0f}" for r in opts.revs]
        print(f"| `{name}` | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
