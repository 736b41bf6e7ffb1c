"""`fabricscope report` as a process against a real InfluxDB (surface/cli.py,
surface/report/data.py): a synthetic job's agent records, the engine's points
(finding, topology, annotation) and the NIC and collective windows go in through
the real encoder; the file that comes out holds every section with data, and
every bad input is one line on stderr with exit status 2."""

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
from fabricscope.records import Record
from fabricscope.schema import validate
from fabricscope.services import InfluxServer, free_port
from tests.unit.test_diagnosis_evidence import (T0, HopPlan, StepPlan, SynthJob, build, to_records)
from tests.unit.test_report import Page

ROOT = Path(__file__).resolve().parents[2]
FAULT = 20
JOB = SynthJob(seconds=60, step=lambda i, t: StepPlan(seconds=1.5, sync=0.8) if t >= FAULT
               else StepPlan(),
               hop=lambda s, src, dst: HopPlan(loss=0.02 if s >= FAULT and 1 in (src, dst)
                                               else 0.0))
WINDOW = ["--start", str(T0), "--end", str(T0 + 60)]
NOTE = "bucket_cap_mb 25 -> 50"
NOWHERE = ["--influx-url", f"http://127.0.0.1:{free_port()}"]
LOSSY = Finding("lossy_link", "warning", JOB.job, {"node": "node1", "interface": "eth0"},
                (T0 + FAULT) * SECOND, "node1 eth0 drops 2 % of frames; replace the cable",
                first_seen_ns=(T0 + FAULT + 3) * SECOND, last_seen_ns=(T0 + 59) * SECOND)


def fabric_records(spec: SynthJob = JOB) -> list[Record]:
    """What the agents' nic and gloo probes and the collector's engine write beside the
    records the diagnosis tests build, each valid against the schema."""
    out = []
    for s in range(spec.seconds):
        t = (spec.t0_s + s) * SECOND
        for k in range(spec.nodes):
            for direction in ("rx", "tx"):
                out.append(Record("nic_window", t, {"node": spec.node(k), "interface": "eth0",
                                                    "direction": direction},
                                  {"bytes": 10**6, "packets": 700, "rate_bps": 8e6,
                                   "peak_bps": 9e8, "peak_util": 0.9, "hot_bins": 3}))
            out.append(Record("gloo_collective", t, {"node": spec.node(k), "job": spec.job,
                                                     "rank": str(k), "op": "AllReduce"},
                              {"seconds": 0.3 if s < FAULT else 0.8, "bytes": 8 << 20,
                               "busbw_gbs": 0.03 if s < FAULT else 0.01}))
    drawn = (spec.t0_s + 40) * SECOND
    for vid, kind, health in (("node0", "node", 1.0), ("node1", "node", 0.0),
                              ("node2", "node", 1.0), ("tor0", "tor", 1.0)):
        out.append(Record("topology_node", drawn, {"id": vid, "kind": kind, "job": spec.job},
                          {"title": vid, "subtitle": "rank on tor0", "health": health,
                           "status": "lossy_link" if health < 1 else "ok",
                           "mainstat": "2 % resent", "secondarystat": ""}))
    for src, dst, kind in (("node0", "tor0", "port"), ("node1", "tor0", "port"),
                           ("node2", "tor0", "port"), ("node1", "node0", "ring")):
        out.append(Record("topology_edge", drawn, {"id": f"{src}->{dst}", "source": src,
                                                   "target": dst, "kind": kind,
                                                   "job": spec.job},
                          {"health": 0.0 if "node1" in (src, dst) else 1.0,
                           "mainstat": "2 % resent", "bytes_per_s": 1e6,
                           "retrans_ratio": 0.02}))
    out.append(Record("annotation", (spec.t0_s + FAULT) * SECOND, {"job": spec.job},
                      {"text": NOTE, "author": "sre@lab"}))
    for r in out:
        validate(r)
    return out


@pytest.fixture(scope="module")
def influx():
    with InfluxServer() as server:
        for db in ("fabricscope", "empty"):
            server.query(f'CREATE DATABASE "{db}"')
        Store(server.url).write(to_records(build(JOB)) + fabric_records()
                                + [LOSSY.to_record()])
        yield server


