"""Prometheus, Alertmanager and VictoriaMetrics for the tests, on loopback: the
distribution's binaries, each with its state in a fresh temporary directory, started
and stopped as fabricscope.services.InfluxServer is (LocalServer). The product runs
none of them itself; tests start them to check the rules, boards and sinks against
the real servers."""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

from fabricscope.services import LocalServer, http_get

VICTORIA_METRICS = "/usr/bin/victoria-metrics"
PROMETHEUS = "/usr/bin/prometheus"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"


class VictoriaMetricsServer(LocalServer):
    """VictoriaMetrics single node; accepts InfluxDB line protocol (/write, /api/v2/write)."""

    name = "victoria-metrics"
    binary = VICTORIA_METRICS

    def _argv(self) -> list[str]:
        return [self.binary, f"-httpListenAddr=127.0.0.1:{self.port}",
                f"-storageDataPath={self.dir / 'data'}", "-loggerLevel=ERROR",
                # Points become searchable without waiting for the periodic flush.
                "-search.latencyOffset=0s", "-search.disableCache"]

    def _is_up(self) -> bool:
        return http_get(self.url + "/health", timeout=1.0)[0] == 200

    def export(self, match: str = '{__name__!=""}') -> list[dict]:
        """All series matching `match` from /api/v1/export: [{metric, values, timestamps}].

        VictoriaMetrics names an Influx field `<measurement>_<field>` and keeps ms
        timestamps. Recently written points appear after its in-memory flush, so
        callers poll (see `wait_export`)."""
        status, body = http_get(f"{self.url}/api/v1/export?"
                                + urllib.parse.urlencode({"match[]": match}))
        if status != 200:
            raise RuntimeError(f"export {match!r} failed: {status} {body[:200]!r}")
        return [json.loads(line) for line in body.splitlines() if line.strip()]

    def wait_export(self, match: str, count: int = 1, timeout_s: float = 30.0) -> list[dict]:
        """Poll export until at least `count` series match (deadline, not a fixed sleep)."""
        deadline = time.monotonic() + timeout_s
        while True:
            # Forces in-memory rows into searchable parts (a debug endpoint, meant for tests).
            http_get(f"{self.url}/internal/force_flush")
            rows = self.export(match)
            if len(rows) >= count or time.monotonic() > deadline:
                return rows
            time.sleep(0.1)


def _get_json(url: str):
    """GET url, parsed JSON; RuntimeError unless 200."""
    status, body = http_get(url)
    if status != 200:
        raise RuntimeError(f"GET {url} failed: {status} {body[:200]!r}")
    return json.loads(body)


class PrometheusServer(LocalServer):
    """Prometheus scraping `scrape` (scrape job -> ["host:port", ...]) and evaluating
    `rule_files` every `interval`, sending alerts to `alertmanagers` ("host:port").

    Targets are scraped with honor_labels, as fabricscope's collectors are (their
    `job` label is the training job's). Seconds, not Prometheus' default minute, so
    a test sees a fault page within seconds."""

    name = "prometheus"
    binary = PROMETHEUS

    def __init__(self, scrape: dict[str, list[str]], rule_files: Sequence[Path] = (),
                 alertmanagers: Sequence[str] = (), interval: str = "1s",
                 port: int | None = None):
        super().__init__(port)
        self.scrape = {job: list(targets) for job, targets in scrape.items()}
        self.rule_files = [Path(f).resolve() for f in rule_files]
        self.alertmanagers = list(alertmanagers)
        self.interval = interval

    def _prepare(self) -> None:
        config = {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval,
                       "scrape_timeout": self.interval},
            "rule_files": [str(f) for f in self.rule_files],
            "scrape_configs": [{"job_name": job, "honor_labels": True,
                                "static_configs": [{"targets": targets}]}
                               for job, targets in self.scrape.items()],
        }
        if self.alertmanagers:
            config["alerting"] = {"alertmanagers": [
                {"static_configs": [{"targets": self.alertmanagers}]}]}
        (self.dir / "prometheus.yml").write_text(json.dumps(config, indent=1))

    def _argv(self) -> list[str]:
        return [self.binary, f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"]

    def _is_up(self) -> bool:
        return http_get(self.url + "/-/ready", timeout=1.0)[0] == 200

    def query(self, promql: str) -> list[dict]:
        """An instant query's result: [{"metric": {...}, "value": [t, "v"]}, ...]."""
        data = _get_json(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
        return data["data"]["result"]

    def alerts(self) -> list[dict]:
        """Active alerts (pending and firing): [{"labels", "annotations", "state"}, ...]."""
        return _get_json(f"{self.url}/api/v1/alerts")["data"]["alerts"]

    def wait_for(self, predicate, timeout_s: float = 60.0, what: str = "a condition"):
        """Poll the API (every 0.2 s) until predicate(self) is truthy; its value.
        Raises TimeoutError after timeout_s, naming `what`."""
        deadline = time.monotonic() + timeout_s
        while True:
            if result := predicate(self):
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"prometheus: no {what} after {timeout_s:.0f} s")
            time.sleep(0.2)


class AlertmanagerServer(LocalServer):
    """Alertmanager with `config` (the alertmanager.yml document, as a dict), clustering
    off (`--cluster.listen-address=` empty: one instance, no gossip port)."""

    name = "alertmanager"
    binary = ALERTMANAGER

    def __init__(self, config: dict, port: int | None = None):
        super().__init__(port)
        self.config = config

    @property
    def target(self) -> str:
        """host:port, as Prometheus' alerting config names it."""
        return f"127.0.0.1:{self.port}"

    def _prepare(self) -> None:
        (self.dir / "alertmanager.yml").write_text(json.dumps(self.config, indent=1))

    def _argv(self) -> list[str]:
        return [self.binary, f"--config.file={self.dir / 'alertmanager.yml'}",
                f"--storage.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address=",
                "--log.level=warn"]

    def _is_up(self) -> bool:
        return http_get(self.url + "/-/ready", timeout=1.0)[0] == 200

    def alerts(self) -> list[dict]:
        """The alerts it holds: [{"labels", "status": {"state", "inhibitedBy", ...}}, ...]."""
        return _get_json(self.url + "/api/v2/alerts")
