"""ctx.raise_if_stopped() names why the run stopped: LeaseExpired only for a lapsed lease (the
job may run elsewhere), JobTimeout / RunStopped when this worker stopped the run itself with its
lease held (a timeout, a shutdown), JobCancelled for a cancel. Each pickles (a process pool hands
the caller its error)."""

from __future__ import annotations

import pickle

import pytest

from scheduler import (
    JobCancelled,
    JobContext,
    JobTimeout,
    LeaseExpired,
    LeaseRefused,
    RunStopped,
)


@pytest.mark.parametrize(
    ("reason", "raised", "not_raised"),
    [
        ("expired", LeaseExpired, RunStopped),
        ("cancelled", JobCancelled, RunStopped),
        ("timeout", JobTimeout, LeaseExpired),
        ("shutdown", RunStopped, LeaseExpired),
    ],
)
def test_raise_if_stopped_names_the_reason(
    reason: str, raised: type[Exception], not_raised: type[Exception]
) -> None:
    ctx = JobContext.for_test("t")
    ctx.raise_if_stopped()  # not stopped: nothing raised
    assert ctx._stop(reason)
    with pytest.raises(raised) as got:
        ctx.raise_if_stopped()
    assert not isinstance(got.value, not_raised)
    assert isinstance(got.value, LeaseRefused)
    assert (got.value.job_id, got.value.token) == (ctx.job_id, ctx.token)
    again = pickle.loads(pickle.dumps(got.value))
    assert type(again) is type(got.value) and str(again) == str(got.value)


def test_a_shutdown_is_no_timeout() -> None:
    ctx = JobContext.for_test("t")
    ctx._stop("shutdown")
    with pytest.raises(RunStopped) as got:
        ctx.raise_if_stopped()
    assert not isinstance(got.value, JobTimeout)
    assert "shutting down" in str(got.value)
