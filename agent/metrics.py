"""The agent's self-metrics (all prefixed fabricscope_agent_), on its own registry.

A registry per agent instance (not prometheus_client's global one) so that tests
can run several agents in one process. Probe counters (Probe.stats()) are
snapshotted by the poll stage and exported at scrape time: `lost` as
events_lost_total{probe}, everything else as probe_events_total{probe,event}.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily

P = "fabricscope_agent_"


class _ProbeStats:
    """Custom collector over the latest Probe.stats() snapshots."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self._lock = threading.Lock()
        self._snap: dict[str, dict[str, int]] = {}
        self._taken: dict[str, float] = {}
        self.interval_s = interval_s

    def due(self, probe: str, now: float) -> bool:
        """Time for a new snapshot of this probe? (Reading a probe's counters costs map
        reads and syscalls; once a second is plenty for a scrape every few seconds.)"""
        return now - self._taken.get(probe, float("-inf")) >= self.interval_s

    def update(self, probe: str, stats: dict[str, int], now: float | None = None) -> None:
        with self._lock:
            self._snap[probe] = dict(stats)
            if now is not None:
                self._taken[probe] = now

    def keep_last(self, probe: str, stats: dict[str, int], now: float | None = None) -> None:
        """update(), keeping the counters the new snapshot lacks at their last values:
        a probe that has freed its BPF maps (detach) reads only its own counters, and the
        kernel's (lost, filtered, ...) stand as they were read before it."""
        with self._lock:
            kept = self._snap.get(probe, {})
        self.update(probe, {**kept, **stats}, now)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._snap)

    def get(self, probe: str) -> dict[str, int]:
        with self._lock:
            return dict(self._snap.get(probe, {}))

    def collect(self):
        with self._lock:
            snap = {k: dict(v) for k, v in self._snap.items()}
        lost = CounterMetricFamily(P + "events_lost", "events a probe lost before user space "
                                   "(kernel ring buffer full, marker ring overwritten)",
                                   labels=["probe"])
        events = CounterMetricFamily(P + "probe_events", "probe self-observation counters "
                                     "(see each probe's docs)", labels=["probe", "event"])
        for probe, stats in sorted(snap.items()):
            lost.add_metric([probe], stats.get("lost", 0))
            for key, value in sorted(stats.items()):
                if key != "lost":
                    events.add_metric([probe, key], value)
        yield lost
        yield events


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or CollectorRegistry()
        self.records = Counter(P + "records", "records produced, by probe", ["probe"], registry=r)
        self.probe_attached = Gauge(P + "probe_attached",
                                    "1 when the probe is attached, 0 when unavailable",
                                    ["probe"], registry=r)
        self.batches_sent = Counter(P + "batches_sent", "batches written to the collector "
                                    "stream (resends included)", registry=r)
        self.batches_acked = Counter(P + "batches_acked", "acks received, by status",
                                     ["status"], registry=r)
        self.records_dropped = Counter(P + "records_dropped", "records the agent gave up on",
                                       ["reason"], registry=r)
        self.queue_records = Gauge(P + "queue_records", "records waiting for an Ack OK",
                                   registry=r)
        self.bytes_sent = Counter(P + "sent_bytes", "serialized batch bytes written to the "
                                  "collector stream, resends included (before gRPC gzip)",
                                  registry=r)
        self.records_spooled = Counter(P + "records_spooled", "records admitted to the spool "
                                       "(fsynced when spool_dir is set)", registry=r)
        self.spool_bytes = Gauge(P + "spool_bytes", "bytes of batches awaiting an Ack OK (on "
                                 "disk with spool_dir, else in memory)", registry=r)
        self.spool_batches = Gauge(P + "spool_batches", "batches awaiting an Ack OK",
                                   registry=r)
        self.oldest_pending_age = Gauge(P + "oldest_pending_age_seconds", "age of the oldest "
                                        "batch awaiting an Ack OK: the shipping lag",
                                        registry=r)
        self.collector_throttled = Counter(P + "collector_throttled", "RETRY acks with "
                                           "retry_after_ms: the collector asked to slow down",
                                           registry=r)
        self.collector_connected = Gauge(P + "collector_connected",
                                         "1 while the collector stream is up", registry=r)
        self.poll_errors = Counter(P + "poll_errors", "probe poll() calls that raised",
                                   ["probe"], registry=r)
        self.poll_seconds = Histogram(P + "poll_seconds", "time to drain all probes once",
                                      registry=r, buckets=(.0005, .001, .0025, .005, .01, .025,
                                                           .05, .1, .25, .5, 1.0))
        self.poll_failed: set[str] = set()      # probes whose failure was logged once
        self.probe_stats = _ProbeStats()
        r.register(self.probe_stats)
        for status in ("ok", "retry", "rejected"):
            self.batches_acked.labels(status)
        for reason in ("queue_full", "spool_full", "oversized", "unencodable", "spool_corrupt",
                       "rejected", "shutdown"):
            self.records_dropped.labels(reason)
