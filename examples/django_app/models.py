from __future__ import annotations

from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    # The confirmation job's id, chosen in the order's own transaction (views.py): an order
    # always names its job, and every enqueue of it, the view's or the sweep's, sends that id.
    job_id = models.CharField(max_length=64, blank=True)
    # Set once the job is in Redis; the sweep (tasks.py) enqueues the orders still False.
    enqueued = models.BooleanField(default=False, db_index=True)
