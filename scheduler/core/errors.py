"""One exception class per refusal (a script's error codes map to them in script_errors.py)."""

from __future__ import annotations

import re
from typing import Any

from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ClusterDownError,
    ClusterError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)


class SchedulerError(Exception):
    """Base of every error this package raises on purpose. Each pickles with its attributes."""

    def __reduce__(self) -> tuple[object, ...]:
        # Exception's own way rebuilds by calling the class with `args` (its one text): an
        # __init__ taking other arguments (StaleToken's job_id, token, message) then raised
        # TypeError at unpickling, and a process pool whose child raised it broke instead of
        # handing the caller its error. Rebuilt without __init__, the attributes put back.
        return _rebuilt, (type(self), self.args), self.__dict__


def _rebuilt(cls: type[SchedulerError], args: tuple[object, ...]) -> SchedulerError:
    return cls.__new__(cls, *args)


class BadArgument(SchedulerError, ValueError):
    """A call's arguments were refused at the boundary; nothing was changed."""


class UnreadableRecord(BadArgument):
    """A record read from Redis is not one this version wrote (edited by hand, or by another
    tool): the stored data is at fault, not the call. A BadArgument, as callers caught before."""


def not_utf8(queue: str, exc: UnicodeDecodeError) -> UnreadableRecord:
    """A reply a client with strict decoding could not decode: a value written by hand (the
    package writes UTF-8 only; its own clients read such bytes as `\\xff` escapes)."""
    return UnreadableRecord(
        f"queue {queue!r}: a stored value is not UTF-8 ({exc.reason} at byte {exc.start}; "
        "edited by hand?): `scheduler doctor` finds it"
    )


class InvalidPayload(BadArgument):
    """The payload is not JSON-serialisable, or is larger than the limit."""


class JobNotFound(SchedulerError, KeyError):
    """No job with that id (it may have finished and its record expired)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "job not found"


class ScheduleNotFound(BadArgument, KeyError):
    """No recurring schedule by that name in the queue (get_schedule, run_schedule_now); nothing
    was changed. A BadArgument, as get_schedule raised before."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "schedule not found"


class LeaseRefused(SchedulerError):
    """The caller no longer holds the lease it names (complete / fail refused; nothing changed).

    Attributes:
        job_id: the job named in the refused call.
        token: the token the call carried.
    """

    def __init__(self, job_id: str, token: str, message: str) -> None:
        super().__init__(
            f"{message} (job {job_id}, token {token})" if token else f"{message} (job {job_id})"
        )
        self.job_id = job_id
        self.token = token


class StaleToken(LeaseRefused):
    """Another claim holds the job now: this worker's result is refused."""


class LeaseExpired(LeaseRefused):
    """The lease lapsed before the call; the job may be running elsewhere."""


class RunStopped(LeaseRefused):
    """ctx.raise_if_stopped(): this worker stopped the run itself (it is shutting down: the job
    is given back or failed by the worker), the lease held to the end; the job does not run
    elsewhere meanwhile. A timeout is its subclass JobTimeout."""


class JobTimeout(RunStopped):
    """ctx.raise_if_stopped(): the run passed its timeout_ms; the worker fails this attempt
    (error type JobTimeout, retried after its backoff or parked), whatever the handler does."""


class JobCancelled(LeaseRefused):
    """The job was cancelled: while this worker held it, or (from Queue.result(), token '')
    before it finished."""


class JobDead(SchedulerError):
    """Queue.result(): the job was parked in the dead letters; its last error is attached."""

    def __init__(
        self, job_id: str, reason: str | None, error_type: str | None, error_message: str | None
    ) -> None:
        # A job parked without an error of its own (a parent's end, a start deadline): none.
        last = f": {error_type}: {error_message}" if error_type or error_message else ""
        super().__init__(f"job {job_id!r} is dead ({reason}){last}")
        self.job_id = job_id
        self.reason = reason
        self.error_type = error_type
        self.error_message = error_message


