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
    kernel_headers: str = field(default="", metadata=doc(
        "kernel headers directory for BCC; empty: the running kernel's, else the "
        "distribution's linux-headers package"))
    poll_interval_s: float = field(default=0.2, metadata=doc(
        "how often probes are drained into records"))
    batch_max_records: int = field(default=5000, metadata=doc("most records in one batch"))
    flush_interval_s: float = field(default=1.0, metadata=doc(
        "longest time a record waits before its batch is sent"))
    metrics_host: str = field(default="0.0.0.0", metadata=doc("address for /metrics and /readyz"))
    metrics_port: int = field(default=9471, metadata=doc("port for /metrics and /readyz; 0 picks one"))

    def check(self) -> None:
        if self.output not in ("none", "jsonl"):
            raise UserError(f"--output must be jsonl or none, not {self.output!r}",
                            "use --output jsonl")
        if self.collector and ":" not in self.collector:
            raise UserError(f"collector address {self.collector!r} has no port",
                            "give host:port, e.g. --collector 198.18.0.254:9470")
        if self.batch_max_records < 1 or self.flush_interval_s <= 0 or self.poll_interval_s <= 0:
            raise UserError("batch size and intervals must be positive", "see docs/config.md")
