"""The report's page from data built here (surface/report/): every section and its
figures, the primary finding first, values escaped, nothing to fetch, the finding
bands on every time axis, the heatmap, the topology's layout and the compare
windows."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from fabricscope.diagnosis.compare import METRICS, compare_samples
from fabricscope.diagnosis.finding import Advice, Evidence, Finding
from fabricscope.diagnosis.timespan import SECOND, Span
from fabricscope.errors import UserError
from fabricscope.jobclass import Observation, classify
from fabricscope.surface.grafana.queries import agg, select
from fabricscope.surface.report import figures as fig
from fabricscope.surface.report.data import (Comparison, Edge, Note, Phase, ReportData, Series, Step,
                                 TrafficModel, Vertex, compare_windows, series,
                                 without_line_rate)
from fabricscope.surface.report.page import render, sections

T0 = 1_700_000_000
JOB = "198.18.0.1:29500"
FAKE_PLOTLY = "window.Plotly = {newPlot: function () { return Promise.resolve({}); }};"


def ns(s: float) -> int:
    return int((T0 + s) * SECOND)


def lossy(severity: str = "warning", summary: str = "node1 eth0 drops 2 % of frames") -> Finding:
    return Finding("lossy_link", severity, JOB, {"node": "node1", "interface": "eth0"}, ns(20),
                   summary, first_seen_ns=ns(23), last_seen_ns=ns(40), end_ns=ns(40),
                   evidence=[Evidence("tcp_flow", "payload resent on node1->node0", 2.0, "%",
                                      ns(20), ns(40), ["node1"])],
                   ruled_out=[{"cause": "buffer_saturation", "why": "RTT at its floor"}],
                   advice=[Advice("cable on node1 eth0", "replace", "loss independent of load")],
                   step_seconds_added=0.6, share_of_step=0.5, explained_share=0.9)


def timed(name: str, values: list[float], start: float = 0.0, **tags) -> Series:
    return Series(name, [ns(start + i) for i in range(len(values))], values, tags, "v")


def report_data(**changes) -> ReportData:
    ranks = {"0": "node0", "1": "node1", "2": "node2"}
    steps = [Step(r, n, ns(i), 0.5 + (0.6 if 20 <= i < 40 else 0.0), 0.3, 0)
             for r, n in ranks.items() for i in range(60)]
    phases = [Phase(r, p, ns(i + off), 0.2) for r in ranks for i in range(60)
              for p, off in (("grad_sync", 0.1), ("compute", 0.3))]
    results = compare_samples({"step_time": ([1.1] * 10, [0.5] * 10)})
    data = ReportData(
        JOB, Span(ns(0), ns(60)), ranks, steps=steps, phases=phases,
        notes=[Note(ns(40), "node1 cable replaced", "sre@lab")],
        findings=[lossy(), Finding("microburst", "info", JOB, {}, ns(5), "bursts, normal")],
        nic_peak=[timed("node0 eth0 tx", [9e8] * 60), timed("node1 eth0 rx", [8e8] * 60),
                  timed("node1 lo tx", [0.0] * 60)],
        nic_util=[timed("node0 eth0 tx", [0.9] * 60), timed("node1 eth0 rx", [0.8] * 60),
                  timed("node1 lo tx", [0.0] * 60)],
        retrans_kinds=[timed("fast", [0] * 20 + [30] * 20 + [0] * 20),
                       timed("rto", [0] * 60)],
        retrans_ratio=[timed("node1", [0.02] * 60, node="node1")],
        rtt=[timed("p50", [200.0] * 60), timed("p99", [900.0] * 60)],
        durations=[timed("AllReduce p50", [0.3] * 60, op="AllReduce"),
                   timed("AllReduce max", [0.5] * 60, op="AllReduce")],
        busbw=[timed("AllReduce", [0.01] * 60, op="AllReduce")],
        vertices=[Vertex("spine", "spine", "spine", "", 1.0, "ok", ""),
                  Vertex("tor0", "tor", "tor0", "", 1.0, "ok", ""),
                  *(Vertex(n, "node", n, f"rank {r} on tor0", 0.0 if n == "node1" else 1.0,
                           "lossy_link" if n == "node1" else "ok", "0.1% resent")
                    for r, n in ranks.items())],
        edges=[Edge("tor0", "spine", "uplink", 1.0, "", 0.0, None),
               *(Edge(n, "tor0", "port", 0.0 if n == "node1" else 1.0, "1% resent", 0.01,
                      None) for n in ranks.values()),
               Edge("node1", "node0", "ring", 0.0, "2% resent", 0.02, 300.0)],
        comparison=Comparison("annotation \u201cnode1 cable replaced\u201d", Span(ns(20), ns(40)),
                              Span(ns(40), ns(60)), results))
    for key, value in changes.items():
        setattr(data, key, value)
    return data


class Page(HTMLParser):
    """The page's sections, figure slots, attributes that could fetch, and scripts."""

    def __init__(self, text: str):
        super().__init__()
        self.sections: dict[str, dict] = {}
        self.slots: list[str] = []
        self.fetching: list[str] = []
        self.scripts: list[dict] = []
        self.csp = ""
        self._script: dict | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.sections[a["id"]] = a
        if "data-figure" in a:
            self.slots.append(a["data-figure"])
        for name in ("src", "href"):
            if a.get(name) and not a[name].startswith("#"):
                self.fetching.append(f"{tag} {name}={a[name]}")
        if tag == "link":
            self.fetching.append(f"link {a}")
        if tag == "meta" and a.get("http-equiv") == "Content-Security-Policy":
            self.csp = a["content"]
        if tag == "script":
            self._script = {"attrs": a, "text": ""}

    def handle_data(self, data):
        if self._script is not None:
            self._script["text"] += data

    def handle_endtag(self, tag):
        if tag == "script" and self._script is not None:
            self.scripts.append(self._script)
            self._script = None

    def figures(self) -> dict:
        (payload,) = [s for s in self.scripts if s["attrs"].get("id") == "report-figures"]
        return json.loads(payload["text"])


