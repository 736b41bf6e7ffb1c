"""promtool unit tests from the catalog's cases (`promtool test rules FILE`).

Each case is a test group of its own (its own series). Expected annotations are
rendered by surface/alerting/templates.py, so promtool checks Prometheus' Go templates
against the Python rendering on real evaluated alerts.
"""

from __future__ import annotations

from fabricscope.surface.alerting.catalog import ALERTS, GENERATED, RUNBOOK_BASE, runbook_url
from fabricscope.surface.alerting.model import Alert, Case, Expect
from fabricscope.surface.alerting.rules import RULES_FILE
from fabricscope.surface.alerting.templates import render
from fabricscope.surface.yamlout import dump

TESTS_FILE = "fabricscope-alerts.test.yaml"


def expected(alert: Alert, expect: Expect, base: str) -> dict:
    rule = alert.rules[expect.rule]
    # a case names the severity it expects; the signal label is the rule's name tag
    labels = dict(expect.labels) | ({"signal": rule.signal} if rule.signal else {})
    return {"exp_labels": labels,
            "exp_annotations": {
                "summary": render(alert.summary_of(rule), labels, expect.value),
                "description": render(alert.description_of(rule), labels, expect.value),
                "runbook_url": runbook_url(alert, base)}}


def case_group(alert: Alert, case: Case, base: str = RUNBOOK_BASE) -> dict:
    return {"name": f"{alert.name}: {case.name}",
            "interval": "1s",
            "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
            "alert_rule_test": [{"eval_time": case.at, "alertname": alert.name,
                                 "exp_alerts": [expected(alert, e, base)
                                                for e in case.expect]}]}


def render_tests(base: str = RUNBOOK_BASE) -> str:
    doc = {"rule_files": [RULES_FILE], "evaluation_interval": "1s",
           "tests": [case_group(a, c, base) for a in ALERTS for c in a.cases]}
    return dump(doc, GENERATED, f"promtool test rules {TESTS_FILE}: for every alert, cases "
                "that fire (labels and\nrendered annotations) and cases that stay quiet.")
