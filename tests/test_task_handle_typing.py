"""A task handle's calls are checked by the caller's type checker: calling it as the function
(its own signature), and `enqueue` / `aenqueue` / `job_spec` options (JobOptions). Each line
below that mypy must refuse carries a `type: ignore[...]`; the project's `mypy --strict` (in
`make test`) warns of an unused ignore, so if a handle stopped being checked, it fails there.
At run time the same calls raise TypeError."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler import JobContext, Registry

registry = Registry()


@registry.task("typing.greet")
def greet(payload: dict[str, Any], ctx: JobContext) -> str:
    return f"hi {payload['name']}"


def test_a_call_to_the_handle_is_checked_against_the_function() -> None:
    with pytest.raises(TypeError):
        greet({"name": "a"}, None, 3)  # type: ignore[call-arg, arg-type]


def test_an_option_typo_is_refused_by_the_checker_and_at_run_time() -> None:
    with pytest.raises(TypeError, match="delay"):
        greet.job_spec({"name": "a"}, delay=5)  # type: ignore[call-arg]
    spec = greet.job_spec({"name": "a"}, delay_ms=5)
    assert spec.delay_ms == 5


def test_enqueue_options_are_typed(module_server: Any) -> None:
    from scheduler import Queue

    with Queue.from_url(module_server.url, "typing") as q:
        with pytest.raises(TypeError, match="delay"):
            greet.enqueue(q, {"name": "a"}, delay=5)  # type: ignore[call-arg]
        job = greet.enqueue(q, {"name": "a"}, delay_ms=60_000, key="k")
        assert q.status(job) == "scheduled"
