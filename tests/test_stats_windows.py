"""`scheduler stats`'s minute windows, as the code computes them and as its help, the table's
caption and README.md say: the 1, 5 and 60 newest clock-minute buckets (lua/lib/util.lua's
per-minute counters), the current, partial minute counted in each; so '1m' is this clock
minute, not the last 60 seconds."""

from __future__ import annotations

from pathlib import Path

import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.cli.admin import stats
from scheduler.cli.main import main
from scheduler.operations import browsing
from tests.conftest import Clock

MINUTE_MS = 60_000
ROOT = Path(__file__).resolve().parent.parent


def test_the_windows_are_the_newest_clock_minutes_the_current_one_counted(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    q, clock = tq
    minute = 1_000
    clock.set_ms(minute * MINUTE_MS + 5_000)  # 5 s into a clock minute
    for back in (0, 1, 4, 5, 59, 60):  # one `done` in each of these minutes ago
        client.hincrby(q.keys.stats(minute - back), "done", 1)
    _, _, series = q._run(browsing.queue_row(q.ops, 60))
    done = {w: n["done"] for w, n in browsing.window_totals(series, (1, 5, 60)).items()}
    # 1m: this minute only (5 s of it); 5m: it and the 4 before; 60m: it and the 59 before.
    assert done == {"1m": 1, "5m": 3, "60m": 5}


SAID = "the current clock minute and the last 5 and 60 (each counting the current one)"


def test_the_help_the_table_and_the_readme_say_so(redis_url: str, q: Queue) -> None:
    help_text = " ".join((stats.help or "").split())
    assert f"done / fail / new dead counts in {SAID}" in help_text, help_text
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"done / fail / +dead (new dead letters) in {SAID[:-1]};" in readme
    q.enqueue("t", None)
    env = {"COLUMNS": "300"}
    out = CliRunner(env=env).invoke(main, ["stats", "-q", q.name, "--url", redis_url])
    assert out.exit_code == 0, out.output
    assert f"+dead (new dead letters): 1m/5m/60m: {SAID}" in " ".join(out.stdout.split())
