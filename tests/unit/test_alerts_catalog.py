"""surface/alerting/catalog.py: the one list of alerts keeps the conventions it promises.

Names as kubernetes-mixin's, every finding cause paged by one alert, severity in
bands, texts that name the job and the place (and only labels the alert has), one
runbook_url pattern, a runbook for every alert, and a firing and a quiet promtool
case for each; the Python rendering of the place agrees with Finding.where."""

from __future__ import annotations

import json
import re

import pytest

from fabricscope.diagnosis.finding import CAUSES, PLACE_KEYS, Finding
from fabricscope.surface.alerting import generate as alerts
from fabricscope.surface.alerting.catalog import ALERTS, BOARDS, INFO_ALERTS, INFO_INHIBITOR, RUNBOOK_BASE
from fabricscope.surface.alerting.catalog import by_name, paged_causes, runbook_url
from fabricscope.surface.alerting.trend_alerts import JITTER_FLOOR_S
from fabricscope.surface.metrics import FINDING_ACTIVE, JOB_JITTER, JOB_JITTER_BASELINE
from fabricscope.surface.alerting.model import FROM_FINDING, NONE, SEVERITIES
from fabricscope.surface.alerting.templates import PLACE_GO, fields, place_text, render, to_go

#: place labels -> the template fields that may name them
NAMES_FOR = {"node": {"place", "node"}, "tor": {"place", "tor"}, "rank": {"place", "rank"},
             "peer": {"place", "peer"}, "interface": {"place", "interface"},
             "instance": {"instance"}}


def _rules():
    return [(a, i, r) for a in ALERTS for i, r in enumerate(a.rules)]


def _texts(alert, rule) -> list[str]:
    return [alert.summary_of(rule), alert.description_of(rule)]


def test_names_follow_the_mixin_convention_and_are_unique():
    names = [a.name for a in ALERTS]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"Fabricscope(?:[A-Z][a-z]+)+", n) for n in names), names
    assert {"FabricscopeJitterAccumulating", "FabricscopeBufferSaturation",
            "FabricscopeRetransmitAmplification", "FabricscopeLossyLink",
            "FabricscopeStragglerRank", "FabricscopeInputStall", "FabricscopeAgentDown",
            "FabricscopeTelemetryLoss", "FabricscopeCollectorBacklog"} <= set(names)


def test_every_finding_cause_pages_exactly_one_alert():
    raised = set(CAUSES) - {"rdma_misconfig"}        # reserved: the engine raises it not yet
    pages = paged_causes()
    assert set(pages) == raised
    assert sum(len(a.causes) for a in ALERTS) == len(pages)     # no cause twice
    for alert in ALERTS:
        for cause in alert.causes:
            assert any(f'"{cause}"' in r.expr or f"|{cause}" in r.expr or f'"{cause}|' in r.expr
                       for r in alert.rules), (alert.name, cause)


def test_severity_comes_in_three_bands():
    for alert, _, rule in _rules():
        if alert is INFO_INHIBITOR:
            assert rule.severity == NONE
            continue
        assert rule.severity in (*SEVERITIES, FROM_FINDING), alert.name
        if rule.severity == FROM_FINDING:      # only a finding carries its own severity
            assert FINDING_ACTIVE in rule.expr, alert.name
    for alert in INFO_ALERTS:
        assert [r.severity for r in alert.rules] == ["info"]
    for alert in ALERTS:        # one alert's rules are told apart by band or signal
        keys = [(r.severity, r.signal) for r in alert.rules]
        assert len(keys) == len(set(keys)), alert.name


def test_finding_rules_aggregate_the_replicas_and_wait_briefly():
    on_findings = [(a, r) for a, _, r in _rules()
                   if r.expr.startswith(f"max without(instance, pod) ({FINDING_ACTIVE}{{")]
    assert {a.name for a, _ in on_findings} == {a.name for a in ALERTS if a.causes}
    for alert, rule in on_findings:      # the engine has waited for its evidence already
        assert rule.for_ in ("5s", "10s", "15s"), alert.name


