"""FastAPI: an AsyncQueue opened and closed by the app's lifespan, an async enqueue in a request,
and the job's state and result read back with `get_job`. Run it with

    REDIS_URL=redis://localhost:6379/0 uvicorn examples.fastapi_app.app:app
    curl -X POST localhost:8000/images -H 'content-type: application/json' \\
         -d '{"image": "cat", "width": 64}'
    curl localhost:8000/jobs/<id>
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

from examples.fastapi_app.tasks import resize_image
from scheduler import AsyncQueue, BadArgument, JobNotFound


class ImageIn(BaseModel):
    image: str = Field(min_length=1, max_length=200)
    width: int = Field(gt=0, le=4096)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    client = aioredis.Redis.from_url(
        os.environ.get("REDIS_URL", "redis://localhost:6379/0"), decode_responses=True
    )
    app.state.queue = AsyncQueue(client, os.environ.get("SCHEDULER_QUEUE", "default"))
    await app.state.queue.preload()  # load the scripts once, at start-up
    try:
        yield
    finally:
        await app.state.queue.aclose()  # closes its client


app = FastAPI(lifespan=lifespan)


def _queue(request: Request) -> AsyncQueue:
    q: AsyncQueue = request.app.state.queue
    return q


@app.post("/images", status_code=202)
async def submit(body: ImageIn, request: Request) -> dict[str, str]:
    # By its handle: the task's own defaults (max_attempts=3) apply. By name,
    # `q.enqueue("fastapi_app.resize_image", ...)` would not know them.
    job_id = await resize_image.aenqueue(_queue(request), body.model_dump())
    return {"job_id": job_id}


@app.get("/jobs/{job_id}")
async def job(job_id: str, request: Request) -> dict[str, Any]:
    # Answers at once with the job's state; a request that should wait for the outcome can
    # `await q.result(job_id, timeout_s=...)` (no polling: the worker's complete wakes it).
    try:
        j = await _queue(request).get_job(job_id)
    except (JobNotFound, BadArgument):  # BadArgument: a malformed id, which names no job
        raise HTTPException(404, "no such job") from None
    result = json.loads(j.result_json) if j.result_json is not None else None
    return {"id": j.id, "state": j.state, "result": result}
