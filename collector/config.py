"""Collector configuration (see fabricscope.config for how it is loaded)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fabricscope.config import doc
from fabricscope.errors import UserError


@dataclass
class CollectorConfig:
    """Configuration of the central collector (`fabricscope collector`)."""

    listen: str = field(default="0.0.0.0:9470", metadata=doc("gRPC listen address host:port"))
    influx_url: str = field(default="http://127.0.0.1:8086", metadata=doc("InfluxDB base URL"))
    influx_api: str = field(default="v1", metadata=doc(
        "InfluxDB write API: v1 (/write, InfluxDB 1.x) or v2 (/api/v2/write through "
        "influxdb-client: InfluxDB 2.x/3.x, 1.8+, VictoriaMetrics)", choices=["v1", "v2"]))
    influx_db: str = field(default="fabricscope", metadata=doc(
        "v1: database (created when missing); v2: bucket"))
    influx_org: str = field(default="fabricscope", metadata=doc("v2: organization"))
    influx_token: str = field(default="", metadata=doc("v2: API token (never logged)"))
    influx_timeout_s: float = field(default=10.0, metadata=doc(
        "timeout of one InfluxDB request; a timed-out write is answered RETRY"))
    influx_batch_lines: int = field(default=5000, metadata=doc(
        "most lines in one InfluxDB write request (InfluxDB advises ~5000)"))
    influx_retries: int = field(default=2, metadata=doc(
        "immediate retries of a failed InfluxDB request (after 0.1 s, 0.2 s, ...) before the "
        "batch is spooled or answered RETRY"))
    influx_writers: int = field(default=4, metadata=doc(
        "concurrent InfluxDB write requests; the lines of concurrent agent streams are "
        "merged into requests of up to influx_batch_lines"))
    max_message_bytes: int = field(default=16 * 1024 * 1024, metadata=doc(
        "largest gRPC message accepted; larger ones end the stream with RESOURCE_EXHAUSTED "
        "and are counted (gRPC itself refuses those over twice this size)"))
    max_future_s: float = field(default=3600.0, metadata=doc(
        "records timestamped further ahead of the collector's clock are rejected"))
    max_age_s: float = field(default=7 * 86400.0, metadata=doc(
        "records older than this are rejected"))
    spool_dir: str = field(default="", metadata=doc(
        "directory of the disk spool: while InfluxDB fails, accepted batches are fsynced "
        "here, acknowledged, and replayed when it is back (durable at-least-once); one "
        "directory per replica, on a persistent volume; empty: no spool, batches are "
        "answered RETRY and stay in the agents' spools"))
    spool_max_bytes: int = field(default=1024 * 1024 * 1024, metadata=doc(
        "cap of the spool (gzipped line protocol); when full, agents are told to slow down "
        "(RETRY with retry_after_ms)"))
    retry_after_s: float = field(default=2.0, metadata=doc(
        "how long an agent told to slow down (RETRY) waits before sending again"))
    tokens_file: str = field(default="", metadata=doc(
        "YAML file mapping agent bearer tokens to node names (token: node); set: every "
        "stream must present a known token (else UNAUTHENTICATED) and send only its node's "
        "batches (else PERMISSION_DENIED); empty: no authentication (logged at start)"))
    tls_cert: str = field(default="", metadata=doc(
        "PEM server certificate; set with tls_key: the gRPC port speaks TLS"))
    tls_key: str = field(default="", metadata=doc("PEM private key of tls_cert (never logged)"))
    tls_client_ca: str = field(default="", metadata=doc(
        "PEM CA bundle; set: mutual TLS, agents must present a certificate it signed"))
    max_streams: int = field(default=20000, metadata=doc(
        "most concurrent agent streams; beyond, new streams get RESOURCE_EXHAUSTED"))
    max_connection_age_s: float = field(default=1800.0, metadata=doc(
        "gRPC closes a connection after this long (agents reconnect, resending unacknowledged "
        "batches), so long-lived streams rebalance across replicas; 0: never"))
    metrics_host: str = field(default="0.0.0.0", metadata=doc("address for /metrics and /readyz"))
    metrics_port: int = field(default=9472, metadata=doc("port for /metrics and /readyz; 0 picks one"))
    diagnosis: bool = field(default=True, metadata=doc(
        "run the diagnosis engine: every diagnosis_interval_s it reads the jobs this replica "
        "owns back from InfluxDB (InfluxQL on influx_url; 2.x needs its v1 compatibility "
        "API and a DBRP mapping for the bucket), writes findings and exports them"))
    job_class: bool = field(default=True, metadata=doc(
        "with diagnosis: classify each owned job from its gloo_collective and "
        "ncclprof_collective rows every 10 s (data_parallel, sharded, moe_alltoall, "
        "pipeline, inference, mixed) and write a job_class point when the class changes and every 30 s (diagnosis/jobclass.py)"))
    diagnosis_interval_s: float = field(default=1.0, metadata=doc(
        "seconds between two evaluations of every owned job; they run 0.5 s after each "
        "multiple of it on the wall clock, once the agents' batches of the second "
        "before have landed (fabricscope/cadence.py)"))
    replica_id: str = field(default="", metadata=doc(
        "this replica's name among the collectors sharing the jobs (heartbeats, "
        "ownership); empty: host name and gRPC port"))
    topology_file: str = field(default="", metadata=doc(
        "YAML file naming each node's top-of-rack switch (fabricscope/topology.py; in "
        "production generated from node labels), so findings can be placed on a ToR's "
        "uplink; empty: nodes' ToRs unknown, findings placed on nodes"))

    def check(self) -> None:
        self.listen_host_port()
        if self.influx_api not in ("v1", "v2"):
            raise UserError(f"influx_api must be v1 or v2, not {self.influx_api!r}",
                            "use --influx-api v1 for InfluxDB 1.x")
        if not self.influx_url.startswith(("http://", "https://")):
            raise UserError(f"influx_url {self.influx_url!r} is not an http(s) URL",
                            "give e.g. http://127.0.0.1:8086")
        if not self.influx_db:
            raise UserError("influx_db is empty", "name a database (v1) or bucket (v2)")
        positive = {"influx_timeout_s": self.influx_timeout_s,
                    "influx_batch_lines": self.influx_batch_lines,
                    "max_message_bytes": self.max_message_bytes,
                    "max_future_s": self.max_future_s, "max_age_s": self.max_age_s,
                    "spool_max_bytes": self.spool_max_bytes, "retry_after_s": self.retry_after_s,
                    "max_streams": self.max_streams, "influx_writers": self.influx_writers}
        for name, value in positive.items():
            if value <= 0:
                raise UserError(f"{name} must be positive, not {value!r}",
                                f"set --{name.replace('_', '-')} to a positive number")
        if self.influx_retries < 0:
            raise UserError("influx_retries must not be negative", "use 0 for no retries")
        if self.max_connection_age_s < 0:
            raise UserError("max_connection_age_s must not be negative", "use 0 to disable")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise UserError("tls_cert and tls_key must be given together",
                            "set both --tls-cert and --tls-key, or neither")
        if self.tls_client_ca and not self.tls_cert:
            raise UserError("tls_client_ca needs tls_cert and tls_key (mutual TLS is TLS)",
                            "set --tls-cert and --tls-key too")
        if self.diagnosis_interval_s <= 0:
            raise UserError("diagnosis_interval_s must be positive",
                            "set --diagnosis-interval-s to e.g. 1")
        if not 0 <= self.metrics_port <= 65535:
            raise UserError(f"metrics_port {self.metrics_port} is not a port",
                            "use 0..65535 (0 picks a free one)")

    def listen_host_port(self) -> tuple[str, int]:
        """('host', port) of `listen`; IPv6 hosts may be bracketed: [::]:9470."""
        host, _, port = self.listen.rpartition(":")
        try:
            number = int(port)
        except ValueError:
            number = -1
        if not host or not 0 <= number <= 65535:
            raise UserError(f"listen address {self.listen!r} is not host:port",
                            "give e.g. 0.0.0.0:9470 (port 0 picks a free one)")
        return host, number
