"""The Django example's tasks. Run a worker for them as-is (it sets Django up with the app's
settings: the sweep reads orders with the ORM):

    REDIS_URL=redis://localhost:6379/0 scheduler worker examples.django_app.tasks:registry

and define the sweep's schedule once per deploy (the same definition again writes nothing):

    REDIS_URL=redis://localhost:6379/0 scheduler schedules add enqueue-missed-confirmations \\
        django_app.enqueue_missed_confirmations --every 1m
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cache
from typing import Any

import django
import redis
from django.apps import apps
from django.db import close_old_connections

from scheduler import JobContext, JobSpec, Queue, Registry, connect

if not apps.ready:  # a worker's process; the app's own has set Django up already
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_app.settings")
    django.setup()

from examples.django_app.models import Order  # after the setup above

registry = Registry()
_client: redis.Redis | None = None
SWEEP_BATCH = 500  # orders per sweep run: one enqueue_many call


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        # The scheduler's URL reader: the Sentinel and Cluster URLs the worker takes, too.
        _client = connect(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    return _client


@cache
def _queue(name: str) -> Queue:
    return Queue(_redis(), name)


@registry.middleware
def django_db(call_next: Callable[[Any, JobContext], Any], payload: Any, ctx: JobContext) -> Any:
    # Sync handlers run on the worker's long-lived threads, where Django's per-thread database
    # connection is never closed at a request's end: drop a broken or expired one around each
    # run, as Django does around each request.
    close_old_connections()
    try:
        return call_next(payload, ctx)
    finally:
        close_old_connections()


@registry.task(name="django_app.confirm_order", max_attempts=3)
def confirm_order(payload: Any, ctx: JobContext) -> dict[str, int]:
    # A real app e-mails the confirmation; keyed on the order, a retry rewrites the same key.
    _redis().set(f"examples:{ctx.queue}:confirmed:{payload['order_id']}", ctx.job_id)
    return {"order_id": payload["order_id"]}


def confirmation(order: Order) -> JobSpec:
    """The order's confirmation job, by its handle (the task's max_attempts=3 applies), with the
    id the order's row holds, also as its idempotency key: the view's enqueue and the sweep's
    write it once, the key still answering for a day after the job's record expired."""
    return confirm_order.job_spec({"order_id": order.pk}, job_id=order.job_id, key=order.job_id)


# max_attempts=1: its next run, a minute later, is its retry.
@registry.task(name="django_app.enqueue_missed_confirmations", max_attempts=1)
def enqueue_missed_confirmations(payload: Any, ctx: JobContext) -> dict[str, int]:
    """The outbox sweep: the committed orders whose enqueue failed (views.py), enqueued."""
    orders = list(Order.objects.filter(enqueued=False).order_by("pk")[:SWEEP_BATCH])
    if orders:
        _queue(ctx.queue).enqueue_many([confirmation(o) for o in orders])
        Order.objects.filter(pk__in=[o.pk for o in orders]).update(enqueued=True)
    return {"enqueued": len(orders)}
