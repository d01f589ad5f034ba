"""Fixtures for fault tests: private redis-server processes started with special settings
(durable AOF on a data dir that survives restarts, TCP, TLS, replicas, ACL users), a TCP proxy
that injects network faults, and redis-py clients whose retries ride over all of it."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from tests.redis_server import RedisProcess, require_binary
from tests.redis_server import free_port as free_port  # re-exported: test_security imports it here

DURABLE = ("--appendonly", "yes", "--appendfsync", "always")


@pytest.fixture(scope="session")
def redis_binary() -> str:
    return require_binary("redis-server", "fault tests start their own servers")


class Server(RedisProcess):
    """One redis-server whose data dir outlives kill -9 and restarts (scheduler._spawn does the
    process work: restart(hard=...), kill(), cleanup(), the TCP port picked again on a clash)."""

    def __init__(self, binary: str, extra: Sequence[str] = (), tcp: bool = False) -> None:
        super().__init__(binary, extra, tcp=tcp, dir=tempfile.mkdtemp(prefix="sf"))

    def start(self, timeout_s: float = 10.0) -> Server:
        super().start(timeout_s)
        return self

    def admin(self) -> redis.Redis:
        """A plain client on the unix socket as the default user (for setup and checks)."""
        return self.client()


@pytest.fixture
def start_server(redis_binary: str) -> Iterator[Callable[..., Server]]:
    """Factory: start_server(*extra_args, tcp=False) -> a started Server, cleaned up after."""
    started: list[Server] = []

    def start(*extra: str, tcp: bool = False) -> Server:
        server = Server(redis_binary, extra, tcp=tcp)
        started.append(server)
        return server.start()

    yield start
    for server in reversed(started):  # replicas before their primary
        server.cleanup()


@pytest.fixture
def durable_server(start_server: Callable[..., Server]) -> Server:
    """appendonly yes + appendfsync always: every acknowledged write is on disk."""
    return start_server(*DURABLE)


def retry_policy(retries: int = 60, cap_s: float = 0.2) -> Retry:
    return Retry(ExponentialBackoff(cap=cap_s, base=0.01), retries)


def retrying_client(server_or_url: Server | str, **kwargs: Any) -> redis.Redis:
    """A client that reconnects by itself: redis-py's Retry on ConnectionError (which includes
    BusyLoadingError while the AOF loads) and TimeoutError; scripts re-sent after NOSCRIPT."""
    url = server_or_url.url if isinstance(server_or_url, Server) else server_or_url
    kwargs.setdefault("retry", retry_policy())
    # redis-py 5.x retries only the error classes named here (from 6.0 a Retry alone is enough).
    kwargs.setdefault("retry_on_error", [redis.ConnectionError, redis.TimeoutError])
    kwargs.setdefault("socket_timeout", 5)
    kwargs.setdefault("socket_connect_timeout", 2)
    return redis.Redis.from_url(url, decode_responses=True, **kwargs)


class FaultyProxy:
    """A TCP proxy in front of a redis-server's unix socket that drops connections and delays
    replies. Faults are drawn per chunk, from a seeded generator:
      drop_request_p  close both sides before forwarding a request (it never runs)
      drop_reply_p    close both sides after the server answered (it ran; the answer is lost)
      delay_reply_p   hold the reply for delay_s (past the client's socket timeout), then close
    """

    def __init__(self, upstream_socket: str, seed: int = 0) -> None:
        self.upstream = upstream_socket
        self.rng = random.Random(seed)
        self.drop_request_p = 0.0
        self.drop_reply_p = 0.0
        self.delay_reply_p = 0.0
        self.delay_s = 0.0
        self.stats: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def faults(self, *, drop_request: float = 0, drop_reply: float = 0, delay_reply: float = 0,
               delay_s: float = 0) -> None:  # fmt: skip
        with self._lock:
            self.drop_request_p, self.drop_reply_p = drop_request, drop_reply
            self.delay_reply_p, self.delay_s = delay_reply, delay_s

    def _draw(self, p: float) -> bool:
        with self._lock:
            return p > 0 and self.rng.random() < p

    def _accept(self) -> None:
        while not self._closed:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            up = socket.socket(socket.AF_UNIX)
            try:
                up.connect(self.upstream)
            except OSError:
                down.close()
                up.close()
                continue
            with self._lock:
                self._socks.update((down, up))
                self.stats["connections"] += 1
            threading.Thread(target=self._pump, args=(down, up, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, False), daemon=True).start()

    def _cut(self, *socks: socket.socket) -> None:
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
            with self._lock:
                self._socks.discard(s)

    def _pump(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if requests and self._draw(self.drop_request_p):
                    self.stats["drop_request"] += 1
                    break
                if not requests and self._draw(self.drop_reply_p):
                    self.stats["drop_reply"] += 1
                    break
                if not requests and self._draw(self.delay_reply_p):
                    self.stats["delay_reply"] += 1
                    time.sleep(self.delay_s)
                    dst.sendall(data)  # the client has given up on this connection by now
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._cut(src, dst)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            socks = list(self._socks)
        self._cut(*socks)


@pytest.fixture
def proxy_factory() -> Iterator[Callable[[Server, int], FaultyProxy]]:
    made: list[FaultyProxy] = []

    def make(server: Server, seed: int = 0) -> FaultyProxy:
        p = FaultyProxy(server.socket, seed)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


@dataclass(frozen=True)
class Tls:
    """A self-signed CA, a server certificate it signed, and an unrelated CA."""

    dir: str

    @property
    def ca(self) -> str:
        return os.path.join(self.dir, "ca.pem")

    @property
    def other_ca(self) -> str:
        return os.path.join(self.dir, "other-ca.pem")

    @property
    def cert(self) -> str:
        return os.path.join(self.dir, "server.pem")

    @property
    def key(self) -> str:
        return os.path.join(self.dir, "server.key")

    def server_args(self, port: int) -> tuple[str, ...]:
        return ("--tls-port", str(port), "--tls-cert-file", self.cert, "--tls-key-file", self.key,
                "--tls-ca-cert-file", self.ca, "--tls-auth-clients", "no")  # fmt: skip


def _openssl(*args: str, cwd: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_tls(dir: str) -> Tls:
    """Certificates with the openssl CLI (the `cryptography` package is not a dependency)."""
    for name in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                 "-keyout", f"{name}.key", "-out", f"{name}.pem", "-subj", f"/CN=test {name}",
                 cwd=dir)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
             "server.csr", "-subj", "/CN=localhost", cwd=dir)  # fmt: skip
    with open(os.path.join(dir, "san.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "server.pem",
             cwd=dir)  # fmt: skip
    return Tls(dir)


@pytest.fixture(scope="session")
def tls_certs() -> Iterator[Tls]:
    require_binary("openssl", "TLS tests make their certificates with it")
    d = tempfile.mkdtemp(prefix="stls")
    try:
        yield make_tls(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)
