"""The wheel must carry every Lua file (an editable checkout cannot notice a wheel without them),
and every script must compile on the real server."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import redis

from scheduler.core.scripts import TRANSITIONS, lua_dir, source

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_contains_every_lua_file(tmp_path: Path) -> None:
    # --no-isolation: hatchling comes from the test extra, so no network is needed here.
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("scheduler-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        f"scheduler/lua/{p.relative_to(ROOT / 'lua')}" for p in (ROOT / "lua").rglob("*.lua")
    }
    assert expected and expected <= names, f"missing from the wheel: {expected - names}"
    assert "scheduler/py.typed" in names


def test_every_transition_has_a_file_and_compiles(client: redis.Redis) -> None:
    files = {p.stem for p in lua_dir().glob("*.lua")}
    assert set(TRANSITIONS) == files, "a Lua file is not registered, or a name has no file"
    for name in TRANSITIONS:
        text = source(name)
        assert "@include" not in text.replace("-- (already included", "")
        sha = client.script_load(text)  # compiles on a real server: a syntax error fails here
        assert client.script_exists(sha) == [True]
        assert "os.time" not in text and "math.random" not in text


def test_test_clock_never_reaches_production_text() -> None:
    for name in TRANSITIONS:
        assert "test:now_ms" not in source(name)
        assert "test:now_ms" in source(name, "test") or "now_ms()" not in source(name)