def test_jitter_is_a_trend_over_the_jobs_own_baseline():
    trend = [r for r in by_name("FabricscopeJitterAccumulating").rules
             if r.severity != FROM_FINDING]
    assert len(trend) == 1
    assert JOB_JITTER in trend[0].expr and JOB_JITTER_BASELINE in trend[0].expr
    assert "clamp_min(" in trend[0].expr and str(JITTER_FLOOR_S) in trend[0].expr
    assert 'unless on(job)' in trend[0].expr        # the engine's finding takes precedence


def test_every_rule_fires_in_a_case_and_every_alert_stays_quiet_in_one():
    for alert in ALERTS:
        fired = {e.rule for c in alert.cases for e in c.expect}
        assert fired == set(range(len(alert.rules))), alert.name
        assert any(c.quiet for c in alert.cases), alert.name
        names = [c.name for c in alert.cases]
        assert len(names) == len(set(names)), alert.name


def test_texts_name_the_job_and_the_place_and_only_labels_the_alert_has():
    for alert in ALERTS:
        for case in alert.cases:
            for expect in case.expect:
                rule = alert.rules[expect.rule]
                used = {name for text in _texts(alert, rule) for name, _ in fields(text)}
                assert "job" in used, (alert.name, expect.rule)
                for label, names in NAMES_FOR.items():
                    if label in expect.labels and label != "interface":
                        assert used & names, (alert.name, expect.rule, label)
                labels_named = used - {"place", "value"}
                assert labels_named <= set(expect.labels) | {"signal"}, (alert.name, used)


@pytest.mark.parametrize("place", [
    {"node": "node1", "interface": "eth0", "tor": "tor0"},
    {"tor": "tor0", "interface": "uplink"},
    {"tor": "tor1"},
    {"node": "node2", "peer": "198.18.0.254:9000", "rank": "1"},
    {"rank": "3", "peer": "198.18.0.254:9000"},
    {"rank": "3", "interface": "eth0"},
    {"peer": "198.18.0.254:9000"},
    {},
])
def test_the_place_reads_as_the_finding_says_it(place):
    finding = Finding("lossy_link", "warning", "train-a", place, 0, "")
    assert place_text({"job": "train-a", **place}) == finding.where
    assert set(PLACE_KEYS) <= set(re.findall(r"\$labels\.(\w+)", PLACE_GO)) | {"job"}


def test_templates_render_to_go_and_refuse_what_go_would_misread():
    text = "Spool {instance} is {value:.0f} s behind at {place} in {job}"
    go = to_go(text)
    assert go.startswith("Spool {{ $labels.instance }} is {{ printf \"%.0f\" $value }} s")
    assert PLACE_GO in go and go.endswith("in {{ $labels.job }}")
    assert render(text, {"instance": "c0", "job": "j", "node": "n1"}, 61.4) == \
        "Spool c0 is 61 s behind at n1 in j"
    for bad in ("{value}", "{job:.1f}", "{value:>5}", "a {{{{go}}}} action", "{labels[0]}"):
        with pytest.raises(ValueError):
            fields(bad)


def test_runbook_urls_follow_one_pattern():
    for alert in ALERTS:
        assert runbook_url(alert) == f"{RUNBOOK_BASE}#{alert.name.lower()}"
        assert runbook_url(alert, "https://wiki.example/rb") == \
            f"https://wiki.example/rb#{alert.anchor}"


def test_every_alert_has_a_runbook_that_says_how_to_confirm():
    for alert in ALERTS:
        rb = alert.runbook
        assert rb.meaning and rb.confirm and rb.change, alert.name
        assert alert.board in BOARDS, alert.name
        if alert.causes:
            steps = " ".join(rb.confirm)
            assert "fabricscope explain ID" in steps and "fabricscope diagnose --job J" in steps, \
                alert.name


def test_every_board_an_alert_names_is_a_written_dashboard():
    """BOARDS names the boards surface/grafana/dashboards.py writes (uid and title)."""
    dashboards = alerts.ROOT / "grafana" / "dashboards"
    for uid, title in BOARDS.values():
        board = json.loads((dashboards / f"{uid}.json").read_text())
        assert (board["uid"], board["title"]) == (uid, title)
