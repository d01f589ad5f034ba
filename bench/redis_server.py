"""Start and stop a PRIVATE redis-server (never the shared one on 6379) for the benchmarks, through
scheduler._spawn, the one spawner shared with the tests and the demo."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

from scheduler._spawn import RedisProcess, free_port, redis_server_binary

__all__ = ["Server", "free_port", "private_server"]


@dataclass(frozen=True)
class Server:
    socket_path: str
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def tcp_url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def cli(self, *args: str, timeout: float = 30.0) -> str:
        out = subprocess.run(
            ["redis-cli", "-s", self.socket_path, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
        return out.stdout.strip()


@contextlib.contextmanager
def private_server() -> Iterator[Server]:
    """A throw-away redis-server on a unix socket (short mkdtemp path) plus 127.0.0.1:<free>."""
    binary = redis_server_binary()
    if binary is None:
        raise RuntimeError("the benchmarks need redis-server on PATH (apt-get install it)")
    with RedisProcess(binary, ("--maxclients", "2000"), tcp=True) as proc:
        assert proc.proc is not None
        yield Server(proc.socket, proc.port, proc.proc)
