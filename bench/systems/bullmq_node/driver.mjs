// The Node.js side of the bullmq-node peer: only BullMQ's own API plus the shared handler work.
// Measurement (counter polling, lateness, memory) stays in Python (bench/common.py), so every
// system is measured by the same code; see __init__.py beside this file.
//
//   node driver.mjs enqueue_single '{"url": ..., "n": N}'         -> {"seconds": s}
//   node driver.mjs enqueue_bulk   '{"url": ..., "n": N}'         -> {"seconds": s}
//   node driver.mjs pending        '{"url": ..., "n": N, "due_s": epoch s | 0, "first": i}'
//   node driver.mjs worker         '{"url": ..., "concurrency": C}'  (runs until SIGTERM)
//   node driver.mjs version        '{}'                          -> {"bullmq": v, "node": v}
//   node driver.mjs handler        '{"url": ..., "n": N, "concurrency": C}'
//        -> {"cpu_us_per_job", "jobs_per_s"}: the handler's INCR alone, C at a time (no BullMQ),
//           the part of a drain's worker CPU that is the handler's (bench/profile_drain.py)

import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import { Queue, Worker } from "bullmq";
import IORedis from "ioredis";

// Same names and payload as bench/common.py.
const QUEUE = "bench";
const COUNTER = "bench:count";
const STARTS = "bench:starts";
const PAD = "x".repeat(64);

function payload(i, timed = false) {
  return { i, t: timed ? 1 : 0, pad: PAD };
}

// unix:///path/r.sock or redis://host:port/db -> ioredis options.
function connection(url, extra = {}) {
  if (url.startsWith("unix://")) {
    return { path: url.slice("unix://".length), ...extra };
  }
  const u = new URL(url);
  if (u.port === "6379") throw new Error(`refusing the shared server ${url}`);
  const db = Number(u.pathname.replace("/", "") || 0);
  return { host: u.hostname, port: Number(u.port), db, ...extra };
}

// Wall clock in seconds with sub-ms resolution, like Python's time.time().
function nowS() {
  return (performance.timeOrigin + performance.now()) / 1000;
}

function out(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

async function enqueueSingle(url, n) {
  const q = new Queue(QUEUE, { connection: connection(url) });
  try {
    const t0 = performance.now();
    for (let i = 0; i < n; i++) {
      await q.add("task", payload(i));
    }
    return (performance.now() - t0) / 1000;
  } finally {
    await q.close();
  }
}

function bulkJobs(n, dueS, first) {
  const jobs = new Array(n);
  const timed = dueS > 0;
  for (let k = 0; k < n; k++) {
    const job = { name: "task", data: payload(first + k, timed) };
    if (timed) job.opts = { delay: Math.max(0, Math.ceil(dueS * 1000 - Date.now())) };
    jobs[k] = job;
  }
  return jobs;
}

async function enqueueBulk(url, n, dueS = 0, first = 0) {
  const q = new Queue(QUEUE, { connection: connection(url) });
  try {
    const t0 = performance.now();
    await q.addBulk(bulkJobs(n, dueS, first));
    return (performance.now() - t0) / 1000;
  } finally {
    await q.close();
  }
}

async function runWorker(url, concurrency) {
  // The handler's own client, shared by the worker's concurrent jobs (as in the Python drivers).
  const r = new IORedis(connection(url));
  const processor = async (job) => {
    if (job.data.t) await r.rpush(STARTS, String(nowS()));
    await r.incr(COUNTER);
  };
  const worker = new Worker(QUEUE, processor, {
    connection: connection(url, { maxRetriesPerRequest: null }),
    concurrency,
  });
  worker.on("error", (err) => console.error("worker error:", err));
  await worker.waitUntilReady();
  console.error(`bullmq-node worker ready (concurrency ${concurrency})`);
  await new Promise((resolve) => {
    process.once("SIGTERM", resolve);
    process.once("SIGINT", resolve);
  });
  await worker.close();
  r.disconnect();
}

async function handlerOnly(url, n, concurrency) {
  const r = new IORedis(connection(url));
  await r.incr(COUNTER);
  let left = n;
  const one = async () => {
    while (left > 0) {
      left--;
      const data = payload(0);
      if (data.t) await r.rpush(STARTS, String(nowS()));
      await r.incr(COUNTER);
    }
  };
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, one));
  const wallS = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  r.disconnect();
  return { cpu_us_per_job: (cpu.user + cpu.system) / n, jobs_per_s: n / wallS };
}

async function main() {
  const [cmd, raw] = process.argv.slice(2);
  const a = JSON.parse(raw || "{}");
  switch (cmd) {
    case "enqueue_single":
      out({ seconds: await enqueueSingle(a.url, a.n) });
      break;
    case "enqueue_bulk":
      out({ seconds: await enqueueBulk(a.url, a.n) });
      break;
    case "pending":
      out({ seconds: await enqueueBulk(a.url, a.n, a.due_s || 0, a.first || 0) });
      break;
    case "worker":
      await runWorker(a.url, a.concurrency);
      break;
    case "handler":
      out(await handlerOnly(a.url, a.n, a.concurrency));
      break;
    case "version": {
      const pkg = new URL("./node_modules/bullmq/package.json", import.meta.url);
      out({ bullmq: JSON.parse(readFileSync(pkg, "utf8")).version, node: process.version });
      break;
    }
    default:
      throw new Error(`unknown command ${cmd}`);
  }
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
