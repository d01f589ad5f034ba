"""Django: enqueue after the transaction commits (views.py). Run it with

REDIS_URL=redis://localhost:6379/0 python -m examples.django_app.manage migrate --run-syncdb
REDIS_URL=redis://localhost:6379/0 python -m examples.django_app.manage runserver
curl -X POST localhost:8000/orders -d '{"item": "book"}'
curl -X POST localhost:8000/orders -d '{"item": "book", "fail": true}'  # rolled back: no job
curl localhost:8000/orders/<order_id>

and the sweep that enqueues an order whose enqueue failed after its commit (views.py, tasks.py):

REDIS_URL=redis://localhost:6379/0 scheduler schedules add enqueue-missed-confirmations \\
    django_app.enqueue_missed_confirmations --every 1m
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_app.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