def test_every_section_is_there_with_its_figures_and_the_page_fetches_nothing():
    page = Page(render(report_data(), FAKE_PLOTLY))
    assert list(page.sections) == ["summary", "findings", "compare", "timeline", "topology",
                                   "nic", "tcp", "collectives"]
    assert all(s["data-empty"] == "false" for s in page.sections.values())
    figures = page.figures()
    assert page.slots == list(figures) == [
        "fig-steps", "fig-phases", "fig-topology", "fig-nic", "fig-nic-util", "fig-retrans",
        "fig-retrans-ratio", "fig-rtt", "fig-durations", "fig-busbw"]     # no NCCL calls
    assert all(f["data"] for f in figures.values())
    assert page.fetching == []
    assert "default-src 'none'" in page.csp
    assert page.scripts[0]["text"] == FAKE_PLOTLY          # inlined, first, in <head>


def test_the_plotly_bundle_of_the_package_is_inlined():
    from plotly.offline import get_plotlyjs
    text = render(report_data(findings=[]))
    assert get_plotlyjs() in text
    assert Page(text).fetching == []


def test_the_primary_finding_leads_the_summary_and_findings_go_by_severity():
    critical = lossy("critical", "rank 1's link slows the ring")
    critical.cause, critical.id = "straggler_network", "c1"
    data = report_data(findings=[Finding("microburst", "info", JOB, {}, ns(5), "normal"),
                                 lossy(), critical])
    summary = next(s for s in sections(data) if s.id == "summary").html
    assert summary.index("Primary finding") < summary.index("<table")
    assert "straggler_network at node1 (eth0)" in summary.split("<table")[0]
    findings = next(s for s in sections(data) if s.id == "findings").html
    order = re.findall(r'class="finding sev-(\w+)"', findings)
    assert order == ["critical", "warning", "info"]
    assert "<details" in findings                  # info ones folded
    assert "What was seen" in findings and "Why not something else" in findings
    assert "not <b>buffer_saturation</b>: RTT at its floor" in findings
    assert "cable on node1 eth0" in findings and "loss independent of load" in findings


def test_without_a_warning_the_summary_says_the_job_is_healthy():
    data = report_data(findings=[Finding("microburst", "info", JOB, {}, ns(5), "normal")])
    summary = next(s for s in sections(data) if s.id == "summary").html
    assert "No warning or critical findings" in summary


def test_values_from_the_store_are_escaped_and_cannot_end_the_scripts():
    data = report_data(findings=[lossy(summary='<img src=x onerror="alert(1)">')],
                       notes=[Note(ns(40), "</script><script>alert(2)</script>", "x")])
    text = render(data, FAKE_PLOTLY)
    assert "<img src=x" not in text and "&lt;img src=x" in text
    page = Page(text)
    assert page.fetching == []
    assert not any("alert(2)" in s["text"] and s["attrs"].get("id") != "report-figures"
                   for s in page.scripts)
    assert any(a["text"].endswith("</script><script>alert(2)</script>")
               for f in page.figures().values() for a in f["layout"].get("annotations", []))


def test_a_section_without_data_says_so():
    data = report_data(nic_peak=[], nic_util=[], vertices=[], edges=[], comparison=None)
    page = Page(render(data, FAKE_PLOTLY))
    assert "compare" not in page.sections
    assert page.sections["nic"]["data-empty"] == "true"
    assert page.sections["topology"]["data-empty"] == "true"
    assert "fig-nic" not in page.figures()
    text = render(data, FAKE_PLOTLY)
    assert "No NIC windows of the job&#x27;s nodes in the window." in text


