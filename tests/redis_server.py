"""Start and stop private redis-server processes for tests (a unix socket in a temp dir: no TCP
port, so no collision with the shared server on 6379 or with parallel runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis


@dataclass
class RedisProcess:
    binary: str
    extra: Sequence[str] = ()
    dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="sq"))
    proc: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> str:
        return os.path.join(self.dir, "r.sock")

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout_s: float = 10.0) -> RedisProcess:
        args = [self.binary, "--port", "0", "--unixsocket", self.socket, "--unixsocketperm", "700",
                "--save", "", "--appendonly", "no", "--dir", self.dir, *self.extra]  # fmt: skip
        with open(os.path.join(self.dir, "redis.log"), "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: see {self.dir}/redis.log")
            try:
                redis.Redis(unix_socket_path=self.socket).ping()
                return self
            except (redis.ConnectionError, FileNotFoundError):
                time.sleep(0.01)
        raise RuntimeError("redis-server did not answer PING in time")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def find_redis_server() -> str | None:
    return shutil.which("redis-server")


def require_binary(name: str, why: str) -> str:
    """The path of a binary a test needs. Missing: skip locally, but fail under CI=true, where
    a silently skipped real-Redis test would hide a broken set-up."""
    import pytest

    path = shutil.which(name)
    if path is None:
        message = f"{why}: {name} not found on PATH"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path
