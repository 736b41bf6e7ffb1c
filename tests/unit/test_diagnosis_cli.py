"""`fabricscope diagnose | explain | annotate | compare` as processes (diagnosis/cli.py),
against a real InfluxDB holding a synthetic job's agent records and one recorded
finding; every bad input is one line on stderr and exit status 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fabricscope.diagnosis.evidence import SECOND
from fabricscope.diagnosis.finding import Finding
from fabricscope.diagnosis.store import Store
from fabricscope.services import InfluxServer, free_port
from tests.unit.test_diagnosis_evidence import (T0, HopPlan, StepPlan, SynthJob, build,
                                                to_records)

ROOT = Path(__file__).resolve().parents[2]
FAULT = 25
JOB = SynthJob(seconds=60, step=lambda i, t: StepPlan(seconds=1.5, sync=0.8) if t >= FAULT
               else StepPlan(),
               hop=lambda s, src, dst: HopPlan(loss=0.01 if s >= FAULT and 1 in (src, dst)
                                               else 0.0))
WINDOW = ["--start", str(T0), "--end", str(T0 + 60)]
#: a store nobody serves: inputs checked before the store is asked fail on their own
NOWHERE = ["--influx-url", f"http://127.0.0.1:{free_port()}"]
RECORDED = Finding("straggler_compute", "warning", JOB.job, {"node": "node2", "rank": "2"},
                   (T0 + 30) * SECOND, "Compute straggler: rank 2 on node2 (recorded)",
                   first_seen_ns=(T0 + 33) * SECOND, last_seen_ns=(T0 + 40) * SECOND,
                   end_ns=(T0 + 40) * SECOND)


@pytest.fixture(scope="module")
def influx():
    with InfluxServer() as server:
        server.query('CREATE DATABASE "fabricscope"')
        server.query('CREATE DATABASE "empty"')
        store = Store(server.url, "fabricscope")
        store.write(to_records(build(JOB)) + [RECORDED.to_record()])
        yield server


def fabricscope(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fabricscope", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def at(influx) -> list[str]:
    return ["--influx-url", influx.url]


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert re.fullmatch(r"fabricscope: error: .+; fix: .+", lines[0]), lines[0]
    return lines[0]


def test_diagnose_with_the_store_unreachable_is_one_line():
    line = one_line_error(fabricscope("diagnose", *NOWHERE, "--since", "5m"))
    assert "unreachable" in line


def test_diagnose_of_an_empty_window_or_database_is_one_line(influx):
    line = one_line_error(fabricscope("diagnose", *at(influx), "--database", "empty",
                                      "--since", "15m"))
    assert "holds no training steps" in line
    # the job ran (and its recorded finding ended) long before the last 15 minutes
    line = one_line_error(fabricscope("diagnose", *at(influx), "--since", "15m"))
    assert "holds no training steps" in line
    line = one_line_error(fabricscope("diagnose", *at(influx), "--database", "nosuch"))
    assert "has no database 'nosuch'" in line


@pytest.mark.parametrize("since", ["15x", "-5m", "m", "5 minutes"])
def test_diagnose_refuses_bad_durations(since):
    line = one_line_error(fabricscope("diagnose", *NOWHERE, f"--since={since}"))
    assert f"duration {since!r} is not valid" in line


def test_diagnose_refuses_since_with_start_and_a_backward_window():
    line = one_line_error(fabricscope("diagnose", *NOWHERE, "--since", "5m", "--start", str(T0)))
    assert "exclude each other" in line
    line = one_line_error(fabricscope("diagnose", *NOWHERE, "--start", str(T0 + 60),
                                      "--end", str(T0)))
    assert "ends before it starts" in line
    line = one_line_error(fabricscope("diagnose", *NOWHERE, "--start", "yesterday"))
    assert "time 'yesterday' is not valid" in line


def test_diagnose_json_gives_the_recorded_findings(influx):
    proc = fabricscope("diagnose", *at(influx), *WINDOW, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert list(out) == ["job_class", "findings"]
    assert [f["id"] for f in out["findings"]] == [RECORDED.id]
    assert Finding.from_json(out["findings"][0]).summary == RECORDED.summary
    # only this job's, and none of a window before it
    proc = fabricscope("diagnose", *at(influx), *WINDOW, "--json", "--job", "other")
    assert proc.returncode == 2 and "of job other" in one_line_error(proc)


def test_diagnose_recompute_replays_the_engine_over_the_raw_measurements(influx):
    proc = fabricscope("diagnose", *at(influx), *WINDOW, "--json", "--recompute")
    assert proc.returncode == 0, proc.stderr
    found = [Finding.from_json(f) for f in json.loads(proc.stdout)["findings"]]
    serious = [(f.cause, f.where) for f in found if f.severity != "info"]
    assert serious == [("lossy_link", "node1")]
    (lossy,) = [f for f in found if f.cause == "lossy_link"]
    assert abs(lossy.start_ns - (T0 + FAULT) * SECOND) < 1000
    assert lossy.step_seconds_added == 0.5
    # the text form leads with it
    proc = fabricscope("diagnose", *at(influx), *WINDOW, "--recompute")
    assert proc.returncode == 0
    assert proc.stdout.startswith("Primary: lossy_link at node1 (critical)")


def test_explain_gives_the_chain_of_a_recorded_finding_and_refuses_an_unknown_id(influx):
    proc = fabricscope("explain", *at(influx), RECORDED.id)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"straggler_compute (warning) at node2, job {JOB.job}")
    assert f"id {RECORDED.id}" in proc.stdout
    line = one_line_error(fabricscope("explain", *at(influx), "0123456789ab"))
    assert "no finding '0123456789ab'" in line


def test_annotate_writes_an_annotation_point(influx):
    proc = fabricscope("annotate", *at(influx), "--job", JOB.job, "--at", str(T0 + 30),
                       "raised bucket_cap_mb to 50")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"annotated job {JOB.job} at ")
    rows = influx.query("SELECT * FROM annotation", db="fabricscope")
    assert [(r["time"], r["job"], r["text"]) for r in rows] == [
        ((T0 + 30) * SECOND, JOB.job, "raised bucket_cap_mb to 50")]
    assert "@" in rows[0]["author"]
    one_line_error(fabricscope("annotate", *at(influx), "   "))


@pytest.mark.parametrize("ranges, says", [
    (["--before", "yesterday..today", "--after", f"{T0 + 30}..{T0 + 60}"], "is not valid"),
    (["--before", f"{T0 + 30}..{T0}", "--after", f"{T0 + 30}..{T0 + 60}"],
     "ends before it starts"),
    (["--before", f"{T0}", "--after", f"{T0 + 30}..{T0 + 60}"], "is not T1..T2"),
    (["--before", f"{T0}..{T0 + 30}"], "needs --before and --after"),
    (["--around", "bucket", "--before", f"{T0}..{T0 + 30}"], "excludes --before"),
    (["--around", "no such change"], "no annotation of job"),
    (["--before", f"{T0 - 600}..{T0 - 300}", "--after", f"{T0 - 300}..{T0 - 100}"],
     "holds no samples"),
])
def test_compare_refuses_bad_ranges(influx, ranges, says):
    line = one_line_error(fabricscope("compare", *at(influx), "--job", JOB.job, *ranges))
    assert says in line


def test_compare_before_and_after_the_fault(influx):
    proc = fabricscope("compare", *at(influx), "--job", JOB.job, "--before",
                       f"{T0 + 2}..{T0 + FAULT}", "--after", f"{T0 + FAULT}..{T0 + 60}", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    verdicts = {m["metric"]: m for m in out["metrics"]}
    assert verdicts["step_time"]["verdict"] == "worse"
    assert verdicts["step_time"]["before_median"] == 1.0
    assert verdicts["step_time"]["after_median"] == 1.5
    assert verdicts["retransmit_ratio"]["verdict"] == "worse"
    assert verdicts["busbw"]["verdict"] == "insufficient"      # the synthetic job has none