def test_findings_show_as_bands_and_annotations_as_lines_on_every_time_axis():
    data = report_data()
    for make in (fig.step_times, fig.retransmits_by_kind, fig.rtt, fig.durations, fig.busbw):
        layout = make(data)["layout"]
        bands = [s for s in layout["shapes"] if s["type"] == "rect"]
        notes = [s for s in layout["shapes"] if s["type"] == "line"]
        assert [(b["x0"], b["x1"]) for b in bands] == [(fig.iso(ns(20)), fig.iso(ns(40)))]
        assert [n["x0"] for n in notes] == [fig.iso(ns(40))]
        assert layout["xaxis"]["type"] == "date"
    # the heatmap would hide bands below it: outlines above it instead, no labels
    heat = fig.nic_heatmap(data)["layout"]
    assert {s["layer"] for s in heat["shapes"]} == {"above"}
    assert heat["annotations"] == []


def test_every_time_axis_spans_the_job_not_the_idle_window():
    data = report_data(span=Span(ns(-600), ns(600)))
    lo, hi = fig.extent(data)
    assert ns(-3) <= lo <= ns(0) and ns(60) <= hi <= ns(63)
    assert fig.rtt(data)["layout"]["xaxis"]["range"] == [fig.iso(lo), fig.iso(hi)]


def test_the_heatmap_has_a_row_per_busy_interface_and_a_column_per_window():
    data = report_data(nic_util=[timed("node0 eth0 tx", [0.5, 0.7]),
                                 timed("node1 eth0 rx", [0.9], start=1),
                                 timed("node1 lo tx", [0.0, 0.0])])
    (trace,) = fig.nic_util_heatmap(data)["data"]
    assert trace["y"] == ["node0 eth0 tx", "node1 eth0 rx"]
    assert trace["x"] == [fig.iso(ns(0)), fig.iso(ns(1))]
    assert trace["z"] == [[0.5, 0.7], [None, 0.9]]
    assert (trace["zmin"], trace["zmax"]) == (0, 1)


def test_the_peak_rate_heatmap_scales_to_the_busiest_bin_not_to_a_line_rate():
    data = report_data(nic_peak=[timed("node0 veth0 tx", [2e8, 7e8])])
    (trace,) = fig.nic_heatmap(data)["data"]
    assert (trace["y"], trace["z"], trace["zmax"]) == (["node0 veth0 tx"], [[2e8, 7e8]], 7e8)


def test_links_without_a_line_rate_show_their_peak_rate_and_say_the_line_rate_is_unknown():
    data = report_data(nic_util=[], line_rate_unknown=["node0 veth0 rx", "node0 veth0 tx"])
    page = Page(render(data, FAKE_PLOTLY))
    assert page.sections["nic"]["data-empty"] == "false"
    assert "fig-nic" in page.figures() and "fig-nic-util" not in page.figures()
    text = render(data, FAKE_PLOTLY)
    assert "Line rate unknown (a virtual link, or none configured): node0 veth0 rx, " \
           "node0 veth0 tx." in text


def test_the_line_rate_is_unknown_for_busy_links_no_speed_row_names():
    peaks = [timed("node0 eth0 rx", [1e8]), timed("node0 veth0 rx", [1e8]),
             timed("node0 lo rx", [0.0])]
    speeds = [{"_tags": {"node": "node0", "interface": "eth0", "direction": "rx"},
               "link_speed_bps": 10**9, "time": 0}]
    assert without_line_rate(peaks, speeds) == ["node0 veth0 rx"]


def test_the_traffic_model_shows_t_b_d_and_b_against_the_line_rate_only_where_known():
    data = report_data(traffic=[TrafficModel("0", "gloo_ring", 0.62, 1.25e8, 0.5, 0.4),
                                TrafficModel("1", "gloo_windows", 0.61, 1.0e8, None, 0.45)])
    text = render(data, FAKE_PLOTLY)
    rows = re.findall(r"<tr><td>(\d)</td><td>(\w+)</td><td class=num>([^<]*)</td>"
                      r"<td class=num>([^<]*)</td><td class=num>([^<]*)</td>"
                      r"<td class=num>([^<]*)</td></tr>", text)
    assert rows == [("0", "gloo_ring", "0.620", "1000.0", "50%", "40%"),
                    ("1", "gloo_windows", "0.610", "800.0", "line rate unknown", "45%")]


def test_a_job_handed_its_classification_shows_class_and_model_in_the_summary():
    ring = [Observation("AllReduce", 4 << 20, ns(s) + k * 10**7, ns(s) + k * 10**7 + 5 * 10**6,
                        rank=r) for s in range(8) for k in range(3) for r in range(2)]
    text = render(report_data(job_class=classify(ring).to_dict()), FAKE_PLOTLY)
    assert "<tr><th>job class</th><td>data_parallel: allreduce carries 100% of the exchanged " \
           "bytes" in text
    assert "<tr><th>class: message sizes</th><td>p50 4.0 MiB, p90 4.0 MiB</td></tr>" in text
    assert "job class" not in render(report_data(), FAKE_PLOTLY)


