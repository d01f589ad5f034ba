"""The Flask example's tasks. Run a worker for them as-is (REDIS_URL is read by the worker and by
the handler, SCHEDULER_QUEUE by the worker and by the app):

    REDIS_URL=redis://localhost:6379/0 scheduler worker examples.flask_app.tasks:registry
"""

from __future__ import annotations

import os
from typing import Any

import redis

from scheduler import JobContext, Registry, connect

registry = Registry()
_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        # The scheduler's URL reader: the Sentinel and Cluster URLs the worker takes, too.
        _client = connect(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    return _client


@registry.task(name="flask_app.send_welcome", max_attempts=3)
def send_welcome(payload: Any, ctx: JobContext) -> dict[str, str]:
    # A real app sends an e-mail here. The side effect is keyed on the job, so a retry (after a
    # crash mid-job) writes the same thing again instead of sending a second mail.
    _redis().set(f"examples:{ctx.queue}:welcome:{payload['email']}", ctx.job_id)
    return {"sent_to": payload["email"]}
