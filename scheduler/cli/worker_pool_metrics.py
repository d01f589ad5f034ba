"""The one metrics endpoint of `scheduler worker --processes N --metrics-port P`: the supervisor
serves P; each scrape fetches every ready child's /metrics (on 127.0.0.1, at the port its ready
message named: worker_pool_child.py) at once, labels every sample process="<slot>" (the child's
index 0..N-1, which a restart or a reload keeps), merges the families of one name and renders
them. prometheus_client parses and renders; the supervisor still runs none of the user's code
and holds no Redis connection.

Besides the children's own families it serves `scheduler_pool_process_up{process}` (1: the
slot's process answered this scrape, 0: it did not: down, restarting or stuck, worth an alert)
and `scheduler_pool_process_retired{process}` (1 for a slot an operator stopped with
`scheduler workers stop|quiet`, which is never started again). A retired slot is exported this
way only: it has no `scheduler_pool_process_up` sample, so an alert on `up == 0` does not fire
for a process stopped on purpose.

A child's counters are carried across its slot's recycling: a child that returns from its
worker (--max-jobs, --max-memory-mb, an operator's or the pool's stop) writes its last counts
to a file the supervisor named (FINAL_METRICS_ENV, worker_pool_child.hand_over_metrics), and the
slot's counters and histograms from then on are the new child's plus every such hand-over, so
its `process` series keep growing instead of falling back to 0 (the counts since the last
scrape, once lost, are kept). A child that left no file (killed, crashed) resets its slot's
series, which Prometheus's rate() takes as a counter reset; so does a reload's new process,
and the file of the one it replaced is deleted unread."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import urllib.request
from collections.abc import Collection, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, wait

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from scheduler.worker.logs import LOGGER
from scheduler.worker.metrics import METRICS_ADDR

FETCH_TIMEOUT_S = 2.0  # a child that has not answered by then is left out of the scrape
LABEL = "process"
# Gauges of the queue itself, which every process reads from Redis (the same numbers): served
# once, from the lowest slot that has them and without a `process` label, so a sum over the
# endpoint is the queue's depth, not N times it (scheduler/worker/metrics.py).
QUEUE_LEVEL = frozenset(
    (
        "scheduler_queue_jobs",
        "scheduler_queue_held_jobs",
        "scheduler_queue_paused",
        "scheduler_queue_oldest_overdue_seconds",
    )
)

log = logging.getLogger(LOGGER)

# A loopback fetch never goes through the environment's http_proxy.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PoolMetrics:
    """The supervisor's /metrics server, in a daemon thread (prometheus_client's): each request
    is a thread of its own, so a slow child delays that scrape only, never the pool's loop or
    its signal handling. Binds at construction (OSError: the port is taken)."""

    def __init__(self, port: int) -> None:
        # (slot -> its ready child's metrics port (None: no ready child now), the retired slots,
        # not in the dict). Pool replaces the whole tuple, never edits it, so a scrape reads one
        # consistent snapshot without a lock.
        self.slots: tuple[dict[int, int | None], frozenset[int]] = ({}, frozenset())
        registry = CollectorRegistry(support_collectors_without_names=True)  # ?name[]= too
        registry.register(self)
        self._server, _ = start_http_server(port, addr=METRICS_ADDR, registry=registry)
        self.port = int(self._server.server_address[1])
        self.carry = Carry()
        self._dir = tempfile.mkdtemp(prefix="scheduler-pool-metrics-")  # 0700: ours only
        self._handoffs = 0

    def handoff_path(self) -> str:
        """A new file name for one child's last counts (FINAL_METRICS_ENV)."""
        self._handoffs += 1
        return os.path.join(self._dir, f"{self._handoffs}.prom")

    def reaped(self, slot: int, path: str | None) -> None:
        """Slot's child, given `path`, has exited: its last counts, if it wrote them, are
        carried in the slot; else (killed, crashed) the slot's series start again."""
        text = None
        if path is not None:
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                os.unlink(path)
            except OSError:
                text = None
        if text is not None:
            self.carry.add(slot, text)
        else:
            self.carry.forget(slot)

    def discard(self, path: str | None) -> None:
        """A reload's process ended: the file it may have written is deleted unread (its slot
        has a new process, whose series started again), so reloads leave none behind."""
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def collect(self) -> Iterator[Metric]:
        targets, retired = self.slots
        texts = fetch_all(targets)
        # A slot with no process to ask (retired by an operator, or between a clean exit and
        # its next process) serves its carry alone: its counts stay in the pool's totals. A
        # live one that did not answer stays out (its carry alone would read as a reset).
        idle = {slot for slot, port in targets.items() if port is None} | retired
        yield from relabel_merge(texts, self.carry, idle)
        up = GaugeMetricFamily(
            "scheduler_pool_process_up",
            "1 if the worker process of this slot answered this scrape, else 0 (starting, "
            "restarting, or no answer within 2 s: its series are missing from this scrape); "
            "none for a slot an operator stopped (scheduler_pool_process_retired)",
            labels=[LABEL],
        )
        for slot in sorted(targets):
            up.add_metric([str(slot)], 1 if slot in texts else 0)
        yield up
        gone = GaugeMetricFamily(
            "scheduler_pool_process_retired",
            "1: an operator stopped this slot's worker process (scheduler workers stop|quiet); "
            "the pool does not start it again",
            labels=[LABEL],
        )
        for slot in sorted(retired):
            gone.add_metric([str(slot)], 1)
        yield gone

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        shutil.rmtree(self._dir, ignore_errors=True)


_CARRIED = frozenset(("counter", "histogram", "summary"))
_Key = tuple[str, tuple[tuple[str, str], ...]]  # sample name, its labels