def test_phases_are_bars_from_their_start_for_their_length():
    data = report_data(phases=[Phase("1", "data_load", ns(2), 0.25)])
    (bar,) = fig.phase_timeline(data)["data"]
    assert (bar["name"], bar["y"], bar["base"], bar["x"]) == (
        "data_load", ["rank 1"], [fig.iso(ns(2))], [250.0])


def test_the_topology_stacks_nodes_tors_and_spine_and_reds_the_faulty_place():
    data = report_data()
    pos = fig.positions(data)
    assert [pos[n] for n in ("node0", "node1", "node2")] == [(0.0, 1.0), (2.0, 1.0), (4.0, 1.0)]
    assert pos["tor0"] == (2.0, 2.0) and pos["spine"] == (2.0, 3.0)
    traces = fig.topology(data)["data"]
    (faulty,) = [t for t in traces if t.get("name") == "place of a warning or critical finding"]
    assert faulty["x"] == [2.0] and faulty["marker"]["color"] == fig.HEALTH_COLORS[False]
    ring = [t for t in traces if t.get("line", {}).get("dash") == "dot"]
    assert len(ring) == 1 and min(ring[0]["y"]) < 1.0       # curved below the nodes


def test_the_compare_table_has_a_row_per_metric_with_its_verdict():
    html = next(s for s in sections(report_data()) if s.id == "compare").html
    assert html.count("<tr class=\"verdict-") == len(METRICS)
    assert '<tr class="verdict-better"><td>step_time' in html
    assert "node1 cable replaced" in html


# -- compare windows and series -------------------------------------------------------------

WINDOW = Span(ns(0), ns(600))
NOTES = [Note(ns(100), "bucket_cap_mb 25 -> 50", "a"), Note(ns(300), "bucket_cap_mb back", "b")]


def test_compare_splits_at_the_latest_matching_annotation_clipped_to_the_window():
    before, after, label = compare_windows("bucket_cap_mb", WINDOW, NOTES, "2m")
    assert (before, after) == (Span(ns(180), ns(300)), Span(ns(300), ns(420)))
    assert "bucket_cap_mb back" in label
    before, after, _ = compare_windows("25 -> 50", WINDOW, NOTES, "5m")
    assert (before, after) == (Span(ns(0), ns(100)), Span(ns(100), ns(400)))


def test_compare_takes_explicit_windows():
    before, after, _ = compare_windows(f"{T0 + 10}..{T0 + 20}..{T0 + 40}", WINDOW, [], "2m")
    assert (before, after) == (Span(ns(10), ns(20)), Span(ns(20), ns(40)))
    before, after, _ = compare_windows(f"{T0}..{T0 + 5},{T0 + 50}..{T0 + 70}", WINDOW, [], "2m")
    assert (before, after) == (Span(ns(0), ns(5)), Span(ns(50), ns(70)))


@pytest.mark.parametrize("text, says", [
    ("no such note", "no annotation of the window"),
    (f"{T0 + 20}..{T0 + 10}..{T0 + 40}", "no annotation of the window"),   # backwards
    ("", "no annotation of the window")])
def test_compare_without_a_split_is_a_user_error(text, says):
    with pytest.raises(UserError, match=says):
        compare_windows(text, WINDOW, NOTES, "2m")


def test_compare_at_the_window_edge_or_with_a_bad_length_is_a_user_error():
    with pytest.raises(UserError, match="at the edge of the window"):
        compare_windows("x", WINDOW, [Note(ns(600), "x", "")], "2m")
    with pytest.raises(UserError, match="duration"):
        compare_windows("bucket", WINDOW, NOTES, "two minutes")


def test_series_are_one_per_tag_set_and_column():
    q = select("gloo_collective", [agg("percentile", "seconds", "p50", "50"),
                                   agg("max", "seconds", "max")], by_tags=("op",))
    rows = [{"time": ns(i), "_tags": {"op": op}, "p50": 0.1 * i, "max": None}
            for op in ("AllReduce", "Broadcast") for i in range(2)]
    out = series(rows, q)
    assert [(s.name, s.column, s.tags) for s in out] == [
        ("AllReduce max", "max", {"op": "AllReduce"}),
        ("AllReduce p50", "p50", {"op": "AllReduce"}),
        ("Broadcast max", "max", {"op": "Broadcast"}),
        ("Broadcast p50", "p50", {"op": "Broadcast"})]
    assert out[1].values == [0.0, 0.1] and out[0].values == [None, None]
    assert not out[0].has_data
