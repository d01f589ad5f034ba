"""`RetryLater`: a handler's way to say "this attempt failed, try again in delay_ms" (a webhook
answered 429 with Retry-After, a partner API is down for maintenance until 06:00), instead of
the job's backoff. It is one failed attempt like any other: counted, its error kept in the
job's history, and the job parked as dead after its last attempt, so a handler that always
asks for later cannot keep a job alive for ever."""

from __future__ import annotations

from scheduler.core.errors import SchedulerError
from scheduler.core.limits import check_int


class RetryLater(SchedulerError):
    """Raise it in a handler to retry the job after `delay_ms` (0 .. 3650 days) rather than by
    its backoff: `raise RetryLater(300_000, "rate limited")`. Retried even when the task's
    `non_retryable` covers it; parked after the job's last attempt. A `delay_ms` out of range
    raises BadArgument where it is built (that error then fails the attempt by the backoff)."""

    def __init__(self, delay_ms: int, message: str = "") -> None:
        self.delay_ms = check_int(delay_ms, "delay_ms")
        self.message = message
        super().__init__(f"retry in {self.delay_ms} ms" + (f": {message}" if message else ""))

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuilt without calling __init__ again (Exception's way calls it with args, its text:
        # a bad delay), so a RetryLater, or an app's subclass of it, raised in a process pool's
        # child comes back whole to the handler instead of breaking the pool.
        return _rebuilt, (type(self), self.args), self.__dict__


def _rebuilt(cls: type[RetryLater], args: tuple[object, ...]) -> RetryLater:
    return cls.__new__(cls, *args)
