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
    max_message_bytes: int = field(default=16 * 1024 * 1024, metadata=doc(
        "largest gRPC message accepted; larger ones are rejected and counted"))
    metrics_host: str = field(default="0.0.0.0", metadata=doc("address for /metrics and /readyz"))
    metrics_port: int = field(default=9472, metadata=doc("port for /metrics and /readyz; 0 picks one"))

    def check(self) -> None:
        if ":" not in self.listen:
            raise UserError(f"listen address {self.listen!r} has no port", "give host:port")
        if self.influx_api not in ("v1", "v2"):
            raise UserError(f"influx_api must be v1 or v2, not {self.influx_api!r}",
                            "use --influx-api v1 for InfluxDB 1.x")
