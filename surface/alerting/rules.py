"""Prometheus rule groups from the catalog, and an example Prometheus configuration
that scrapes what the rules read."""

from __future__ import annotations

from fabricscope.surface.alerting.catalog import ALERTS, GENERATED, RUNBOOK_BASE, runbook_url
from fabricscope.surface.metrics import AGENT_SCRAPE_JOB, COLLECTOR_SCRAPE_JOB
from fabricscope.surface.alerting.model import Alert, Rule, static_labels
from fabricscope.surface.alerting.templates import to_go
from fabricscope.surface.yamlout import dump

RULES_FILE = "fabricscope-alerts.yaml"


def rule_doc(alert: Alert, rule: Rule, base: str = RUNBOOK_BASE) -> dict:
    doc = {"alert": alert.name, "expr": rule.expr, "for": rule.for_}
    if labels := static_labels(rule):
        doc["labels"] = labels
    doc["annotations"] = {"summary": to_go(alert.summary_of(rule)),
                          "description": to_go(alert.description_of(rule)),
                          "runbook_url": runbook_url(alert, base)}
    return doc


def groups(base: str = RUNBOOK_BASE) -> list[dict]:
    """One group per catalog group, in catalog order (an info alert before the
    inhibitor that reads it)."""
    out: dict[str, list[dict]] = {}
    for alert in ALERTS:
        out.setdefault(alert.group, []).extend(rule_doc(alert, r, base) for r in alert.rules)
    return [{"name": name, "rules": rules} for name, rules in out.items()]


def render_rules(base: str = RUNBOOK_BASE) -> str:
    return dump({"groups": groups(base)}, GENERATED,
                "Alerts on the collector's /metrics (findings, job gauges, pipeline health)\n"
                "and the agents'. Runbooks: docs/runbooks.md.")


#: example targets; a deployment lists its own (or discovers them, see the header)
EXAMPLE_COLLECTORS = [f"fabricscope-collector-{i}.fabricscope:9472" for i in range(3)]
EXAMPLE_NODES = ["node1", "node2", "node3"]


def render_prometheus_example() -> str:
    doc = {
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "rule_files": [RULES_FILE],
        "alerting": {"alertmanagers": [
            {"static_configs": [{"targets": ["alertmanager.monitoring.svc:9093"]}]}]},
        "scrape_configs": [
            {"job_name": COLLECTOR_SCRAPE_JOB, "honor_labels": True,
             "static_configs": [{"targets": EXAMPLE_COLLECTORS}]},
            {"job_name": AGENT_SCRAPE_JOB,
             "static_configs": [{"targets": [f"{node}:9471"], "labels": {"node": node}}
                                for node in EXAMPLE_NODES]},
        ],
    }
    return dump(doc, GENERATED, (
        "Example Prometheus configuration for the fabricscope alerts (deploy/kubernetes/).\n"
        f"{COLLECTOR_SCRAPE_JOB} keeps the exported labels (honor_labels): the `job` of a\n"
        "finding or job gauge is the training job, not the scrape job. Every collector\n"
        "replica is scraped; the rules aggregate replicas away. An agent's target carries\n"
        "its node's name (`node`). Finding rules wait 10 s, so scrape and evaluate every\n"
        "few seconds, not every minute. On Kubernetes, discover the same targets with\n"
        "kubernetes_sd_configs (role: pod; keep label app.kubernetes.io/name and the port\n"
        "named metrics; node from __meta_kubernetes_pod_node_name); Debian's Prometheus,\n"
        "which the tests run this file through, is built without it."))
