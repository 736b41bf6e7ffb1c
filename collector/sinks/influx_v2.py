"""InfluxDB API v2 sink (/api/v2/write) through influxdb-client's synchronous WriteApi.

Speaks to InfluxDB 2.x/3.x, 1.8+ (`bucket` = database/retention-policy) and
VictoriaMetrics. The bucket must exist (creating one needs an org id and admin
rights the collector should not hold). Lines come pre-encoded by
fabricscope.lineproto, so the client only gzips (unless the server is on this host,
as in the v1 sink) and sends them. Status mapping
as in the v1 sink: 400 (and 422, used by InfluxDB 3 for bad points) is
permanent, anything else and network failures are temporary.
"""

from __future__ import annotations

from influxdb_client import InfluxDBClient, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS
from influxdb_client.rest import ApiException

from fabricscope.collector.sinks.base import Sink, SinkError, SinkRejected, unreachable
from fabricscope.collector.sinks.http import Http, on_loopback, reason
from fabricscope.collector.sinks.influx_v1 import influx_error


class InfluxV2Sink(Sink):
    def __init__(self, config):
        super().__init__(config)
        self._client = InfluxDBClient(url=self.url, token=config.influx_token or None,
                                      org=config.influx_org,
                                      timeout=int(config.influx_timeout_s * 1000),
                                      enable_gzip=not on_loopback(self.url))
        self._api = self._client.write_api(write_options=SYNCHRONOUS)
        self._http = Http(config.influx_timeout_s)

    def _start_sync(self) -> None:
        headers = {"Authorization": f"Token {self.config.influx_token}"} \
            if self.config.influx_token else {}
        try:
            status, _ = self._http.request("GET", self.url + "/ping", headers=headers)
        except SinkError as exc:
            raise unreachable(self.url, str(exc)) from None
        if status not in (200, 204):
            raise unreachable(self.url, f"/ping answered HTTP {status}")

    def _write_sync(self, lines: list[str]) -> None:
        try:
            self._api.write(bucket=self.config.influx_db, org=self.config.influx_org,
                            record=lines, write_precision=WritePrecision.NS)
        except ApiException as exc:
            text = f"InfluxDB answered HTTP {exc.status}: {influx_error(exc.body or b'')}"
            if exc.status in (400, 422):
                raise SinkRejected(text, len(lines)) from None
            raise SinkError(text) from None
        except Exception as exc:  # urllib3 raises its own hierarchy for network failures
            raise SinkError(reason(exc)) from None

    def _close_sync(self) -> None:
        self._client.close()
        self._http.close()
