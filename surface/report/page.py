"""`fabricscope report`: one self-contained HTML file of a job's window.

The file holds everything it shows: plotly.js (the plotly package's minified
bundle) inlined, the figures as JSON, the styles, system fonts only, and a
Content-Security-Policy that lets it fetch nothing at all, so it opens the same
from an e-mail, an incident ticket or a laptop with no network. Sections, the
primary finding first: summary, findings (every one with its evidence, the
causes it rules out and the advice), compare (with --compare), timeline (steps
per rank, phases, findings as bands), topology coloured by health, the NICs' 100
us peaks (as a rate on every link, as a share of the line rate where the link has
one), TCP (retransmits by kind, per node, RTT) and collectives (the traffic model
T, B, D, durations, bus bandwidth, NCCL enqueue times when there are any).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from html import escape

from fabricscope.errors import UserError
from fabricscope.jobs import job_label
from fabricscope.surface.report import figures as fig
from fabricscope.surface.report.data import ReportData, collect, comparison
from fabricscope.surface.report.html_parts import (compare_html, findings_html, line_rate_html, links_html,
                                       summary, traffic_html)

CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
       "img-src data: blob:; font-src data:")


@dataclass
class Figure:
    id: str
    caption: str
    figure: dict

    @property
    def has_data(self) -> bool:
        return bool(self.figure["data"])


@dataclass
class Section:
    id: str
    title: str
    lede: str
    figures: list[Figure] = field(default_factory=list)
    html: str = ""
    empty: str = ""                  # what to say when neither figures nor html have data

    @property
    def has_data(self) -> bool:
        return bool(self.html) or any(f.has_data for f in self.figures)


def sections(data: ReportData) -> list[Section]:
    out = [Section("summary", "Summary", "The job, the window and what to look at first.",
                   html=summary(data)),
           Section("findings", "Findings", "Every finding of the diagnosis engine in the "
                   "window, most severe first: what was seen, what it rules out, what to "
                   "change.", html=findings_html(data),
                   empty="The engine recorded no finding for this job in the window.")]
    if data.comparison is not None:
        out.append(Section("compare", "Before and after", "Did the change help? Per metric, "
                           "the medians of the two windows and the statistics of "
                           "`fabricscope compare`.", html=compare_html(data)))
    out += [
        Section("timeline", "Timeline", "Step time per rank (dotted: its gradient sync) and "
                "what each rank was doing; shaded bands are findings, dashed lines "
                "annotations.", [
                    Figure("fig-steps", "Step time per rank", fig.step_times(data)),
                    Figure("fig-phases", "Phases per rank", fig.phase_timeline(data))],
                empty="No steps in the window."),
        Section("topology", "Topology", "Nodes, ToRs, ports and the job's ring hops, each at "
                "its worst in the window as the engine drew it: red is the place of a "
                "warning or critical finding.",
                [Figure("fig-topology", "Fabric graph", fig.topology(data))],
                html=links_html(data) if data.edges else "",
                empty="The engine drew no topology in the window."),
        Section("nic", "NIC peaks", "The busiest 100 \u00b5s bin of each window, per "
                "node, interface and direction, as a rate, and as a share of the line rate "
                "where the link has one. Training shows as synchronized stripes; a hot row "
                "alone is a hot port.",
                [Figure("fig-nic", "Peak 100 \u00b5s rate", fig.nic_heatmap(data)),
                 Figure("fig-nic-util", "Peak 100 \u00b5s utilization",
                        fig.nic_util_heatmap(data))],
                html=line_rate_html(data),
                empty="No NIC windows of the job's nodes in the window."),
        Section("tcp", "TCP", "Retransmitted segments by kind (fast: recovery; rto: timeouts, "
                "200 ms each at least; tlp: tail loss probes), each node's resent share, and "
                "the flows' smoothed RTT.", [
                    Figure("fig-retrans", "Retransmitted segments by kind",
                           fig.retransmits_by_kind(data)),
                    Figure("fig-retrans-ratio", "Resent share per node",
                           fig.retransmit_ratio(data)),
                    Figure("fig-rtt", "RTT percentiles", fig.rtt(data))],
                empty="No TCP windows of the job's nodes in the window."),
        Section("collectives", "Collectives", "The job's traffic as a square wave (T, B, D), "
                "durations and bus bandwidth (nccl-tests conventions) of its collectives; "
                "NCCL enqueue times when the job uses NCCL.", [
                    Figure("fig-durations", "Collective durations", fig.durations(data)),
                    Figure("fig-busbw", "Bus bandwidth by op", fig.busbw(data)),
                    Figure("fig-nccl", "NCCL enqueue time", fig.nccl(data))],
                html=traffic_html(data), empty="No collectives in the window.")]
    return out


def section_html(s: Section) -> str:
    parts = [f'<section id="{s.id}" class="report-section" data-section="{s.id}"'
             f' data-empty="{"false" if s.has_data else "true"}">',
             f"<h2>{escape(s.title)}</h2>", f'<p class="lede">{escape(s.lede)}</p>']
    if s.id != "topology":
        parts.append(s.html)
    for f in s.figures:
        if f.has_data:
            parts.append(f'<figure><figcaption>{escape(f.caption)}</figcaption>'
                         f'<div class="plot" id="{f.id}" data-figure="{f.id}"></div></figure>')
    if s.id == "topology":
        parts.append(s.html)
    if not s.has_data:
        parts.append(f'<p class="empty">{escape(s.empty)}</p>')
    parts.append("</section>")
    return "".join(parts)


def render(data: ReportData, plotly_js: str | None = None) -> str:
    """The whole page. plotly_js: the bundle to inline (default: the plotly package's)."""
    if plotly_js is None:
        from plotly.offline import get_plotlyjs
        plotly_js = get_plotlyjs()
    secs = sections(data)
    figures = {f.id: f.figure for s in secs for f in s.figures if f.has_data}
    nav = "".join(f'<a href="#{s.id}">{escape(s.title)}</a>' for s in secs)
    title = f"fabricscope report: job {job_label(data.job)}"
    payload = json.dumps(figures, separators=(",", ":")).replace("</", "<\\/")
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{STYLE}</style>"
        f"<script>{plotly_js}</script></head><body>"
        f'<header><h1>fabricscope report <span>job {escape(data.job)}</span></h1>'
        f'<p>{escape(str(data.span))}</p><nav>{nav}</nav></header><main>'
        + "".join(section_html(s) for s in secs)
        + '</main><script type="application/json" id="report-figures">'
        f"{payload}</script><script>{LOADER}</script></body></html>")


