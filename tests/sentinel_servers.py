"""A private Sentinel set-up for tests: one master, one replica, one sentinel (quorum 1), all on
127.0.0.1 TCP (a sentinel learns the replica's address from the master, and hands clients the
master's), started by scheduler._spawn's RedisProcess. Timeouts are short so that a forced
failover (`SENTINEL FAILOVER`) completes in a few seconds.

With `tls` (tests/faults/conftest.py make_tls: a CA and a server certificate for 127.0.0.1 and
localhost) the master and the replica speak TLS only (`port 0`, `tls-port`, `tls-replication
yes`), and the sentinel both plain TCP on `port` and TLS on `tls_port` (it talks TLS to the
servers): one set serves URLs with TLS to the master only and to the sentinels too. Every
server keeps its plain unix socket, which the helpers below use."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Protocol

import redis

from scheduler._spawn import RedisProcess, free_port

SERVICE = "mymaster"
# A replica's first sync at once (not after the default 5 s diskless delay); SIGTERM at once
# (not waiting up to 10 s for a lagging replica).
_FAST = ("--repl-diskless-sync-delay", "0", "--shutdown-timeout", "0")
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000


class TlsFiles(Protocol):
    """tests/faults/conftest.py Tls: a CA, and a certificate and key it signed."""

    @property
    def ca(self) -> str: ...
    @property
    def cert(self) -> str: ...
    @property
    def key(self) -> str: ...


def tls_args(tls: TlsFiles) -> list[str]:
    """A server's TLS settings (no client certificates asked; TLS to its master too)."""
    return ["--tls-cert-file", tls.cert, "--tls-key-file", tls.key, "--tls-ca-cert-file", tls.ca,
            "--tls-auth-clients", "no", "--tls-replication", "yes"]  # fmt: skip


@dataclass
class TlsRedisProcess(RedisProcess):
    """A RedisProcess whose TCP port speaks TLS only (`port 0`, `tls-port <port>`)."""

    tls: TlsFiles | None = None

    def args(self) -> list[str]:
        if self.tls is None:
            return super().args()
        return [*super().args(), "--port", "0", "--tls-port", str(self.port), *tls_args(self.tls)]


@dataclass
class SentinelProcess(RedisProcess):
    """A redis-server in sentinel mode, monitoring `master_port` as SERVICE (quorum 1): its own
    config file (a sentinel rewrites it), written before each start."""

    master_port: int = 0
    log_name: str = "sentinel.log"
    auth_pass: str | None = None  # the master's password (sentinel auth-pass)
    requirepass: str | None = None  # the sentinel's own
    tls: TlsFiles | None = None  # TLS on tls_port too (and to the master and replicas)
    tls_port: int = 0  # 0: a free one, picked at start

    @property
    def conf(self) -> str:
        return os.path.join(self.dir, "sentinel.conf")

    def _start_once(self, timeout_s: float) -> bool:
        started = super()._start_once(timeout_s)
        if not started and self.tls is not None:
            self.tls_port = 0  # perhaps taken: pick again with the port
        return started

    def args(self) -> list[str]:
        with open(self.conf, "w") as f:
            f.write(
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.master_port} 1\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            if self.auth_pass:
                f.write(f"sentinel auth-pass {SERVICE} {self.auth_pass}\n")
            if self.requirepass:
                f.write(f"requirepass {self.requirepass}\n")
        tls: list[str] = []
        if self.tls is not None:
            self.tls_port = self.tls_port or free_port()
            tls = ["--tls-port", str(self.tls_port), *tls_args(self.tls)]
        return [
            self.binary,
            self.conf,
            "--sentinel",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--unixsocket",
            self.socket,
            "--unixsocketperm",
            "700",
            "--dir",
            self.dir,
            *tls,
        ]


