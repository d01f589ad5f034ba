"""Django: enqueue after the transaction commits. `transaction.on_commit` runs the enqueue only
once the order row is committed, so a worker never picks up a job for a row it cannot see yet,
and a rolled-back request enqueues nothing.

The gap on_commit leaves: the row is committed before the enqueue runs, so Redis unreachable at
that moment (a failover, a restart) would leave an order without its job, and, the callback's
error raised after COMMIT, answer the client 500 for an order that exists (a retry: a second
order). Closed as a transactional outbox does: the order's row records its job's id in the same
transaction, the callback is `robust` (its error logged, the order answered 201) and marks the
order `enqueued` once the job is in Redis; a recurring sweep (tasks.py) enqueues the orders not
marked. Every enqueue of an order sends the same id and idempotency key: written once."""

from __future__ import annotations

import json
import uuid
from functools import cache

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from examples.django_app.models import Order
from examples.django_app.tasks import confirmation
from scheduler import JobNotFound, Queue


@cache
def queue() -> Queue:
    """One Queue per process (thread-safe; it caches the loaded scripts). Queue.from_url reads
    every URL the worker does (Sentinel, Cluster: docs/cluster.md)."""
    return Queue.from_url(settings.REDIS_URL, settings.SCHEDULER_QUEUE)


def _enqueue_confirmation(order: Order) -> None:
    queue().enqueue_many([confirmation(order)])
    Order.objects.filter(pk=order.pk).update(enqueued=True)


@csrf_exempt
@require_POST
def create_order(request: HttpRequest) -> HttpResponse:
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:  # not JSON (a form post, a cut body) or not UTF-8: the client's error
        body = None
    if not isinstance(body, dict):
        return JsonResponse({"error": "a JSON object expected"}, status=400)
    with transaction.atomic():
        # The job's id, chosen with the row (random: a reused pk names no older order's job).
        job_id = f"confirm-order:{uuid.uuid4().hex}"
        order = Order.objects.create(item=str(body.get("item", "")), job_id=job_id)
        # robust: an enqueue failing after the commit is logged, not raised; the sweep sends it.
        transaction.on_commit(lambda: _enqueue_confirmation(order), robust=True)
        if body.get("fail"):  # stands for any error after the row was written: rolls back
            raise ValueError("order rejected")
    return JsonResponse({"order_id": order.pk}, status=201)


@require_GET
def show_order(request: HttpRequest, order_id: int) -> HttpResponse:
    order = Order.objects.filter(pk=order_id).first()
    if order is None:
        return JsonResponse({"error": "no such order"}, status=404)
    state: str | None = None  # not in Redis yet: the sweep enqueues it
    if order.enqueued:
        try:
            state = queue().status(order.job_id)
        except JobNotFound:  # its record expired (result_ttl_ms) once it ran
            state = "gone"
    return JsonResponse({"order_id": order.pk, "job_id": order.job_id, "state": state})
