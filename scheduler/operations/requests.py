"""The requests an operation yields to its driver, and the settings and base every operation
module shares. An operation is a generator ("sans-I/O"): Queue drives it with blocking calls,
AsyncQueue with awaits, the worker with its pipeline, so the drivers cannot drift apart."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from scheduler.core import codec
from scheduler.core.keys import QueueKeys
from scheduler.core.models import QueueCounts

T = TypeVar("T")


@dataclass(frozen=True)
class Script:
    """Run one Lua transition with the queue's KEYS."""

    name: str
    args: list[str]


@dataclass(frozen=True)
class ScriptPipeline:
    """Several script calls in one pipeline (one connection, one round trip); the reply is the
    list of their replies. `wait` = (replicas, timeout_ms) appends WAIT, whose reply (how many
    replicas acknowledged these writes) comes last (see Settings.wait_replicas)."""

    calls: list[Script]
    wait: tuple[int, int] | None = None


@dataclass(frozen=True)
class Commands:
    """Plain read commands, pipelined (no transaction); the reply is a list."""

    cmds: list[tuple[Any, ...]]


Request = Script | ScriptPipeline | Commands
Op = Generator[Request, Any, T]


@dataclass(frozen=True)
class Settings:
    """A queue client's settings (the Queue / AsyncQueue keyword arguments).

    Attributes:
        result_ttl_ms: how long a completed or cancelled job's record is kept (1 h default).
        max_payload_bytes: the largest payload or result accepted, encoded (512 KiB default).
        wait_replicas: N > 0 makes enqueue wait until N replicas acknowledged the write
            (NotDurable otherwise); 0 relies on the server's own persistence.
        wait_timeout_ms: how long enqueue waits for `wait_replicas` acknowledgements.
    """

    result_ttl_ms: int = codec.RESULT_TTL_MS
    max_payload_bytes: int = codec.MAX_PAYLOAD_BYTES
    # Durability: 0 relies on the server's own persistence; N > 0 makes enqueue wait until N
    # replicas acknowledged the write and raise NotDurable otherwise.
    wait_replicas: int = 0
    wait_timeout_ms: int = 1_000

    def __post_init__(self) -> None:
        # Checked here, not at the first enqueue: a bad WAIT argument was refused by Redis
        # only after the enqueue it follows had written the job (its id never returned).
        codec.check_int(self.result_ttl_ms, "result_ttl_ms")
        codec.check_int(self.max_payload_bytes, "max_payload_bytes")
        codec.check_int(self.wait_replicas, "wait_replicas")
        codec.check_int(self.wait_timeout_ms, "wait_timeout_ms")


class OpsBase:
    """What every operation module needs: the queue's keys, the settings, and the server's
    clock (via counts, which several operations read for `now_ms`)."""

    def __init__(self, keys: QueueKeys, settings: Settings) -> None:
        self.keys = keys
        self.settings = settings

    def counts(self) -> Op[QueueCounts]:
        """The queue's counts and the server's clock (`now_ms`) in one script call."""
        return codec.parse_counts((yield Script("counts", [])))
