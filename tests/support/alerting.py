"""Test parts for the alerting pipeline: what pages go to, and what they come from
(test support; not part of the product).

`WebhookReceiver` is where Alertmanager delivers (its webhook JSON, version 4),
recorded with the time each POST arrived. `alerting_pipeline(scrape)` runs the
whole paging path on loopback: a real Prometheus scraping `scrape` every second
and evaluating the generated rules (deploy/prometheus/fabricscope-alerts.yaml), a
real Alertmanager with the example's routes and inhibitions at timings of seconds
(config_for_tests), delivering to a WebhookReceiver.
`FabricExporter` serves on /metrics what a collector replica exports for the
rules: the finding and job gauges of surface/metrics.py, set by the test. It
stands in for the diagnosis engine, which sets them in the collector (the
contract is the names, labels and meanings in surface/metrics.py); a test of a
real lab scrapes the collector instead (tests/kernel/test_alerting_lab.py).
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from tests.support.servers import AlertmanagerServer, PrometheusServer
from fabricscope.surface.alerting.alertmanager import example
from fabricscope.surface.alerting.generate import PROMETHEUS_DIR, ROOT
from fabricscope.surface.metrics import (FINDING_ACTIVE, FINDING_LABELS, JOB_GRAD_SYNC_SLOWDOWN, JOB_JITTER,
                             JOB_JITTER_BASELINE, JOB_RETRANSMIT_AMPLIFICATION,
                             JOB_RETRANSMIT_RATIO, JOB_STEP)
from fabricscope.surface.alerting.promql import FindingSeries
from fabricscope.surface.alerting.rules import RULES_FILE

#: the generated rules, as deployed
RULES = ROOT / PROMETHEUS_DIR / RULES_FILE
_TIMINGS = ("group_wait", "group_interval", "repeat_interval")


def config_for_tests(webhook_url: str, group_wait: str = "1s", group_interval: str = "1s",
                     repeat_interval: str = "1h") -> dict:
    """The example's routes and inhibitions (surface/alerting/alertmanager.py), delivering
    to `webhook_url`/<receiver> with timings of seconds (a test waits for notifications,
    not minutes)."""
    config = copy.deepcopy(example())
    _set_timings(config["route"], {"group_wait": group_wait, "group_interval": group_interval,
                                   "repeat_interval": repeat_interval})
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"{webhook_url.rstrip('/')}/{receiver['name']}"
    return config


def _set_timings(route: dict, timings: dict[str, str]) -> None:
    for key in _TIMINGS:
        if key in route:
            route[key] = timings[key]
    for child in route.get("routes", []):
        _set_timings(child, timings)


@dataclass
class Notification:
    """One webhook POST of Alertmanager."""

    received_at: float          # time.monotonic() when it arrived
    receiver: str
    status: str                 # of the group: firing while any of its alerts fires
    alerts: list[dict]          # {status, labels, annotations, startsAt, endsAt, ...}

    def alerts_of(self, alertname: str, status: str = "firing", **labels: str) -> list[dict]:
        """Its alerts of that name and status whose labels include `labels`."""
        return [a for a in self.alerts
                if a["status"] == status and a["labels"].get("alertname") == alertname
                and all(a["labels"].get(k) == v for k, v in labels.items())]


class WebhookReceiver:
    """An HTTP server on 127.0.0.1 (a thread) recording Alertmanager's notifications.

    with WebhookReceiver() as hook:
        ... point a webhook_config at hook.url ...
        note = hook.wait_for(lambda n: n.alerts_of("FabricscopeLossyLink"), timeout_s=60)
    """

    def __init__(self) -> None:
        self.notifications: list[Notification] = []
        self.malformed = 0              # POSTs that were not webhook JSON
        self._changed = threading.Condition()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def start(self) -> "WebhookReceiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver._record(body)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:     # quiet: tests print what matters
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="webhook-receiver")
        self._thread.start()
        return self

    def _record(self, body: bytes) -> None:
        arrived = time.monotonic()
        try:
            doc = json.loads(body)
            note = Notification(arrived, doc["receiver"], doc["status"], list(doc["alerts"]))
        except (ValueError, KeyError, TypeError):
            with self._changed:
                self.malformed += 1
            return
        with self._changed:
            self.notifications.append(note)
            self._changed.notify_all()

    def matching(self, predicate: Callable[[Notification], object]) -> list[Notification]:
        with self._changed:
            return [n for n in self.notifications if predicate(n)]

    def wait_for(self, predicate: Callable[[Notification], object],
                 timeout_s: float = 60.0) -> Notification:
        """The first notification (received or to come) for which predicate is truthy.
        Raises TimeoutError listing what did arrive."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for note in self.notifications:
                    if predicate(note):
                        return note
                left = deadline - time.monotonic()
                if left <= 0:
                    got = [(n.receiver, n.status, [a["labels"].get("alertname") for a in n.alerts])
                           for n in self.notifications]
                    raise TimeoutError(f"no such notification in {timeout_s:.0f} s; got {got}")
                self._changed.wait(left)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)
            self._server = None

    def __enter__(self) -> "WebhookReceiver":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def alerts_in(alertname: str, status: str = "firing", **labels: str):
    """A predicate for WebhookReceiver.wait_for: a notification carrying such an alert."""
    return lambda note: note.alerts_of(alertname, status, **labels)


