"""The Django example's tasks. The handler needs no Django: it gets the order id and writes its
side effect to Redis (a real one would load the order with the ORM after django.setup()). Run a
worker for them as-is:

    REDIS_URL=redis://localhost:6379/0 scheduler worker examples.django_app.tasks:registry
"""

from __future__ import annotations

import os
from typing import Any

import redis

from scheduler import JobContext, Registry

registry = Registry()
_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(
            os.environ.get("REDIS_URL", "redis://localhost:6379/0"), decode_responses=True
        )
    return _client


@registry.task(name="django_app.confirm_order", max_attempts=3)
def confirm_order(payload: Any, ctx: JobContext) -> dict[str, int]:
    # A real app e-mails the confirmation; keyed on the order, a retry rewrites the same key.
    _redis().set(f"examples:{ctx.queue}:confirmed:{payload['order_id']}", ctx.job_id)
    return {"order_id": payload["order_id"]}
