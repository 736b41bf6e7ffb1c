"""The files made from the alert catalog: current, deterministic, and accepted by the
real tools. promtool checks the rules and runs their unit tests (every alert fires
and stays quiet where the catalog says), checks the example Prometheus config;
amtool checks the Alertmanager example and routes real label sets through it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from fabricscope.surface.alerting import generate as alerts
from fabricscope.surface.alerting.alertmanager import (EXAMPLE_FILE, NULL_RECEIVER, PIPELINE_RECEIVER,
                                           SEVERITY_RECEIVERS, example)
from fabricscope.surface.alerting.catalog import ALERTS, INFO_INHIBITOR, RUNBOOK_BASE
from fabricscope.surface.metrics import AGENT_SCRAPE_JOB, COLLECTOR_SCRAPE_JOB
from fabricscope.surface.alerting.promtool_tests import TESTS_FILE
from fabricscope.surface.alerting.rules import RULES_FILE
from fabricscope.surface.alerting.runbooks import RUNBOOKS_FILE
from tests.support.alerting import config_for_tests

ROOT = alerts.ROOT
PROM = ROOT / alerts.PROMETHEUS_DIR
AM_EXAMPLE = ROOT / alerts.ALERTMANAGER_DIR / EXAMPLE_FILE
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
AMTOOL = shutil.which("amtool") or "/usr/bin/amtool"
needs_promtool = pytest.mark.skipif(not os.access(PROMTOOL, os.X_OK),
                                    reason="promtool missing (make setup installs Debian's "
                                           "prometheus, which ships it)")
needs_amtool = pytest.mark.skipif(not os.access(AMTOOL, os.X_OK),
                                  reason="amtool missing (make setup installs Debian's "
                                         "prometheus-alertmanager, which ships it)")


def _run(*argv: str, cwd=PROM) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_checked_in_files_are_what_the_catalog_renders():
    assert alerts.stale(ROOT) == [], "stale; fix: python -m fabricscope.surface.alerting"


def test_rendering_is_deterministic_and_the_runbook_base_is_one_setting(tmp_path):
    assert alerts.write(tmp_path) == list(alerts.outputs())
    assert alerts.write(tmp_path) == []                # nothing changed the second time
    other = alerts.outputs("https://wiki.example/fabricscope/runbooks")
    for rel, text in alerts.outputs().items():
        assert (tmp_path / rel).read_text() == text
        assert other[rel] == text.replace(RUNBOOK_BASE, "https://wiki.example/fabricscope/runbooks")


def test_every_runbook_url_lands_on_a_heading():
    headings = [line[3:] for line in (ROOT / RUNBOOKS_FILE).read_text().splitlines()
                if line.startswith("## ")]
    assert headings == [a.name for a in ALERTS]
    rules = yaml.safe_load((PROM / RULES_FILE).read_text())
    urls = {r["annotations"]["runbook_url"] for g in rules["groups"] for r in g["rules"]}
    # GitHub's anchor of a heading: lower case, spaces to dashes, punctuation dropped
    assert urls == {f"{RUNBOOK_BASE}#{h.lower()}" for h in headings}


@needs_promtool
def test_promtool_checks_the_rules():
    out = _run(PROMTOOL, "check", "rules", RULES_FILE)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {sum(len(a.rules) for a in ALERTS)} rules found" in out.stdout


@needs_promtool
def test_promtool_unit_tests_pass():
    out = _run(PROMTOOL, "test", "rules", TESTS_FILE)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
    tests = yaml.safe_load((PROM / TESTS_FILE).read_text())["tests"]
    assert len(tests) == sum(len(a.cases) for a in ALERTS)


@needs_promtool
def test_promtool_unit_tests_fail_on_a_wrong_expectation(tmp_path):
    """The unit tests assert labels and annotations: one wrong label fails them."""
    shutil.copy(PROM / RULES_FILE, tmp_path)
    doc = yaml.safe_load((PROM / TESTS_FILE).read_text())
    firing = next(t for t in doc["tests"] if t["alert_rule_test"][0]["exp_alerts"])
    firing["alert_rule_test"][0]["exp_alerts"][0]["exp_labels"]["job"] = "another-job"
    doc["tests"] = [firing]
    (tmp_path / TESTS_FILE).write_text(yaml.safe_dump(doc))
    out = _run(PROMTOOL, "test", "rules", TESTS_FILE, cwd=tmp_path)
    assert out.returncode != 0 and "another-job" in out.stdout + out.stderr


@needs_promtool
def test_prometheus_example_config_is_valid():
    out = _run(PROMTOOL, "check", "config", "prometheus.example.yaml")
    assert out.returncode == 0, out.stdout + out.stderr
    config = yaml.safe_load((PROM / "prometheus.example.yaml").read_text())
    jobs = {c["job_name"]: c for c in config["scrape_configs"]}
    assert set(jobs) == {COLLECTOR_SCRAPE_JOB, AGENT_SCRAPE_JOB}
    assert jobs[COLLECTOR_SCRAPE_JOB]["honor_labels"] is True    # `job` stays the training job


@needs_amtool
def test_alertmanager_example_is_valid():
    out = _run(AMTOOL, "check-config", str(AM_EXAMPLE))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 inhibit rules" in out.stdout


@needs_amtool
@pytest.mark.parametrize("labels, receiver", [
    ({"severity": "critical", "job": "train-a"}, SEVERITY_RECEIVERS["critical"]),
    ({"severity": "warning", "job": "train-a"}, SEVERITY_RECEIVERS["warning"]),
    ({"severity": "info", "job": "train-a"}, SEVERITY_RECEIVERS["info"]),
    ({"severity": "critical", "job": COLLECTOR_SCRAPE_JOB}, PIPELINE_RECEIVER),
    ({"severity": "warning", "job": AGENT_SCRAPE_JOB}, PIPELINE_RECEIVER),
    ({"alertname": INFO_INHIBITOR.name, "severity": "none", "job": "train-a"}, NULL_RECEIVER),
])
def test_alertmanager_example_routes_by_severity_and_job(labels, receiver):
    out = _run(AMTOOL, "config", "routes", "test", f"--config.file={AM_EXAMPLE}",
               *(f"{k}={v}" for k, v in labels.items()))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split() == [receiver]


def test_alertmanager_example_groups_and_inhibits_as_documented():
    config = example()
    assert config["route"]["group_by"] == ["alertname", "job"]
    info, tor, ladder = config["inhibit_rules"]
    assert info["source_matchers"] == [f'alertname="{INFO_INHIBITOR.name}"']
    assert info["target_matchers"] == ['severity="info"']
    assert tor["equal"] == ["job", "tor"] and 'node=""' in tor["source_matchers"]
    assert ladder["source_matchers"] == ['severity="critical"']
    names = {r["name"] for r in config["receivers"]}
    assert names == {*SEVERITY_RECEIVERS.values(), PIPELINE_RECEIVER, NULL_RECEIVER}


def test_the_test_config_keeps_the_routes_and_delivers_to_the_webhook():
    config = config_for_tests("http://127.0.0.1:1234/")
    assert config["inhibit_rules"] == example()["inhibit_rules"]
    assert [r["receiver"] for r in config["route"]["routes"]] == \
        [r["receiver"] for r in example()["route"]["routes"]]
    hooks = [h["url"] for r in config["receivers"] for h in r.get("webhook_configs", [])]
    assert hooks == [f"http://127.0.0.1:1234/{n}"
                     for n in (*SEVERITY_RECEIVERS.values(), PIPELINE_RECEIVER)]
    timings = [config["route"][k] for k in ("group_wait", "group_interval")] + \
        [r["group_wait"] for r in config["route"]["routes"] if "group_wait" in r]
    assert set(timings) == {"1s"}


@pytest.mark.parametrize("argv, says", [
    (["--root", "/nonexistent/fabricscope"], "is not a directory"),
    (["--runbook-base", "ftp://example/runbooks.md"], "is not an http(s) URL"),
    (["--runbook-base", "https://example/runbooks.md#top"], "without a fragment"),
])
def test_bad_arguments_get_one_line(argv, says):
    out = subprocess.run([sys.executable, "-m", "fabricscope.surface.alerting", *argv], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and says in out.stderr
    assert out.stderr.startswith("fabricscope: error: ") and "; fix: " in out.stderr


def test_check_names_the_stale_files_and_writes_nothing(tmp_path):
    out = subprocess.run([sys.executable, "-m", "fabricscope.surface.alerting", "--check", "--root",
                          str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and "stale generated files" in out.stderr
    assert all(rel in out.stderr for rel in alerts.outputs())
    assert list(tmp_path.iterdir()) == []
    assert subprocess.run([sys.executable, "-m", "fabricscope.surface.alerting", "--check"], cwd=ROOT,
                          capture_output=True).returncode == 0