@dataclass
class SentinelSet:
    """Master + replica + sentinel. `url(...)` is a redis+sentinel:// URL naming the sentinel.
    `password`: the master's and replica's (requirepass, masterauth); `sentinel_password`: the
    sentinel's own (requirepass); `tls`: see the module docstring (tls_url); `extra`: further
    settings of the master and the replica (`--min-replicas-to-write 1`, ...)."""

    binary: str
    password: str | None = None
    sentinel_password: str | None = None
    tls: TlsFiles | None = None
    extra: tuple[str, ...] = ()
    servers: list[RedisProcess] = field(default_factory=list)

    def start(self) -> SentinelSet:
        try:
            pw = self.password
            extra = [*_FAST, *(["--requirepass", pw, "--masterauth", pw] if pw else [])]
            extra += self.extra
            master = TlsRedisProcess(self.binary, extra, tcp=True, tls=self.tls).start()
            self.servers.append(master)
            replica_of = [*extra, "--replicaof", "127.0.0.1", str(master.port)]
            replica = TlsRedisProcess(self.binary, replica_of, tcp=True, tls=self.tls)
            self.servers.append(replica.start())
            sentinel = SentinelProcess(
                self.binary,
                tcp=True,
                master_port=master.port,
                auth_pass=self.password,
                requirepass=self.sentinel_password,
                tls=self.tls,
            )
            self.servers.append(sentinel.start())
            self.wait_ready()
        except BaseException:
            self.cleanup()
            raise
        return self

    @property
    def sentinel(self) -> SentinelProcess:
        sentinel = self.servers[2]
        assert isinstance(sentinel, SentinelProcess)
        return sentinel

    def url(self, path: str = f"/{SERVICE}", query: str = "") -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel.port}{path}{query}"

    def tls_url(self, ca: str, *, sentinel_tls: bool, host: str = "127.0.0.1") -> str:
        """A rediss+sentinel:// URL naming the CA as docs/security.md says (`ssl_ca_certs=`):
        TLS to the master; with `sentinel_tls`, to the sentinel too (its TLS port,
        `sentinel_ssl=1`), else the sentinel's plain port."""
        if sentinel_tls:
            port, more = self.sentinel.tls_port, "&sentinel_ssl=1"
        else:
            port, more = self.sentinel.port, ""
        return f"rediss+sentinel://{host}:{port}/{SERVICE}?ssl_ca_certs={ca}{more}"

    def sentinel_client(self) -> redis.Redis:
        return self.sentinel.client(password=self.sentinel_password)

    def server_client(self, port: int, db: int = 0) -> redis.Redis:
        """A plain client of the master or the replica on `port` (its unix socket)."""
        return self.by_port(port).client(password=self.password, db=db)

    def master_port(self) -> int:
        with self.sentinel_client() as s:
            _host, port = s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        return int(port)

    def by_port(self, port: int) -> RedisProcess:
        return next(s for s in self.servers[:2] if s.port == port)

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Until the replica has synced (link up) and the sentinel knows it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            master = self.master_port()
            replica = next(r for r in self.servers[:2] if r.port != master)
            with self.server_client(replica.port) as r, self.sentinel_client() as s:
                link = r.info("replication").get("master_link_status")
                known = s.execute_command("SENTINEL", "REPLICAS", SERVICE)
            if link == "up" and known and _replica_ok(known[0]):
                return
            time.sleep(0.05)
        raise RuntimeError(f"sentinel set-up not ready in {timeout_s} s: see {self.sentinel.log}")

    def failover(self, timeout_s: float = 30.0) -> tuple[int, int]:
        """Force a failover; return (old, new) master ports once it is complete (done())."""
        old = self.start_failover()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            new = self.done(old)
            if new is not None:
                return old, new
            time.sleep(0.02)
        raise RuntimeError(f"no failover in {timeout_s} s: see {self.sentinel.log}")

    def start_failover(self) -> int:
        """SENTINEL FAILOVER (no agreement needed, the master need not be down); the old
        master's port."""
        old = self.master_port()
        with self.sentinel_client() as s:
            s.execute_command("SENTINEL", "FAILOVER", SERVICE)
        return old

    def done(self, old: int) -> int | None:
        """The new master's port once the failover from `old` is complete: the sentinel names
        it, it answers as a master, and the old master has been turned into its replica (the
        sentinel does that ~10 s after the promotion; until then the old master still takes
        writes: a client connected to it before may write there, lost when it is demoted)."""
        new = self.master_port()
        if new != old and self.role(new) == ("master", 0) and self.role(old) == ("slave", new):
            return new
        return None

    def role(self, port: int) -> tuple[str, int]:
        """("master", 0), or ("slave", the port of its master)."""
        with self.server_client(port) as c:
            info = c.info("replication")
        return info["role"], int(info.get("master_port", 0))

    def cleanup(self) -> None:
        for server in reversed(self.servers):
            server.cleanup()
        self.servers.clear()


def _replica_ok(fields: object) -> bool:
    if isinstance(fields, dict):
        flags = fields.get("flags", "")
    else:
        pairs = list(fields) if isinstance(fields, list) else []
        flags = dict(zip(pairs[::2], pairs[1::2], strict=False)).get("flags", "")
    return "s_down" not in str(flags) and "disconnected" not in str(flags)