def write_report(store, args) -> tuple[str, str]:
    """Collect, render and write the report; (the path, a one-line account)."""
    from fabricscope.diagnosis.timespan import window_of
    span = window_of(args)
    data = collect(store, span, args.job)
    if args.compare:
        data.comparison = comparison(store, data, args.compare, args.compare_window)
    page = render(data)
    path = os.path.abspath(args.out)
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(page)
    except OSError as exc:
        raise UserError(f"cannot write the report to {args.out} ({exc.strerror})",
                        "give --out a file in a writable folder") from None
    shown = [s.id for s in sections(data) if s.has_data]
    return path, (f"job {data.job}, {len(data.findings)} findings, sections: "
                  f"{', '.join(shown)}")


#: draws every figure, then marks the page rendered (what the browser test waits for)
LOADER = """
(function () {
  var figures = JSON.parse(document.getElementById("report-figures").textContent);
  var config = {displaylogo: false, responsive: true,
                modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d"]};
  var drawn = Object.keys(figures).map(function (id) {
    var el = document.getElementById(id), f = figures[id];
    return Plotly.newPlot(el, f.data, f.layout, config).then(function (gd) {
      el.dataset.traces = String(gd._fullData.length);
    });
  });
  Promise.all(drawn).then(function () { document.body.dataset.rendered = "true"; },
    function (err) { document.body.dataset.rendered = "failed";
                     console.error("fabricscope report: a plot failed: " + err); });
})();
"""