class Carry:
    """Each slot's hand-overs summed: family name -> (its help, type, unit) and sample ->
    value. Replaced, never edited, so a scrape thread reads one consistent snapshot."""

    def __init__(self) -> None:
        self._slots: dict[int, dict[str, tuple[tuple[str, str, str], dict[_Key, float]]]] = {}

    def add(self, slot: int, text: str) -> None:
        try:
            families = list(text_string_to_metric_families(text))
        except ValueError as exc:
            log.warning("last metrics of worker process %d unreadable: %s", slot + 1, exc)
            return self.forget(slot)
        old = self._slots.get(slot, {})
        new = {name: (meta, dict(values)) for name, (meta, values) in old.items()}
        for fam in families:
            if fam.type not in _CARRIED:
                continue
            _, values = new.setdefault(fam.name, ((fam.documentation, fam.type, fam.unit), {}))
            for s in fam.samples:
                if not s.name.endswith("_created"):  # a time, not a count
                    key = (s.name, tuple(sorted(s.labels.items())))
                    values[key] = values.get(key, 0.0) + s.value
        self._slots = {**self._slots, slot: new}
        return None

    def forget(self, slot: int) -> None:
        if slot in self._slots:
            self._slots = {k: v for k, v in self._slots.items() if k != slot}

    def apply(self, slot: int, families: list[Metric]) -> list[Metric]:
        """The slot's families with its carry added (a sample the child has not yet: the
        carry's alone)."""
        carried = self._slots.get(slot)
        if not carried:
            return families
        seen = set()
        for fam in families:
            if fam.name not in carried:
                continue
            seen.add(fam.name)  # of another type (another version's child): not added
            if fam.type != carried[fam.name][0][1]:
                continue
            values = dict(carried[fam.name][1])
            for i, s in enumerate(fam.samples):
                extra = values.pop((s.name, tuple(sorted(s.labels.items()))), None)
                if extra is not None:
                    fam.samples[i] = s._replace(value=s.value + extra)
            fam.samples += [Sample(n, dict(labels), v) for (n, labels), v in values.items()]
        for name, ((doc, typ, unit), values) in carried.items():
            if name not in seen:
                fam = Metric(name, doc, typ, unit)
                fam.samples = [Sample(n, dict(labels), v) for (n, labels), v in values.items()]
                families.append(fam)
        return families


def fetch_all(targets: Mapping[int, int | None]) -> dict[int, str]:
    """Each slot's /metrics text, fetched concurrently; a child that fails or does not answer
    within FETCH_TIMEOUT_S (stopped, stuck, just exited) is logged and left out."""
    ports = {slot: port for slot, port in targets.items() if port is not None}
    if not ports:
        return {}
    pool = ThreadPoolExecutor(len(ports), thread_name_prefix="pool-metrics")
    try:
        futures = {pool.submit(_fetch, port): slot for slot, port in ports.items()}
        done, _ = wait(futures, timeout=FETCH_TIMEOUT_S)
    finally:  # a fetch still running ends at its own socket timeout: the scrape does not wait
        pool.shutdown(wait=False, cancel_futures=True)
    texts = {}
    for future, slot in futures.items():
        error = future.exception() if future in done else "no answer"
        if error is None:
            texts[slot] = future.result()
        else:
            log.warning("metrics of worker process %d left out of this scrape: %s",
                        slot + 1, error)  # fmt: skip
    return texts


def _fetch(port: int) -> str:
    url = f"http://127.0.0.1:{port}/metrics"
    with _OPENER.open(url, timeout=FETCH_TIMEOUT_S) as resp:
        return str(resp.read().decode())


def relabel_merge(
    texts: Mapping[int, str], carry: Carry | None = None, idle: Collection[int] = ()
) -> list[Metric]:
    """Each slot's exposition text parsed (its carry added; an `idle` slot without a text:
    its carry alone), every sample labelled
    process="<slot>", the families
    of one name merged into one (the first slot's help and type); a QUEUE_LEVEL family is the
    lowest slot's with samples, unlabelled. A text that does not parse, or
    a family whose type differs from the first one of its name (a process on other code during a
    reload), is left out rather than mixed in: the exposition must stay valid."""
    merged: dict[str, Metric] = {}
    quiet = () if carry is None else [s for s in idle if s not in texts]
    for slot in sorted({*texts, *quiet}):
        try:
            families = list(text_string_to_metric_families(texts.get(slot, "")))
        except ValueError as exc:
            log.warning("metrics of worker process %d unreadable: %s", slot + 1, exc)
            continue
        if carry is not None:
            families = carry.apply(slot, families)
        for fam in families:
            if fam.name in QUEUE_LEVEL:
                into = merged.get(fam.name)
                if into is None or (not into.samples and fam.samples):
                    merged[fam.name] = fam
                continue
            samples = [_relabel(s, str(slot)) for s in fam.samples]
            into = merged.setdefault(fam.name, fam)
            if into is fam:
                fam.samples = samples
            elif into.type == fam.type:
                into.samples += samples
    return list(merged.values())


def _relabel(sample: Sample, slot: str) -> Sample:
    """The sample with process="<slot>". A `process` label of the child's own (a collector of
    the user's, say) is neither overwritten nor overwrites ours: it is kept as
    `exported_process`, as Prometheus itself keeps a label that clashes with a target label
    (honor_labels: false), prefixed again while that name is taken too."""
    labels = dict(sample.labels)
    if LABEL in labels:
        kept = "exported_" + LABEL
        while kept in labels:
            kept = "exported_" + kept
        labels[kept] = labels.pop(LABEL)
    labels[LABEL] = slot
    return sample._replace(labels=labels)
