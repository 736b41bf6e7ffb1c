"""Agent configuration (see fabricscope.config for how it is loaded)."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from fabricscope.config import doc
from fabricscope.errors import UserError


@dataclass
class AgentConfig:
    """Configuration of the per-node agent (`fabricscope agent`)."""

    node: str = field(default_factory=socket.gethostname,
                      metadata=doc("node name put on every record", default_doc="<hostname>"))
    collector: str = field(default="", metadata=doc(
        "collector address host:port; empty: ship nothing (use with --output jsonl)"))
    output: str = field(default="none", metadata=doc(
        "also print every record as one JSON object per line on stdout: jsonl or none",
        choices=["none", "jsonl"]))
    probes: list[str] = field(default_factory=lambda: ["tcp_retransmit", "markers"],
                              metadata=doc("probes and sources to run",
                                           default_doc=["tcp_retransmit", "markers"]))
    addresses: list[str] = field(default_factory=list, metadata=doc(
        "IP addresses that belong to this node (events are attributed by them); "
        "empty: every address of the agent's network namespace"))
    markers_dir: str = field(default="/run/fabricscope/markers", metadata=doc(
        "directory where training processes write marker rings (FABRICSCOPE_MARKERS_DIR)"))
    nccl_paths: list[str] = field(default_factory=list, metadata=doc(
        "NCCL library files the nccl probe attaches to at start (e.g. "
        "/usr/lib/x86_64-linux-gnu/libnccl.so.2), so every call of a process started later "
        "is seen from its first one; libraries that running processes map are found "
        "without this (rescanned every 2 s)"))
    kernel_headers: str = field(default="", metadata=doc(
        "kernel headers directory for BCC; empty: the running kernel's, else the "
        "distribution's linux-headers package"))
    poll_interval_s: float = field(default=0.2, metadata=doc(
        "how often probes are drained into records"))
    batch_max_records: int = field(default=5000, metadata=doc("most records in one batch"))
    flush_interval_s: float = field(default=1.0, metadata=doc(
        "longest time a record waits before its batch is sent"))
    queue_max_records: int = field(default=200_000, metadata=doc(
        "records kept in memory until the collector acknowledges them; when full the "
        "oldest batches are dropped and counted"))
    shutdown_timeout_s: float = field(default=5.0, metadata=doc(
        "on SIGTERM/SIGINT, longest wait for queued batches to be acknowledged"))
    metrics_host: str = field(default="0.0.0.0", metadata=doc("address for /metrics and /readyz"))
    metrics_port: int = field(default=9471, metadata=doc("port for /metrics and /readyz; 0 picks one"))
    # --- probe nic (agent/probes/nic.py) ---
    interfaces: list[str] = field(default_factory=list, metadata=doc(
        "interfaces the nic probe watches (TC ingress and egress); empty: every "
        "non-loopback interface that is up in the agent's network namespace at start"))
    nic_bin_us: int = field(default=100, metadata=doc(
        "nic probe time bin in microseconds (10..10000): the resolution of rates and bursts"))
    nic_window_s: float = field(default=1.0, metadata=doc(
        "nic probe aggregation window in seconds (a multiple of the bin): one nic_window "
        "and one nic_flow record per interface, direction (and flow) per window"))
    nic_burst_threshold: float = field(default=0.5, metadata=doc(
        "utilization (0..1] of the link speed above which a bin is hot; consecutive hot "
        "bins form a burst"))
    link_speed_bps: list[str] = field(default_factory=list, metadata=doc(
        "link speeds for utilization: IF=RATE entries (e.g. eth0=25gbit) override what the "
        "kernel reports; a bare RATE is the default where the kernel reports none "
        "(built-in default 10gbit)"))
    nic_max_flows: int = field(default=8192, metadata=doc(
        "flows the nic probe tracks at once (per-CPU LRU hash; the least recently seen are "
        "evicted and counted)"))

    def check(self) -> None:
        if self.output not in ("none", "jsonl"):
            raise UserError(f"--output must be jsonl or none, not {self.output!r}",
                            "use --output jsonl")
        if self.collector and not self.collector.rpartition(":")[2].isdigit():
            raise UserError(f"collector address {self.collector!r} has no port",
                            "give host:port, e.g. --collector 198.18.0.254:9470")
        if self.batch_max_records < 1 or self.flush_interval_s <= 0 or self.poll_interval_s <= 0:
            raise UserError("batch size and intervals must be positive", "see docs/config.md")
        if self.queue_max_records < self.batch_max_records:
            raise UserError(f"queue_max_records {self.queue_max_records} is smaller than one "
                            f"batch ({self.batch_max_records})",
                            "raise --queue-max-records or lower --batch-max-records")
        if self.shutdown_timeout_s < 0:
            raise UserError("shutdown_timeout_s must not be negative", "use 0 or more")
        if not 0 <= self.metrics_port <= 65535:
            raise UserError(f"metrics port {self.metrics_port} is out of range",
                            "use 1-65535, or 0 to pick a free one")
        from agent.probes import REGISTRY
        unknown = [p for p in self.probes if p not in REGISTRY]
        if unknown or not self.probes:
            raise UserError(f"unknown probe {', '.join(unknown)!s}" if unknown
                            else "no probe enabled",
                            f"choose from {', '.join(sorted(REGISTRY))}")
        from agent.addresses import parse_addresses
        parse_addresses(self.addresses)