STYLE = """
:root { --ink: #263238; --muted: #607d8b; --line: #cfd8dc; --bg: #f5f7f8;
        --critical: #c62828; --warning: #ef6c00; --info: #607d8b; --ok: #2e7d32; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink); line-height: 1.45;
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", Arial,
       sans-serif; }
header { background: #263238; color: #fff; padding: 18px 32px 10px; }
header h1 { margin: 0; font-size: 22px; font-weight: 600; }
header h1 span { font-weight: 400; color: #b0bec5; margin-left: 8px; }
header p { margin: 4px 0 10px; color: #cfd8dc; }
nav a { color: #eceff1; margin-right: 18px; text-decoration: none; font-size: 13px; }
nav a:hover { text-decoration: underline; }
main { max-width: 1320px; margin: 0 auto; padding: 16px 24px 48px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 6px;
          padding: 14px 22px 18px; margin: 16px 0; }
h2 { font-size: 18px; margin: 4px 0 2px; }
h3 { font-size: 16px; margin: 6px 0; }
h4 { font-size: 13px; margin: 14px 0 4px; text-transform: uppercase; letter-spacing: .04em;
     color: var(--muted); }
.lede { margin: 0 0 12px; color: var(--muted); }
figure { margin: 10px 0 6px; }
figcaption { font-weight: 600; font-size: 13px; margin-bottom: 2px; }
.badge { display: inline-block; font-size: 11px; font-weight: 700; color: #fff;
         border-radius: 3px; padding: 1px 6px; vertical-align: 2px; background: var(--info); }
.badge.sev-critical { background: var(--critical); }
.badge.sev-warning { background: var(--warning); }
.primary { border-left: 6px solid var(--info); background: #fafafa; padding: 10px 16px;
           margin: 6px 0 14px; border-radius: 4px; }
.primary.sev-critical { border-color: var(--critical); background: #fdecea; }
.primary.sev-warning { border-color: var(--warning); background: #fff3e0; }
.primary.healthy { border-color: var(--ok); background: #e8f5e9; }
.primary .kicker { font-size: 11px; text-transform: uppercase; letter-spacing: .08em;
                   color: var(--muted); font-weight: 700; }
.primary h3 { font-size: 19px; }
.lead { font-size: 15px; margin: 4px 0; }
.meta, .note { color: var(--muted); font-size: 13px; }
table { border-collapse: collapse; margin: 6px 0; }
table.facts th { text-align: left; font-weight: 600; padding: 2px 18px 2px 0; color: var(--muted);
                 vertical-align: top; white-space: nowrap; }
table.facts td { padding: 2px 0; }
table.rows { width: 100%; font-size: 13px; }
table.rows th { text-align: left; border-bottom: 2px solid var(--line); padding: 4px 8px; }
table.rows td { border-bottom: 1px solid #eceff1; padding: 4px 8px; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.finding { border: 1px solid var(--line); border-left: 5px solid var(--info); border-radius: 4px;
           padding: 8px 16px 12px; margin: 10px 0; }
.finding.sev-critical { border-left-color: var(--critical); }
.finding.sev-warning { border-left-color: var(--warning); }
details.finding summary { cursor: pointer; padding: 4px 0; }
ul.ruled-out, ul.advice { margin: 4px 0; padding-left: 20px; }
tr.verdict-better td:last-child { color: var(--ok); }
tr.verdict-worse td:last-child { color: var(--critical); }
tr.bad td { color: var(--critical); font-weight: 600; }
.empty { color: var(--muted); font-style: italic; }
code { font-size: 12px; background: #eceff1; padding: 0 4px; border-radius: 3px; }
"""
