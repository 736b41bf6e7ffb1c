"""What a person and Prometheus see of the engine: the thresholds table, time windows on
the command line, the advice rules, the text of findings, and the /metrics series
(diagnosis/thresholds.py, timespan.py, advice.py, present.py, metrics.py)."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from fabricscope.diagnosis.advice import advise
from fabricscope.diagnosis.candidate import Candidate
from fabricscope.diagnosis.engine import Gauges
from fabricscope.diagnosis.finding import Evidence, Finding
from fabricscope.diagnosis.metrics import FINDING_ACTIVE, DiagnosisMetrics
from fabricscope.diagnosis.present import explain, findings_text
from fabricscope.diagnosis.thresholds import DEFAULT, Thresholds, render_markdown
from fabricscope.diagnosis.timespan import (SECOND, Span, parse_duration, parse_range, parse_time,
                                window_of)
from fabricscope.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_700_000_600 * SECOND


# -- thresholds ------------------------------------------------------------------------------

def test_every_threshold_has_its_reason_in_the_rendered_table():
    table = render_markdown()
    rows = table.splitlines()[2:]
    names = [f.name for f in dataclasses.fields(Thresholds)]
    assert [r.split("`")[1] for r in rows] == names
    for f in dataclasses.fields(Thresholds):
        assert len(f.metadata["why"]) > 30, f.name
    assert f"| `loss_ratio` | {DEFAULT.loss_ratio} fraction |" in table
    out = subprocess.run([sys.executable, "-m", "fabricscope.diagnosis.thresholds"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert out == table


# -- time windows ---------------------------------------------------------------------------

def test_durations_and_times():
    assert [parse_duration(x) for x in ("90s", "15m", "2h", "1d", "1.5m")] == \
        [90, 900, 7200, 86400, 90]
    assert parse_time("now", NOW) == NOW
    assert parse_time("1700000039.5") == 1_700_000_039_500_000_000
    utc = datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc).timestamp()
    assert parse_time("2023-11-14T22:13:20Z") == int(utc * SECOND)
    assert parse_time("2023-11-14T23:13:20+01:00") == int(utc * SECOND)
    assert parse_range("100..160") == Span(100 * SECOND, 160 * SECOND)
    assert Span(0, 90 * SECOND).seconds == 90


@pytest.mark.parametrize("bad, says", [("15x", "duration"), ("", "duration"),
                                       ("-1m", "duration")])
def test_bad_durations_are_user_errors(bad, says):
    with pytest.raises(UserError, match=says):
        parse_duration(bad)


def test_bad_times_and_ranges_are_user_errors():
    for call, says in [(lambda: parse_time("tomorrow"), "time 'tomorrow' is not valid"),
                       (lambda: parse_range("100"), "is not T1..T2"),
                       (lambda: parse_range("160..100"), "ends before it starts")]:
        with pytest.raises(UserError, match=says) as err:
            call()
        assert "\n" not in err.value.one_line() and "; fix: " in err.value.one_line()


def test_the_window_of_the_command_line():
    def args(**kw):
        return argparse.Namespace(**{"since": None, "start": None, "end": None, **kw})
    assert window_of(args(), NOW) == Span(NOW - 900 * SECOND, NOW)
    assert window_of(args(since="1h"), NOW) == Span(NOW - 3600 * SECOND, NOW)
    assert window_of(args(start="1700000000"), NOW) == Span(1_700_000_000 * SECOND, NOW)
    assert window_of(args(end="1700000300"), NOW) == Span(1_700_000_300 * SECOND - 900 * SECOND,
                                                          1_700_000_300 * SECOND)
    with pytest.raises(UserError, match="exclude each other"):
        window_of(args(since="5m", end="now"), NOW)


# -- advice ---------------------------------------------------------------------------------

def candidate(cause: str, **kw) -> Candidate:
    base = dict(severity="warning", place={"node": "node1"}, summary="", bad_from_ns=0,
                bad_until_ns=1)
    return Candidate(cause, **{**base, **kw})


def test_advice_follows_the_evidence():
    plain = [a.knob for a in advise(candidate("lossy_link", facts={"loss_ratio": 0.01}))]
    assert plain == ["physical link at the switch port of node1"]
    stalls = [a.knob for a in advise(candidate("lossy_link", facts={"timeouts": 4}))]
    assert "TCP minimum RTO on the training fabric" in stalls
    critical = advise(candidate("lossy_link", severity="critical", share_of_step=0.4))
    assert critical[-1].value.startswith("drain node1")
    # NCCL's knobs only for NCCL jobs
    assert not any("NCCL" in a.knob for a in advise(candidate("buffer_saturation")))
    assert any("NCCL" in a.knob for a in advise(candidate("buffer_saturation"), "nccl"))
    uplink = [a.knob for a in advise(candidate("buffer_saturation", place={"tor": "tor0"},
                                               facts={"place_kind": "tor",
                                                      "bytes_per_s": 25e6}))]
    assert uplink[0] == "ECN marking at tor0's uplinks"
    assert "capacity of tor0's uplinks" in uplink and "sender pacing" in uplink
    ahead = advise(candidate("input_stall", facts={"load_s": 3.0, "step_s": 1.0}))[0]
    assert "5 batches are in flight" in ahead.value
    assert advise(candidate("microburst", severity="info")) == []


# -- text -----------------------------------------------------------------------------------

def finding(cause: str, severity: str, added: float, **kw) -> Finding:
    return Finding(cause, severity, "job-1", kw.pop("place", {"node": "node1"}),
                   1_700_000_025 * SECOND, f"{cause} summary", step_seconds_added=added,
                   **kw)


def test_findings_text_leads_with_the_primary_and_hides_info():
    findings = [finding("microburst", "info", 0.0, place={}),
                finding("straggler_compute", "warning", 0.2),
                finding("lossy_link", "critical", 0.5, share_of_step=0.33)]
    assert "INFO     microburst at job job-1" in findings_text(findings)
    shown = findings_text(findings, show_info=False)      # `diagnose` without --all
    lines = shown.splitlines()
    assert lines[0] == "Primary: lossy_link at node1 (critical)"
    assert lines[2].startswith("!! CRITICAL lossy_link at node1  [")
    assert "+0.50 s/step (33%)" in lines[2]
    assert "microburst" not in shown and shown.rstrip().endswith("(1 info findings not shown)")
    assert findings_text([]).startswith("No findings")


def test_explain_gives_the_whole_chain():
    f = finding("lossy_link", "critical", 0.5, share_of_step=0.33, explained_share=1.0,
                evidence=[Evidence("tcp_flow", "payload resent on node1->node0", 1.0, "%",
                                   1, 2, ["node1"])],
                ruled_out=[{"cause": "straggler_compute", "why": "no rank is slow"}],
                victims=[{"rank": "0", "node": "node0", "waited_s": 0.5}],
                retransmit_amplification=250.0)
    text = explain(f)
    assert text.startswith("lossy_link (critical) at node1, job job-1\n")
    for part in ("  - payload resent on node1->node0: 1 % on node1", "still open",
                 "What it costs: 0.500 s of every step (33%)", "Retransmit amplification",
                 "Who waited: rank 0 (node0) +0.500 s per step.",
                 "  - not straggler_compute: no rank is slow"):
        assert part in text, part


# -- /metrics -------------------------------------------------------------------------------

def active(registry: CollectorRegistry) -> dict[str, dict]:
    return {s.labels["id"]: s.labels for m in registry.collect() if m.name == FINDING_ACTIVE
            for s in m.samples}


def test_a_findings_series_lives_while_it_is_open():
    registry = CollectorRegistry()
    metrics = DiagnosisMetrics(registry)
    f = finding("lossy_link", "warning", 0.5)
    metrics.show(f)
    metrics.show(f)                                          # a rewrite: counted once
    assert active(registry)[f.id]["severity"] == "warning"
    assert registry.get_sample_value("fabricscope_findings_opened_total",
                                     {"cause": "lossy_link", "severity": "warning"}) == 1
    f.severity = "critical"
    metrics.show(f)                                          # the series moves, not doubles
    assert [labels["severity"] for labels in active(registry).values()] == ["critical"]
    f.end_ns = f.start_ns + 10 * SECOND
    metrics.show(f)
    assert active(registry) == {}


def test_forgetting_a_job_removes_its_series():
    registry = CollectorRegistry()
    metrics = DiagnosisMetrics(registry)
    mine, other = finding("lossy_link", "warning", 0.5), finding("input_stall", "warning", 0.3)
    other.job = "job-2"
    for f in (mine, other):
        metrics.show(f)
    metrics.set_job("job-1", Gauges(step_s=1.5, sync_slowdown=2.0, retransmit_ratio=0.01))
    assert registry.get_sample_value("fabricscope_job_step_seconds", {"job": "job-1"}) == 1.5
    assert registry.get_sample_value("fabricscope_job_step_jitter_seconds",
                                     {"job": "job-1"}) is None        # unknown: no series
    metrics.forget_job("job-1")
    assert set(active(registry)) == {other.id}
    assert registry.get_sample_value("fabricscope_job_step_seconds", {"job": "job-1"}) is None


def test_compare_text_keeps_its_columns_apart_for_a_huge_change():
    from fabricscope.diagnosis.compare import Result
    from fabricscope.diagnosis.present import compare_text
    r = Result("retransmit_ratio", "fraction", 5, 13, 6.343e-05, 0.01065, 16685.5,
               [0.00986, 0.0125], 0.003, 0.01818, 4.06e-05, 0.00172, "worse")
    line = compare_text("j", "a", "b", [r]).splitlines()[4]
    assert line.split()[:4] == ["retransmit_ratio", "6.343e-05", "0.01065", "+16685.5%"]
