"""The Alertmanager configuration example.

Routes: the inhibitor to a receiver that notifies nobody; the pipeline's own
alerts (scrape jobs fabricscope-collector and fabricscope-agent) to the team that
runs fabricscope; everything else by severity, one receiver per band. Notifications
are grouped per alert and training job. Inhibition: info alerts are muted where
FabricscopeInfoInhibitor says no warning or critical fires; a ToR alert mutes the
node alerts under that ToR for the same job (the switch explains them); a critical
alert mutes the warning of the same alert at the same place.
"""

from __future__ import annotations

from fabricscope.surface.alerting.catalog import GENERATED, INFO_INHIBITOR
from fabricscope.surface.metrics import AGENT_SCRAPE_JOB, COLLECTOR_SCRAPE_JOB
from fabricscope.surface.yamlout import dump

EXAMPLE_FILE = "alertmanager.example.yaml"
#: the receivers that notify someone, by severity band
SEVERITY_RECEIVERS = {"critical": "fabricscope-critical", "warning": "fabricscope-warning",
                      "info": "fabricscope-info"}
PIPELINE_RECEIVER = "fabricscope-pipeline"
NULL_RECEIVER = "fabricscope-null"
#: labels that name a place; alerts at one place agree on all of them
PLACE = ["job", "node", "interface", "tor", "rank"]


def example() -> dict:
    routes = [
        {"receiver": NULL_RECEIVER, "matchers": [f'alertname="{INFO_INHIBITOR.name}"']},
        {"receiver": PIPELINE_RECEIVER,
         "matchers": [f'job=~"{COLLECTOR_SCRAPE_JOB}|{AGENT_SCRAPE_JOB}"']},
        {"receiver": SEVERITY_RECEIVERS["critical"], "matchers": ['severity="critical"'],
         "group_wait": "10s", "repeat_interval": "1h"},
        {"receiver": SEVERITY_RECEIVERS["warning"], "matchers": ['severity="warning"']},
        {"receiver": SEVERITY_RECEIVERS["info"], "matchers": ['severity="info"'],
         "repeat_interval": "12h"},
    ]
    receivers = [{"name": name, "webhook_configs": [
        {"url": f"http://alert-router.example.internal:9095/{name}", "send_resolved": True}]}
        for name in (*SEVERITY_RECEIVERS.values(), PIPELINE_RECEIVER)]
    return {
        "route": {"receiver": SEVERITY_RECEIVERS["warning"], "group_by": ["alertname", "job"],
                  "group_wait": "30s", "group_interval": "5m", "repeat_interval": "4h",
                  "routes": routes},
        "inhibit_rules": [
            {"source_matchers": [f'alertname="{INFO_INHIBITOR.name}"'],
             "target_matchers": ['severity="info"'],
             # the inhibitor carries the labels of the one info alert it holds back
             "equal": PLACE + ["cause", "id"]},
            {"source_matchers": ['severity=~"warning|critical"', 'tor=~".+"', 'node=""'],
             "target_matchers": ['node=~".+"'],
             "equal": ["job", "tor"]},
            {"source_matchers": ['severity="critical"'],
             "target_matchers": ['severity="warning"'],
             "equal": ["alertname", "instance"] + PLACE},
        ],
        "receivers": receivers + [{"name": NULL_RECEIVER}],
    }


def render_example() -> str:
    return dump(example(), GENERATED, (
        "Example Alertmanager configuration for the fabricscope alerts: point the\n"
        "receivers' webhook URLs at your pager, chat or ticket system."))

