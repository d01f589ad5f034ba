"""What the start-lateness record (lua/lib/lateness.lua, one call in lua/claim.lua) adds to a
claim: Redis commands per claim call (INFO commandstats, commands inside the script counted)
and the script's server time, with the call and with it stripped from the loaded script.

    .venv/bin/python bench/lateness_cost.py [--calls 200]

The command count is exact; the microseconds move with the machine's load."""

from __future__ import annotations

import argparse
import time
from typing import Any

from scheduler._spawn import RedisProcess, find_binary
from scheduler.client.queue import Queue
from scheduler.core import scripts
from scheduler.core.models import JobSpec

CALL = "record_lateness(prefix, now, out)  --"  # the call line, not the definition
_source = scripts.source


def run(lateness: bool, calls: int) -> list[str]:
    def source(name: str, clock: str = "server") -> str:
        text = _source(name, clock)
        return text if lateness or name != "claim" else text.replace(CALL, "--")

    scripts.source = source  # type: ignore[assignment]
    server = RedisProcess(find_binary()).start()
    out = []
    try:
        client = server.client(decode_responses=True)
        q = Queue(client, "bench-lateness")
        for batch in (1, 100):
            q.enqueue_many([JobSpec("t", {"i": i}) for i in range(calls * batch)])
            client.config_resetstat()
            t0 = time.perf_counter()
            for _ in range(calls):
                q.claim("w", limit=batch)
            wall_us = (time.perf_counter() - t0) / calls * 1e6
            stats: dict[str, Any] = client.info("commandstats")
            inner = sum(
                v["calls"]
                for k, v in stats.items()
                if k not in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_config", "cmdstat_info")
            )
            script_us = stats.get("cmdstat_evalsha", {}).get("usec_per_call", 0.0)
            out.append(
                f"lateness {'on ' if lateness else 'off'} batch {batch:3d}: "
                f"{inner / calls:6.1f} commands per claim, script {script_us:7.1f} us, "
                f"round trip {wall_us:7.0f} us"
            )
    finally:
        server.cleanup()
        scripts.source = _source
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    for lateness in (True, False):
        for line in run(lateness, args.calls):
            print(line)


if __name__ == "__main__":
    main()