class ResultTimeout(SchedulerError, TimeoutError):
    """Queue.result(): the job did not finish within timeout_s (it may still finish later)."""


class NotDurable(SchedulerError):
    """The primary accepted the jobs, but fewer replicas than asked acknowledged them in time:
    they may be lost if the primary fails now. The ids are attached; enqueue is idempotent on
    them, so re-sending the same JobSpecs with these job_ids is safe (a debounced spec: with its
    key and that id, without `debounce`, which takes no job_id).

    Attributes:
        job_ids: every id the call enqueued.
        acked: replicas that acknowledged in time.
        wanted: the queue's `wait_replicas`.
    """

    def __init__(self, job_ids: list[str], acked: int, wanted: int) -> None:
        super().__init__(f"{acked} of {wanted} replicas acknowledged {len(job_ids)} job(s)")
        self.job_ids = job_ids
        self.acked = acked
        self.wanted = wanted


class NoReplicas(ResponseError):
    """Redis refused the write for now: the master has fewer good replicas than its
    `min-replicas-to-write` (Redis's NOREPLICAS). Nothing was written and no job id was issued;
    the same call can succeed once a replica is back (enqueue with the same job_id is
    idempotent). The worker backs off and retries it. A redis ResponseError, as Redis's other
    refusals for now (OutOfMemoryError, ReadOnlyError), not a SchedulerError: callers that
    catch those catch this one too."""


class UnknownTask(SchedulerError, LookupError):
    """No handler is registered under that task name."""


class CorruptKey(SchedulerError, ResponseError):
    """A key of the queue holds another type than the one the call needs (edited by hand, or
    by another tool): the call was refused and nothing was written. `scheduler doctor` shows the
    queue's state. Still a redis ResponseError, as callers caught before."""


class NewerStorage(SchedulerError, ResponseError):
    """The queue is stored by a newer version of scheduler, whose layout this one would
    misread (its `config` field `generation` is higher than this version's): the call was
    refused and nothing was written. Upgrade this process (docs/guide/workers.md,
    "Upgrading"). Still a redis ResponseError, as CorruptKey."""


def newer_storage(queue: str, generation: Any, reads: int) -> NewerStorage | None:
    """NewerStorage when a `config` field `generation` read as lua/lib/util.lua
    newer_storage_err reads it (a plain decimal, up to 1,000,000) is above `reads`."""
    text = generation.decode() if isinstance(generation, bytes) else generation
    if not (isinstance(text, str) and text.isascii() and text.isdigit() and len(text) <= 7):
        return None
    if not reads < int(text) <= 1_000_000:
        return None
    return NewerStorage(
        f"queue {queue!r} is stored by a newer version of scheduler (generation {int(text)}; "
        f"this one reads {reads}): upgrade this one"
    )


# Refusals that hold until someone acts (a key fixed, this process upgraded): nothing was
# written, and the same call is sent again once they have (the worker backs off meanwhile).
REFUSED_UNTIL_FIXED = (CorruptKey, NewerStorage)


def raise_for_status(status: str, job_id: str, token: str) -> None:
    """Map a per-job status from a token-guarded script to an exception (or return on success)."""
    if status in ("done", "retry", "dead", "released", "held"):
        return
    if status == "stale":
        raise StaleToken(job_id, token, "stale token: another claim holds this job")
    if status == "expired":
        raise LeaseExpired(job_id, token, "lease expired")
    if status == "cancelled":
        raise JobCancelled(job_id, token, "job was cancelled")
    if status == "missing":
        raise JobNotFound(f"no job {job_id!r}")
    raise SchedulerError(f"unexpected status {status!r} for job {job_id}")


