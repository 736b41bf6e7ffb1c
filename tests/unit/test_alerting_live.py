"""Live: the generated rules page through a real Prometheus and a real Alertmanager.

Two exporters serve what collector replicas export for the rules (tests/support/alerting.py:
the diagnosis engine's finding and job gauges, set by the test); Prometheus scrapes
them every second and evaluates deploy/prometheus/fabricscope-alerts.yaml;
Alertmanager, configured from the example's routes and inhibitions with timings of
seconds, delivers to a webhook receiver the test runs. All at once, on loopback:
- a lossy port pages FabricscopeLossyLink with its node, and the resolved
  notification comes after the finding closes; the microburst at the same place
  comes with it, as context;
- jitter that grows step by step pages FabricscopeJitterAccumulating (the trend
  against the job's own baseline);
- a healthy job, whose only alert is an info one, pages nothing in that time.
No root needed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from fabricscope.services import pid_alive
from tests.support.servers import ALERTMANAGER, PROMETHEUS
from fabricscope.surface.alerting.alertmanager import SEVERITY_RECEIVERS
from fabricscope.surface.alerting.catalog import INFO_INHIBITOR, by_name, runbook_url
from fabricscope.surface.alerting.trend_alerts import JITTER_FLOOR_S, JITTER_RATIO, JITTER_SHARE_OF_STEP
from fabricscope.surface.metrics import COLLECTOR_SCRAPE_JOB
from fabricscope.surface.alerting.promql import FindingSeries
from fabricscope.surface.alerting.templates import render
from tests.support.alerting import (AlertingPipeline, FabricExporter, Notification, WebhookReceiver,
                                    alerting_pipeline, alerts_in)

pytestmark = [
    pytest.mark.skipif(not (os.access(PROMETHEUS, os.X_OK) and os.access(ALERTMANAGER, os.X_OK)),
                       reason=f"{PROMETHEUS} or {ALERTMANAGER} missing (make setup installs "
                              "Debian's prometheus and prometheus-alertmanager)"),
    pytest.mark.timeout(300),
]

#: generous: a page takes for (10 s or 30 s) plus a few seconds of scrape, evaluation
#: and grouping; a slow machine stretches it, and the test waits for the event
PAGE_TIMEOUT_S = 150

LOSSY = FindingSeries("lossy_link", "warning", job="j-lossy", node="node1", interface="eth0",
                      tor="tor0", rank="1", id="live00lossy1")
CONTEXT = FindingSeries("microburst", "info", job="j-lossy", node="node1", interface="eth0",
                        tor="tor0", id="live00burst1")
LONE_INFO = FindingSeries("microburst", "info", job="j-ok", node="node5", interface="eth0",
                          tor="tor1", id="live00burst2")
STEP_S, BASELINE_S, GROWTH_PER_S = 1.0, 0.02, 0.01


@dataclass
class Stack:
    alerting: AlertingPipeline
    faulty: FabricExporter          # serves jobs j-lossy and j-jitter, where the faults go
    healthy: FabricExporter         # serves job j-ok: healthy, one lone info finding

    @property
    def hook(self) -> WebhookReceiver:
        return self.alerting.hook


@pytest.fixture
def stack():
    with FabricExporter() as faulty, FabricExporter() as healthy:
        for exporter, job in ((faulty, "j-lossy"), (faulty, "j-jitter"), (healthy, "j-ok")):
            exporter.set_job(job, step_s=STEP_S, jitter_s=BASELINE_S, baseline_s=BASELINE_S)
        healthy.open_finding(LONE_INFO)
        with alerting_pipeline({COLLECTOR_SCRAPE_JOB: [faulty.target, healthy.target]}) \
                as alerting:
            servers = [alerting.prom.pid, alerting.am.pid]
            yield Stack(alerting, faulty, healthy)
    assert alerting.prom.dir is None and alerting.am.dir is None
    assert not any(pid_alive(pid) for pid in servers)


def _lossy_link_page(stack: Stack) -> Notification:
    page = stack.hook.wait_for(alerts_in("FabricscopeLossyLink", job="j-lossy"), PAGE_TIMEOUT_S)
    (alert,) = page.alerts_of("FabricscopeLossyLink", job="j-lossy")
    assert page.receiver == SEVERITY_RECEIVERS["warning"]
    assert alert["labels"] == {"alertname": "FabricscopeLossyLink", **LOSSY.labels()}
    lossy_link = by_name("FabricscopeLossyLink")
    assert alert["annotations"] == {
        "summary": "Lossy link at node1 (eth0) in job j-lossy",
        "description": render(lossy_link.description, LOSSY.labels()),
        "runbook_url": runbook_url(lossy_link)}
    # the microburst at the same place comes along, as context of the warning
    context = stack.hook.wait_for(alerts_in("FabricscopeMicroburst", job="j-lossy", node="node1"),
                                  PAGE_TIMEOUT_S)
    assert context.receiver == SEVERITY_RECEIVERS["info"]
    return page


def _resolved(stack: Stack) -> Notification:
    return stack.hook.wait_for(
        alerts_in("FabricscopeLossyLink", "resolved", job="j-lossy", node="node1"), PAGE_TIMEOUT_S)


def _jitter_page(stack: Stack) -> Notification:
    page = stack.hook.wait_for(alerts_in("FabricscopeJitterAccumulating", job="j-jitter"),
                               PAGE_TIMEOUT_S)
    (alert,) = page.alerts_of("FabricscopeJitterAccumulating", job="j-jitter")
    assert alert["labels"] == {"alertname": "FabricscopeJitterAccumulating", "job": "j-jitter",
                               "severity": "warning", "signal": "baseline_ratio"}
    assert page.receiver == SEVERITY_RECEIVERS["warning"]
    return page


def _assert_the_healthy_job_paged_nothing(stack: Stack) -> None:
    """Its info alert fires in Prometheus, and Alertmanager holds it back: nothing else
    fires for j-ok. Nothing but the faults paged at all."""
    # (the context's resolved notification may still be on its way)
    assert stack.alerting.pages() - {("FabricscopeMicroburst", "j-lossy", "resolved")} == {
        ("FabricscopeLossyLink", "j-lossy", "firing"),
        ("FabricscopeLossyLink", "j-lossy", "resolved"),
        ("FabricscopeMicroburst", "j-lossy", "firing"),
        ("FabricscopeJitterAccumulating", "j-jitter", "firing"),
    }
    held = [a for a in stack.alerting.am.alerts() if a["labels"].get("job") == "j-ok"
            and a["labels"]["alertname"] == "FabricscopeMicroburst"]
    assert [a["status"]["state"] for a in held] == ["suppressed"]
    assert held[0]["status"]["inhibitedBy"]
    assert any(a["labels"]["alertname"] == INFO_INHIBITOR.name
               and a["labels"].get("job") == "j-ok" and a["state"] == "firing"
               for a in stack.alerting.prom.alerts())
    assert stack.hook.malformed == 0


def test_faults_page_and_resolve_while_a_healthy_job_pages_nothing(stack):
    lossy_at = stack.faulty.open_finding(LOSSY)
    stack.faulty.open_finding(CONTEXT)
    jitter_at = stack.faulty.grow_jitter("j-jitter", BASELINE_S, GROWTH_PER_S)

    page = _lossy_link_page(stack)
    print(f"\nlossy link: finding set -> page {page.received_at - lossy_at:.1f} s")
    cleared_at = stack.faulty.close_finding(LOSSY.id)
    stack.faulty.close_finding(CONTEXT.id)
    resolved = _resolved(stack)
    assert resolved.received_at > cleared_at
    print(f"lossy link: finding closed -> resolved {resolved.received_at - cleared_at:.1f} s")

    jitter = _jitter_page(stack)
    threshold = max(JITTER_RATIO * max(BASELINE_S, JITTER_FLOOR_S), JITTER_SHARE_OF_STEP * STEP_S)
    crossed_at = jitter_at + (threshold - BASELINE_S) / GROWTH_PER_S
    print(f"jitter: growth start -> page {jitter.received_at - jitter_at:.1f} s (over the "
          f"threshold -> page {jitter.received_at - crossed_at:.1f} s; the rule waits 30 s)")

    _assert_the_healthy_job_paged_nothing(stack)
