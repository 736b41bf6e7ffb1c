"""The collector's own metrics, in a registry per Collector instance.

A dedicated CollectorRegistry (not prometheus_client's global one) lets tests and
benches run several collectors in one process. Every name starts with
`fabricscope_collector_`; the `reason` label takes values from the bounded set
in collector.validate.REASONS.
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
            P + "batches_duplicate", "batches resent after an ack (written again; InfluxDB "
            "overwrites identical points)", registry=r)
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
        self.agents_connected = Gauge(P + "agents_connected", "open agent streams", registry=r)
        self.agent_last_seen = Gauge(P + "agent_last_seen_timestamp_seconds",
                                     "UNIX time of the last batch from a node", ["node"],
                                     registry=r)
        self.agent_dropped = Gauge(P + "agent_dropped_records", "records the node's agent "
                                   "reports lost (cumulative, from batch.dropped_before)",
                                   ["node"], registry=r)