# Replies with which a server refuses a call for now, never for good: OOM (maxmemory with
# noeviction), BUSY (a slow script), LOADING, READONLY (a failover in progress), MISCONF (a
# failed RDB save), NOREPLICAS, a slot being moved (TRYAGAIN) or a cluster remapping. The call
# ran nothing; the same call later can succeed (the worker retries, the dashboard answers 503).
_REFUSED_FOR_NOW = (OutOfMemoryError, ReadOnlyError, ClusterDownError, TryAgainError, NoReplicas)
_REFUSED_FOR_NOW_CODES = frozenset(
    {"BUSY", "MISCONF", "NOREPLICAS", "LOADING", "OOM", "READONLY", "TRYAGAIN", "CLUSTERDOWN",
     "MASTERDOWN", "UNBLOCKED"}
)  # fmt: skip


def edited_by_hand(exc: ResponseError) -> bool:
    """A key of another type: a script's CORRUPT (CorruptKey) or a plain read's WRONGTYPE."""
    return isinstance(exc, CorruptKey) or str(exc).startswith("WRONGTYPE")


# SCRIPT KILL ends only a script that wrote nothing (one that wrote answers UNKILLABLE): the
# call changed nothing, as for BUSY. Its reply has only the ERR code.
_KILLED_TEXT = re.compile(r"^(ERR )?Script killed by user")


def refused_for_now(exc: ResponseError) -> bool:
    """Whether Redis refused the call only for now (see above), by class or by error code."""
    if isinstance(exc, _REFUSED_FOR_NOW):
        return True
    code = str(getattr(exc, "status_code", "") or str(exc).split(" ", 1)[0]).upper()
    return code in _REFUSED_FOR_NOW_CODES or _KILLED_TEXT.match(str(exc)) is not None


def slot_move_text(exc: BaseException, whose: str = "its") -> str | None:
    """What to say when a key's hash slot is being migrated between Redis Cluster nodes (a
    reshard): TRYAGAIN ('Multiple keys request during rehashing of slot'), or redis-py's 'TTL
    exhausted' once the redirections it follows (ASK, MOVED, TRYAGAIN) are used up, which only
    a slot on the move makes. None for any other error."""
    if isinstance(exc, TryAgainError):
        why = "TRYAGAIN"
    elif isinstance(exc, ClusterError) and "TTL exhausted" in str(exc):
        why = "redirections used up: TTL exhausted"
    else:
        return None
    return (
        f"{whose} hash slot is being migrated to another Redis Cluster node ({why}): run the"
        " command again once the move is done"
    )


def unreachable_text(exc: BaseException, params: dict[str, Any]) -> str:
    """The CLI's exit-3 line for a server that does not answer, or a queue's slot on the move
    (`params`: the command's, for its -q queue)."""
    queue = params.get("queue") or params.get("queues") or ()
    queue = queue[0] if isinstance(queue, tuple) and len(queue) == 1 else queue
    whose = f"queue {queue}'s" if isinstance(queue, str) else "a queue's"
    return slot_move_text(exc, whose) or f"cannot reach Redis: {exc}"


# Inside a script Redis 7.0 answers "ERR The user executing the script can't run this command
# or subcommand" (no NOPERM code); later versions say NOPERM.
_NOPERM_TEXT = re.compile(r"\bNOPERM\b|no permissions to|user executing the script can't")


def is_permission_error(exc: BaseException) -> bool:
    """An ACL refusal, whether redis-py typed it (NoPermissionError) or it came back from inside
    a script or a MULTI as a plain ResponseError carrying the NOPERM code."""
    return isinstance(exc, NoPermissionError) or (
        isinstance(exc, ResponseError) and _NOPERM_TEXT.search(str(exc)) is not None
    )


_REFUSALS = (AuthenticationError, AuthorizationError, NoPermissionError)


def cluster_refusal(exc: BaseException) -> BaseException | None:
    """The refused login or ACL permission behind redis-py's cluster error "Redis Cluster cannot
    be connected" (every seed node refused the password, or the user's CLUSTER SLOTS, which
    redis-py words "Cluster mode is not enabled on this node"): retrying cannot help, as with
    one server. None for any other error."""
    seen: BaseException | None = exc if isinstance(exc, RedisClusterException) else None
    for _ in range(5):  # redis-py chains it one or two deep (raise ... from, within except)
        if seen is None or isinstance(seen, _REFUSALS):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
