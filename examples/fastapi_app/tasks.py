"""The FastAPI example's tasks: an async handler (the worker runs it on its event loop). Run a
worker for them as-is:

    REDIS_URL=redis://localhost:6379/0 scheduler worker examples.fastapi_app.tasks:registry
"""

from __future__ import annotations

import os
from typing import Any

from scheduler import JobContext, Registry, connect_async

registry = Registry()


@registry.task(name="fastapi_app.resize_image", max_attempts=3)
async def resize_image(payload: Any, ctx: JobContext) -> dict[str, Any]:
    # A real app resizes the image here; the side effect is a Redis key keyed on the job.
    # The scheduler's URL reader: the Sentinel and Cluster URLs the worker takes, too.
    client = connect_async(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    try:
        await client.set(f"examples:{ctx.queue}:thumbnail:{payload['image']}", ctx.job_id)
    finally:
        await client.aclose()
    return {"thumbnail": f"{payload['image']}.thumb.png", "width": payload["width"]}