@dataclass
class AlertingPipeline:
    hook: WebhookReceiver
    prom: PrometheusServer
    am: AlertmanagerServer

    def pages(self) -> set[tuple[str, str, str]]:
        """(alertname, job, status) of every alert delivered so far"""
        return {(a["labels"]["alertname"], a["labels"].get("job", ""), a["status"])
                for n in self.hook.matching(lambda n: True) for a in n.alerts}


@contextlib.contextmanager
def alerting_pipeline(scrape: dict[str, list[str]]) -> Iterator[AlertingPipeline]:
    """Prometheus scraping `scrape` (scrape job -> ["host:port"], honor_labels, every
    second) with the generated rules, Alertmanager with the test config, and the
    webhook receiver they page; yielded once Prometheus scraped every target.
    Everything is stopped on exit, also when the block raises."""
    targets = sum(len(t) for t in scrape.values())
    with WebhookReceiver() as hook, AlertmanagerServer(config_for_tests(hook.url)) as am, \
            PrometheusServer(scrape, [RULES], [am.target]) as prom:
        jobs = "|".join(scrape)
        prom.wait_for(lambda p: len(p.query(f'up{{job=~"{jobs}"}} == 1')) == targets,
                      what=f"a scrape of all {targets} targets")
        yield AlertingPipeline(hook, prom, am)


_JOB_HELP = {
    JOB_STEP: "median step time over the last 10 steps",
    JOB_JITTER: "median absolute deviation of the last 10 step times",
    JOB_JITTER_BASELINE: "the same over the job's first steps",
    JOB_GRAD_SYNC_SLOWDOWN: "grad-sync time now / the job's baseline",
    JOB_RETRANSMIT_RATIO: "segments retransmitted / sent, last 10 s",
    JOB_RETRANSMIT_AMPLIFICATION: "(grad_sync_slowdown - 1) / retransmit_ratio",
}


class FabricExporter:
    """A collector replica's finding and job gauges on 127.0.0.1:<free port>/metrics,
    set by the test (prometheus_client, as the collector's own /metrics)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._finding = Gauge(FINDING_ACTIVE, "1 while a finding is open", FINDING_LABELS,
                              registry=self.registry)
        self._job = {name: Gauge(name, doc, ["job"], registry=self.registry)
                     for name, doc in _JOB_HELP.items()}
        self._open: dict[str, tuple[str, ...]] = {}       # finding id -> label values
        self._server = None
        self._thread = None

    @property
    def target(self) -> str:
        """host:port, as a scrape config names it."""
        return f"127.0.0.1:{self._server.server_port}"

    def open_finding(self, finding: FindingSeries) -> float:
        """Export the finding as open; time.monotonic() when it was set."""
        values = tuple(getattr(finding, k) for k in FINDING_LABELS)
        self._finding.labels(*values).set(1)
        self._open[finding.id] = values
        return time.monotonic()

    def close_finding(self, finding_id: str) -> float:
        """Drop the finding's series (the engine closed it); when it was dropped."""
        self._finding.remove(*self._open.pop(finding_id))
        return time.monotonic()

    def set_job(self, job: str, step_s: float, jitter_s: float, baseline_s: float,
                grad_sync_slowdown: float = 1.0, retransmit_ratio: float = 0.0,
                amplification: float = 0.0) -> None:
        values = {JOB_STEP: step_s, JOB_JITTER: jitter_s, JOB_JITTER_BASELINE: baseline_s,
                  JOB_GRAD_SYNC_SLOWDOWN: grad_sync_slowdown,
                  JOB_RETRANSMIT_RATIO: retransmit_ratio,
                  JOB_RETRANSMIT_AMPLIFICATION: amplification}
        for name, value in values.items():
            self._job[name].labels(job).set(value)

    def grow_jitter(self, job: str, from_s: float, per_s: float) -> float:
        """From now on the job's jitter grows by per_s every second (read at each scrape,
        as a job whose steps get less regular step by step); when it started."""
        start = time.monotonic()
        self._job[JOB_JITTER].labels(job).set_function(
            lambda: from_s + per_s * (time.monotonic() - start))
        return start

    def start(self) -> "FabricExporter":
        self._server, self._thread = start_http_server(0, "127.0.0.1", self.registry)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)
            self._server = None

    def __enter__(self) -> "FabricExporter":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
