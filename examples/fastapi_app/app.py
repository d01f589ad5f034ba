"""FastAPI: an AsyncQueue opened and closed by the app's lifespan, an async enqueue in a request,
and the job's state and result read back with `get_job`. Run it with

    REDIS_URL=redis://localhost:6379/0 uvicorn examples.fastapi_app.app:app
    curl -X POST localhost:8000/images -H 'content-type: application/json' \\
         -d '{"image": "cat", "width": 64}'
    curl localhost:8000/jobs/<id>

Every Redis call of a request first takes one of REDIS_CALLS_AT_ONCE slots, so a burst (a page
of 150 job spinners polling /jobs/<id>) waits its turn instead of failing: redis.asyncio's pool
refuses a call past its 100 connections (MaxConnectionsError, a 500). A BlockingConnectionPool,
which waits too, serves one server only, and AsyncQueue.from_url reads Sentinel and Cluster URLs
as the worker does; keep the slots below the URL's `?max_connections=` (100 when not given).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

from examples.fastapi_app.tasks import resize_image
from scheduler import AsyncQueue, BadArgument, JobNotFound

REDIS_CALLS_AT_ONCE = 64  # per process: below the pool's 100, room left for the queue's own calls


class ImageIn(BaseModel):
    image: str = Field(min_length=1, max_length=200)
    width: int = Field(gt=0, le=4096)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Opened here, in each server process (after a fork) and on its event loop.
    app.state.queue = AsyncQueue.from_url(
        os.environ.get("REDIS_URL", "redis://localhost:6379/0"),
        os.environ.get("SCHEDULER_QUEUE", "default"),
    )
    app.state.redis_slots = asyncio.Semaphore(REDIS_CALLS_AT_ONCE)
    await app.state.queue.preload()  # load the scripts once, at start-up
    try:
        yield
    finally:
        await app.state.queue.aclose()  # closes its client


app = FastAPI(lifespan=lifespan)


@asynccontextmanager
async def _queue(request: Request) -> AsyncIterator[AsyncQueue]:
    """The app's queue, held for one call once a slot is free (module docstring)."""
    async with request.app.state.redis_slots:
        yield request.app.state.queue


@app.post("/images", status_code=202)
async def submit(body: ImageIn, request: Request) -> dict[str, str]:
    # By its handle: the task's own defaults (max_attempts=3) apply. By name,
    # `q.enqueue("fastapi_app.resize_image", ...)` would not know them.
    async with _queue(request) as q:
        job_id = await resize_image.aenqueue(q, body.model_dump())
    return {"job_id": job_id}


@app.get("/jobs/{job_id}")
async def job(job_id: str, request: Request) -> dict[str, Any]:
    # Answers at once with the job's state; a request that should wait for the outcome can
    # `await q.result(job_id, timeout_s=...)` (the worker's outcome wakes it; its state is
    # re-checked once a second, and waits share at most half the client's connections).
    try:
        async with _queue(request) as q:
            j = await q.get_job(job_id)
    except (JobNotFound, BadArgument):  # BadArgument: a malformed id, which names no job
        raise HTTPException(404, "no such job") from None
    result = json.loads(j.result_json) if j.result_json is not None else None
    return {"id": j.id, "state": j.state, "result": result}
