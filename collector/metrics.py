"""The collector's own metrics, in a registry per Collector instance.

A dedicated CollectorRegistry (not prometheus_client's global one) lets tests and
benches run several collectors in one process. Every name starts with
`fabricscope_collector_`; the `reason` label takes values from the bounded set
in fabricscope.collector.validate.REASONS.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

P = "fabricscope_collector_"


class CollectorMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.batches_received = Counter(P + "batches_received", "batches received", registry=r)
        self.records_received = Counter(P + "records_received", "records received", registry=r)
        self.records_written = Counter(
            P + "records_written", "records the sink accepted (incl. agent_loss records "
            "made by the collector)", registry=r)
        self.records_rejected = Counter(
            P + "records_rejected", "records refused, by reason (counted when the batch is "
            "acknowledged, so a batch answered RETRY counts nothing)", ["reason"], registry=r)
        self.batches_acked = Counter(P + "batches_acked", "acks sent, by status", ["status"],
                                     registry=r)
        self.batches_duplicate = Counter(
            P + "batches_duplicate", "batches resent after an ack on the same stream (written "
            "again; InfluxDB overwrites identical points)", registry=r)
        self.messages_oversized = Counter(
            P + "messages_oversized", "gRPC messages over max_message_bytes (stream ended "
            "with RESOURCE_EXHAUSTED)", registry=r)
        self.messages_undecodable = Counter(
            P + "messages_undecodable", "gRPC messages that are not a Batch (stream ended "
            "with INVALID_ARGUMENT)", registry=r)
        self.sink_write_seconds = Histogram(
            P + "sink_write_seconds", "time to write one batch to the sink", registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.sink_errors = Counter(P + "sink_errors", "failed sink writes, by kind "
                                   "(temporary: answered RETRY; rejected: refused for good)",
                                   ["kind"], registry=r)
        self.bytes_received = Counter(
            P + "received_bytes", "serialized Batch bytes received (before gRPC "
            "decompression, i.e. protobuf size; wire bytes are smaller with gzip)", registry=r)
        self.records_acked = Counter(
            P + "records_acked", "records of batches answered OK (written or spooled)",
            registry=r)
        self.records_spooled = Counter(
            P + "records_spooled", "lines fsynced to the collector's spool because the sink "
            "was failing (acknowledged; replayed later)", registry=r)
        self.records_replayed = Counter(
            P + "records_replayed", "spooled lines written to the sink (or refused by it) "
            "and removed from the spool", registry=r)
        self.records_dropped = Counter(
            P + "records_dropped", "records the collector lost after acknowledging them, by "
            "reason (spool_corrupt: unreadable spool entry)", ["reason"], registry=r)
        self.batches_throttled = Counter(
            P + "batches_throttled", "batches answered RETRY with retry_after_ms to slow "
            "agents down, by reason (spool_full, spool_error, sink_down)", ["reason"],
            registry=r)
        self.spool_bytes = Gauge(P + "spool_bytes", "payload bytes in the spool", registry=r)
        self.spool_entries = Gauge(P + "spool_entries", "entries (batches) in the spool",
                                   registry=r)
        self.spool_oldest_age = Gauge(
            P + "spool_oldest_age_seconds", "age of the oldest spooled entry: how far InfluxDB "
            "lags behind what was acknowledged (0: spool empty)", registry=r)
        self.auth_failures = Counter(
            P + "auth_failures", "streams refused, by reason (no_token, bad_token: "
            "UNAUTHENTICATED; node_mismatch: PERMISSION_DENIED)", ["reason"], registry=r)
        self.agent_lag = Gauge(
            P + "agent_lag_seconds", "collector clock minus the latest record timestamp of "
            "the node's last batch (how stale its data arrives)", ["node"], registry=r)
        self.agents_connected = Gauge(P + "agents_connected", "open agent streams", registry=r)
        self.agent_last_seen = Gauge(P + "agent_last_seen_timestamp_seconds",
                                     "UNIX time of the last batch from a node", ["node"],
                                     registry=r)
        self.agent_dropped = Gauge(P + "agent_dropped_records", "records the node's agent "
                                   "reports lost (cumulative, from batch.dropped_before)",
                                   ["node"], registry=r)
        for reason in ("no_token", "bad_token", "node_mismatch"):
            self.auth_failures.labels(reason)
        for reason in ("spool_full", "spool_error", "sink_down"):
            self.batches_throttled.labels(reason)
        self.records_dropped.labels("spool_corrupt")
