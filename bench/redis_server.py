"""Start and stop a PRIVATE redis-server (never the shared one on 6379). Standard library only."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    if port == 6379:  # pragma: no cover - paranoia: never the shared server
        return free_port()
    return port


@contextlib.contextmanager
def private_server() -> Iterator[Server]:
    """A throw-away redis-server on a unix socket (short mkdtemp path) plus 127.0.0.1:<free>."""
    tmp = tempfile.mkdtemp(prefix="rb")  # short: unix socket paths are limited to ~100 bytes
    sock = str(Path(tmp) / "r.sock")
    port = free_port()
    cmd = [
        "redis-server",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--unixsocket",
        sock,
        "--unixsocketperm",
        "700",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        tmp,
        "--maxclients",
        "2000",
        "--logfile",
        str(Path(tmp) / "redis.log"),
    ]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    server = Server(sock, port, proc)
    try:
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {proc.returncode}")
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                if Path(sock).exists() and server.cli("PING", timeout=2) == "PONG":
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer PING within 10 s")
            time.sleep(0.05)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        shutil.rmtree(tmp, ignore_errors=True)
