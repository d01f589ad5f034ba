"""The benchmarks start Redis through scheduler/_spawn.py, the one spawner (issue 14): no bench
tool builds its own redis-server command line, and bench/profile_drain.py's server works."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

import redis

from tests.redis_server import require_binary

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_no_bench_tool_builds_a_redis_server_command_line() -> None:
    # "--unixsocket" is the argument every private-server command line carries (_spawn's too).
    own = [
        p.relative_to(ROOT).as_posix()
        for p in sorted((ROOT / "bench").rglob("*.py"))
        if '"--unixsocket"' in p.read_text()
    ]
    assert own == []
    assert '"--unixsocket"' in (ROOT / "scheduler" / "_spawn.py").read_text()


def _profile_drain() -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench"))  # the tool imports bench/common.py
    try:
        spec = importlib.util.spec_from_file_location(
            "_test_profile_drain", ROOT / "bench" / "profile_drain.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "bench"))


def test_profile_drain_server_answers_on_both_urls_and_goes_away() -> None:
    require_binary("redis-server", "profile_drain's private server")
    tool = _profile_drain()
    with tool.server() as (unix_url, tcp_url):
        assert unix_url.startswith("unix://") and ":6379/" not in tcp_url
        for url in (unix_url, tcp_url):
            with redis.Redis.from_url(url) as r:
                assert r.ping() is True
                assert r.config_get("save")["save"] == ""
        sock = pathlib.Path(unix_url.removeprefix("unix://"))
        assert sock.exists()
    assert not sock.parent.exists()
