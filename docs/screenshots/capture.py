"""Make the dashboard screenshots in this folder from a real run: a private redis-server, two
real workers (`scheduler worker`) on three queues, a producer that sends bursts, some jobs that
fail to the dead letters, two schedules; after about two minutes of that, headless Chromium
saves the main pages at 1280x800. Nothing is staged by hand.

    .venv/bin/python docs/screenshots/capture.py          # needs /usr/bin/chromium
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis
import uvicorn
from playwright.sync_api import sync_playwright

from scheduler import Backoff, Queue
from scheduler._spawn import RedisProcess, find_binary
from scheduler.dashboard import Auth, create_app
from scheduler.worker.registry import JobContext, Registry

HERE = Path(__file__).resolve().parent
QUEUES = ("emails", "reports", "billing")
RUN_S = float(os.environ.get("CAPTURE_SECONDS", "120"))
registry = Registry()


@registry.task(name="emails.send", max_attempts=2, backoff=Backoff(base_ms=500, factor=2.0))
def send(payload: Any, ctx: JobContext) -> str:
    time.sleep(0.02)
    if payload.get("bounce"):
        raise ConnectionRefusedError(f"smtp: mailbox {payload['to']} unavailable")
    return "sent"


@registry.task(name="reports.build", max_attempts=1)
def build(payload: Any, ctx: JobContext) -> dict[str, int]:
    time.sleep(0.4)
    if payload.get("n", 0) % 17 == 0:
        raise TimeoutError("warehouse did not answer within 30 s")
    return {"rows": payload.get("n", 0) * 10}


@registry.task(name="billing.charge", max_attempts=1)
def charge(payload: Any, ctx: JobContext) -> None:
    raise KeyError("customer_id")


def produce(url: str, stop: threading.Event) -> None:
    client = redis.Redis.from_url(url, decode_responses=True)
    emails, reports = Queue(client, "emails"), Queue(client, "reports")
    n = 0
    while not stop.is_set():
        burst = 40 if int(time.time()) % 30 < 8 else 3  # a burst every 30 s: lateness rises
        for _ in range(burst):
            n += 1
            reports.enqueue("reports.build", {"n": n, "owner": "finance"}, max_attempts=1)
        for _ in range(5):
            n += 1
            to = f"user{n}@example.com"
            bounce = random.random() < 0.05
            emails.enqueue("emails.send", {"to": to, "bounce": bounce}, max_attempts=2)
        stop.wait(2)


def main() -> None:
    server = RedisProcess(find_binary()).start()
    workers: list[subprocess.Popen[bytes]] = []
    stop = threading.Event()
    try:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        billing = Queue(client, "billing")
        billing.schedule("invoices", "billing.charge", cron="0 6 * * 1-5", tz="Europe/Berlin")
        billing.schedule("usage-sync", "billing.charge", every_ms=3_600_000)
        billing.schedule("dunning", "billing.charge", cron="30 9 * * *", tz="America/New_York")
        billing.pause_schedule("dunning")
        for i in range(3):
            billing.enqueue("billing.charge", {"invoice": 1000 + i}, max_attempts=1)
        env = dict(os.environ, PYTHONPATH=str(HERE))
        for qs, c in ((["emails", "billing"], "8"), (["reports"], "2")):
            cli = str(Path(sys.executable).parent / "scheduler")
            args = [cli, "worker", "capture:registry"]
            args += ["--url", server.url, "-c", c, "--log-level", "error"]
            for q in qs:
                args += ["-q", q]
            workers.append(subprocess.Popen(args, env=env))
        threading.Thread(target=produce, args=(server.url, stop), daemon=True).start()
        app = create_app(client=client, queues=QUEUES, auth=Auth())
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        web = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
        threading.Thread(target=web.run, daemon=True).start()
        base = f"http://127.0.0.1:{port}"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(base + "/")
            time.sleep(RUN_S)
            stop.set()
            time.sleep(4)
            page.reload()
            page.wait_for_selector("#lateness-chart path")
            page.screenshot(path=str(HERE / "overview.png"))
            dead = Queue(client, "reports").list_jobs("dead", limit=1)
            shots = {
                "queue": "/queues/reports?state=due",
                "dead": "/queues/emails/dead",
                "schedules": "/schedules",
                "workers": "/workers",
                "health": "/health",
            }
            if dead:
                shots["job"] = f"/queues/reports/jobs/{dead[0].id}"
            for name, path in shots.items():
                page.goto(base + path)
                page.wait_for_timeout(300)
                page.screenshot(path=str(HERE / f"{name}.png"))
            browser.close()
        web.should_exit = True
    finally:
        stop.set()
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(30)
        server.cleanup()


if __name__ == "__main__":
    main()
