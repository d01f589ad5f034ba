"""Flask: a synchronous enqueue in a request. Run it with

REDIS_URL=redis://localhost:6379/0 flask --app examples.flask_app.app run
curl -X POST localhost:5000/signups -H 'content-type: application/json' \\
     -d '{"email": "a@example.com"}'
curl localhost:5000/jobs/<id>
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, abort, request

from examples.flask_app.tasks import send_welcome
from scheduler import BadArgument, JobNotFound, Queue


def create_app(redis_url: str | None = None, queue: str | None = None) -> Flask:
    app = Flask(__name__)
    # One Queue per app: it is thread-safe (redis-py's pool) and caches the loaded scripts.
    # Queue.from_url reads every URL the worker does (Sentinel, Cluster: docs/cluster.md).
    q = Queue.from_url(
        redis_url or os.environ.get("REDIS_URL", "redis://localhost:6379/0"),
        queue or os.environ.get("SCHEDULER_QUEUE", "default"),
    )

    @app.post("/signups")
    def signup() -> tuple[dict[str, Any], int]:
        body = request.get_json(silent=True)
        if not isinstance(body, dict):  # not JSON, or a list / string / number: the client's
            abort(400, "a JSON object with an email expected")
        email = body.get("email")
        if not isinstance(email, str) or "@" not in email:
            abort(400, "email required")
        # By its handle: the task's own defaults (max_attempts=3) apply (not by name).
        job_id = send_welcome.enqueue(q, {"email": email})
        return {"job_id": job_id}, 202

    @app.get("/jobs/<job_id>")
    def job(job_id: str) -> dict[str, Any]:
        try:
            j = q.get_job(job_id)
        except (JobNotFound, BadArgument):  # BadArgument: a malformed id, which names no job
            abort(404)
        return {"id": j.id, "state": j.state, "result_json": j.result_json}

    return app
