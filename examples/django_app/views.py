"""Django: enqueue after the transaction commits. `transaction.on_commit` runs the enqueue only
once the order row is committed, so a worker never picks up a job for a row it cannot see yet,
and a rolled-back request enqueues nothing."""

from __future__ import annotations

import json
from functools import cache

import redis
from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from examples.django_app.models import Order
from examples.django_app.tasks import confirm_order
from scheduler import JobNotFound, Queue


@cache
def queue() -> Queue:
    """One Queue per process (thread-safe; it caches the loaded scripts)."""
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    return Queue(client, settings.SCHEDULER_QUEUE)


def _enqueue_confirmation(order_id: int) -> None:
    # By its handle: the task's own defaults (max_attempts=3) apply (not by name).
    job_id = confirm_order.enqueue(queue(), {"order_id": order_id})
    Order.objects.filter(pk=order_id).update(job_id=job_id)


@csrf_exempt
@require_POST
def create_order(request: HttpRequest) -> HttpResponse:
    body = json.loads(request.body or b"{}")
    with transaction.atomic():
        order = Order.objects.create(item=str(body.get("item", "")))
        transaction.on_commit(lambda: _enqueue_confirmation(order.pk))
        if body.get("fail"):  # stands for any error after the row was written: rolls back
            raise ValueError("order rejected")
    return JsonResponse({"order_id": order.pk}, status=201)


@require_GET
def show_order(request: HttpRequest, order_id: int) -> HttpResponse:
    order = Order.objects.filter(pk=order_id).first()
    if order is None:
        return JsonResponse({"error": "no such order"}, status=404)
    state: str | None = None
    if order.job_id:
        try:
            state = queue().status(order.job_id)
        except JobNotFound:
            state = "gone"
    return JsonResponse({"order_id": order.pk, "job_id": order.job_id, "state": state})
