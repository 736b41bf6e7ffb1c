"""The alerting harness's parts on their own: the webhook receiver, the exporter of
the collector's finding and job gauges, and a server that fails to start."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fabricscope.services import http_get
from tests.support.servers import ALERTMANAGER, AlertmanagerServer
from fabricscope.surface.metrics import FINDING_ACTIVE, JOB_JITTER, JOB_STEP
from fabricscope.surface.alerting.promql import FindingSeries
from tests.support.alerting import FabricExporter, WebhookReceiver

LOSSY = FindingSeries("lossy_link", "warning", job="j", node="node1", interface="eth0",
                      tor="tor0", id="abc123")


def _post(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        return resp.status


def _payload(status: str, **labels: str) -> bytes:
    alert = {"status": status, "labels": labels, "annotations": {}, "startsAt": "",
             "endsAt": ""}
    return json.dumps({"version": "4", "status": status, "receiver": "fabricscope-warning",
                       "groupLabels": {}, "commonLabels": labels, "alerts": [alert]}).encode()


def test_the_receiver_records_notifications_and_waits_for_one():
    with WebhookReceiver() as hook:
        assert _post(hook.url + "/fabricscope-warning", b"not json") == 200
        assert _post(hook.url + "/fabricscope-warning",
                     _payload("firing", alertname="FabricscopeLossyLink", node="node1")) == 200
        note = hook.wait_for(lambda n: n.alerts_of("FabricscopeLossyLink", node="node1"), 10)
        assert note.receiver == "fabricscope-warning" and note.status == "firing"
        assert note.alerts_of("FabricscopeLossyLink", node="node2") == []
        assert note.alerts_of("FabricscopeLossyLink", "resolved") == []
        assert hook.malformed == 1 and len(hook.notifications) == 1
        with pytest.raises(TimeoutError, match="FabricscopeLossyLink"):
            hook.wait_for(lambda n: n.alerts_of("FabricscopeLossyLink", "resolved"), 0.2)


def _scrape(exporter: FabricExporter) -> dict[str, list[tuple[dict, float]]]:
    """metric -> [(labels, value)] as a scraper parses the exposition"""
    status, body = http_get(f"http://{exporter.target}/metrics")
    assert status == 200
    return {f.name: [(s.labels, s.value) for s in f.samples]
            for f in text_string_to_metric_families(body.decode())}


def test_the_exporter_serves_findings_and_job_gauges_as_the_collector_will():
    with FabricExporter() as exporter:
        exporter.open_finding(LOSSY)
        exporter.set_job("j", step_s=1.5, jitter_s=0.02, baseline_s=0.02)
        scraped = _scrape(exporter)
        assert scraped[FINDING_ACTIVE] == [
            ({"cause": "lossy_link", "severity": "warning", "job": "j", "node": "node1",
              "interface": "eth0", "peer": "", "tor": "tor0", "rank": "", "id": "abc123"}, 1.0)]
        assert scraped[JOB_STEP] == [({"job": "j"}, 1.5)]
        exporter.grow_jitter("j", from_s=0.02, per_s=1e6)
        (_, first), = _scrape(exporter)[JOB_JITTER]
        (_, second), = _scrape(exporter)[JOB_JITTER]
        assert second > first > 0.02
        exporter.close_finding(LOSSY.id)
        assert _scrape(exporter).get(FINDING_ACTIVE, []) == []


@pytest.mark.skipif(not os.access(ALERTMANAGER, os.X_OK), reason=f"{ALERTMANAGER} missing "
                    "(make setup installs Debian's prometheus-alertmanager)")
def test_a_server_that_cannot_start_leaves_nothing_behind():
    server = AlertmanagerServer({"route": {"receiver": "nobody"}, "receivers": []})
    with pytest.raises(RuntimeError, match="alertmanager .* exited"):
        server.start()
    assert server.dir is None and server.pid is None