def fabricscope(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fabricscope", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert re.fullmatch(r"fabricscope: error: .+; fix: .+", lines[0]), lines[0]
    return lines[0]


def test_the_report_holds_every_section_with_the_stores_data(influx, tmp_path):
    out = tmp_path / "report.html"
    proc = fabricscope("report", "--influx-url", influx.url, *WINDOW, "--compare", NOTE,
                       "--compare-window", "20s", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {out} (job {JOB.job}, 1 findings, sections: "
                                  "summary, findings, compare, timeline, topology, nic, tcp, "
                                  "collectives)")
    text = out.read_text()
    page = Page(text)
    assert all(s["data-empty"] == "false" for s in page.sections.values())
    assert page.fetching == []
    figures = page.figures()
    steps = figures["fig-steps"]["data"]
    assert {t["name"] for t in steps} == {f"rank {k} (node{k}) {what}" for k in range(3)
                                         for what in ("step", "grad sync")}
    assert max(max(t["y"]) for t in steps) == 1.5
    (heat,) = figures["fig-nic"]["data"]
    assert sorted(heat["y"]) == [f"node{k} eth0 {d}" for k in range(3) for d in ("rx", "tx")]
    assert {p for t in figures["fig-retrans-ratio"]["data"] for p in t["y"] if p} != set()
    assert {t["name"] for t in figures["fig-durations"]["data"]} == {
        "AllReduce p50", "AllReduce p99", "AllReduce max"}
    assert "lossy_link at node1 (eth0)" in text and NOTE in text
    # no job_class point is stored: the class comes from the job's last collectives
    assert "data_parallel: allreduce carries 100% of the exchanged bytes" in text
    # the compare: the job's steps before the note are faster than after it
    (row,) = re.findall(r'<tr class="verdict-(\w+)"><td>step_time', text)
    assert row == "worse"


def test_the_job_is_the_one_asked_for_or_of_the_primary_finding(influx, tmp_path):
    out = tmp_path / "r.html"
    assert fabricscope("report", "--influx-url", influx.url, *WINDOW, "--job", JOB.job,
                       "--out", str(out)).returncode == 0
    assert f"job {JOB.job}" in out.read_text()
    line = one_line_error(fabricscope("report", "--influx-url", influx.url, *WINDOW,
                                      "--job", "other:1", "--out", str(out)))
    assert "no training steps of job other:1" in line and JOB.job in line


@pytest.mark.parametrize("argv, says", [
    (NOWHERE + ["--since", "5m"], "unreachable"),
    (["--since", "5m"], "holds no training steps"),                  # the job ran long ago
    (["--database", "empty", *WINDOW], "holds no training steps"),
    (["--database", "nosuch", *WINDOW], "has no database 'nosuch'"),
    ([*WINDOW, "--compare", "no such note"], "no annotation of the window"),
    ([*WINDOW, "--compare", f"{T0 - 90}..{T0 - 60}..{T0 - 30}"], "holds no samples"),
    ([*WINDOW, "--compare", NOTE, "--compare-window", "soon"], "duration 'soon'"),
    (["--since", "5m", "--start", str(T0)], "exclude each other"),
])
def test_bad_input_is_one_line(influx, tmp_path, argv, says):
    at = [] if argv[:1] == ["--influx-url"] else ["--influx-url", influx.url]
    line = one_line_error(fabricscope("report", *at, *argv, "--out", str(tmp_path / "r.html")))
    assert says in line
    assert not (tmp_path / "r.html").exists()


def test_an_unwritable_out_is_one_line(influx, tmp_path):
    line = one_line_error(fabricscope("report", "--influx-url", influx.url, *WINDOW, "--out",
                                      str(tmp_path / "no" / "such" / "r.html")))
    assert "cannot write the report" in line


def test_the_figures_are_plain_json_of_the_store_values(influx, tmp_path):
    """Nothing of Python (NaN, objects) leaks into the figures: JSON.parse takes them."""
    out = tmp_path / "r.html"
    assert fabricscope("report", "--influx-url", influx.url, *WINDOW, "--out",
                       str(out)).returncode == 0
    payload = re.search(r'id="report-figures">(.*?)</script>', out.read_text(), re.S).group(1)
    json.loads(payload, parse_constant=lambda c: pytest.fail(f"{c} in the figures"))
