"""The report's plots as plotly.js figures (`{"data": [...], "layout": {...}}`).

Plain figure JSON, the format plotly.js's Plotly.newPlot takes, built from
ReportData: no plotly Python objects, so building a report costs no validation
pass over thousands of points. Every time axis spans the report's window in local
time and carries the same context: each warning or critical finding as a shaded
band from its start to its end (or the window's end while open), each
annotation as a dashed line.
"""

from __future__ import annotations

from datetime import datetime

from fabricscope.diagnosis.finding import severity_rank
from fabricscope.surface.report.data import ReportData, Series

FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", Arial, sans-serif'
SEVERITY_COLORS = {"critical": "#c62828", "warning": "#ef6c00", "info": "#607d8b"}
HEALTH_COLORS = {True: "#2e7d32", False: "#c62828"}
PHASE_COLORS = {"compute": "#43a047", "grad_sync": "#e53935", "data_load": "#1e88e5",
                "checkpoint": "#8e24aa", "param_broadcast": "#fb8c00"}
#: near white while idle, blue under load, red towards line rate
UTIL_SCALE = [[0.0, "#f7f7f7"], [0.05, "#d9ecf2"], [0.3, "#7fc7d9"], [0.6, "#2c7fb8"],
              [0.85, "#f03b20"], [1.0, "#99000d"]]


def iso(ns: int) -> str:
    """A plotly date (local time, to the millisecond)."""
    return datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def extent(data: ReportData) -> tuple[int, int]:
    """The part of the window the job ran in (every time axis shows the same), padded:
    the NICs and TCP windows of idle seconds before and after it are left out."""
    times = [s.time_ns for s in data.steps] + [p.time_ns for p in data.phases]
    times += [int(p.time_ns + p.seconds * 1e9) for p in data.phases]
    if not times:
        return data.span.start_ns, data.span.end_ns
    lo, hi = max(min(times), data.span.start_ns), min(max(times), data.span.end_ns)
    pad = max((hi - lo) // 40, 10**9)
    return max(data.span.start_ns, lo - pad), min(data.span.end_ns, hi + pad)


def base_layout(data: ReportData, y_title: str, *, height: int = 300, y_format: str = "",
                legend: bool = True, marks: str = "bands") -> dict:
    """A time plot's layout; marks: how findings show (bands, outlines: for a heatmap,
    which hides what lies below it; bare: bands without their labels)."""
    lo, hi = extent(data)
    layout = {
        "height": height, "margin": {"l": 70, "r": 20, "t": 28, "b": 50},
        "font": {"family": FONT, "size": 12, "color": "#263238"},
        "paper_bgcolor": "#ffffff", "plot_bgcolor": "#ffffff", "hovermode": "closest",
        "xaxis": {"type": "date", "range": [iso(lo), iso(hi)], "gridcolor": "#eceff1",
                  "linecolor": "#90a4ae", "ticks": "outside", "tickformat": "%H:%M:%S"},
        "yaxis": {"title": {"text": y_title}, "rangemode": "tozero", "gridcolor": "#eceff1",
                  "linecolor": "#90a4ae", "zeroline": False, "automargin": True},
        "showlegend": legend,
        "legend": {"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"},
    }
    if y_format:
        layout["yaxis"]["tickformat"] = y_format
    shapes, labels = context(data, marks)
    layout["shapes"], layout["annotations"] = shapes, labels
    return layout


def context(data: ReportData, marks: str = "bands") -> tuple[list[dict], list[dict]]:
    """Finding bands and annotation lines, shared by every time axis."""
    shapes, labels = [], []
    for f in data.findings:
        if severity_rank(f.severity) < 1 or f.superseded_by:     # its taker has the band
            continue
        color = SEVERITY_COLORS[f.severity]
        start = max(f.start_ns, data.span.start_ns)
        end = min(f.end_ns or data.span.end_ns, data.span.end_ns)
        band = {"type": "rect", "xref": "x", "yref": "paper", "x0": iso(start), "x1": iso(end),
                "y0": 0, "y1": 1}
        if marks == "outlines":
            band.update({"layer": "above", "line": {"color": color, "width": 2, "dash": "dot"},
                         "fillcolor": "rgba(0,0,0,0)"})
        else:
            band.update({"layer": "below", "line": {"width": 0}, "fillcolor": color,
                         "opacity": 0.10})
        shapes.append(band)
        if marks == "bands":
            labels.append({"x": iso(start), "xref": "x", "yref": "paper", "y": 1,
                           "yanchor": "top", "xanchor": "left", "showarrow": False,
                           "text": f"{f.cause} {f.where}", "font": {"size": 10, "color": color}})
    for n in data.notes:
        if not data.span.start_ns <= n.time_ns <= data.span.end_ns:
            continue
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": iso(n.time_ns),
                       "x1": iso(n.time_ns), "y0": 0, "y1": 1, "layer": "above",
                       "line": {"color": "#1565c0", "width": 1.5, "dash": "dash"}})
        if marks == "bands":
            labels.append({"x": iso(n.time_ns), "xref": "x", "yref": "paper", "y": 0,
                           "yanchor": "bottom", "xanchor": "left", "showarrow": False,
                           "text": f"\u270e {n.text}", "font": {"size": 10, "color": "#1565c0"}})
    return shapes, labels


def lines(series: list[Series], **trace) -> list[dict]:
    return [{"type": "scatter", "mode": "lines", "name": s.name, "x": [iso(t) for t in s.times_ns],
             "y": s.values, "connectgaps": False, "line": {"width": 1.6}, **trace}
            for s in series]


# -- the figures ----------------------------------------------------------------------------

PALETTE = ["#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#d62728"]
DASH = {"p50": "solid", "p99": "dash", "max": "dot"}


def step_times(data: ReportData) -> dict:
    traces = []
    for i, rank in enumerate(sorted(data.node_of_rank, key=_rank_order)):
        color = PALETTE[i % len(PALETTE)]
        steps = [s for s in data.steps if s.rank == rank and s.seconds is not None]
        if not steps:
            continue
        x = [iso(s.time_ns) for s in steps]
        name = f"rank {rank} ({data.node_of_rank[rank]})"
        traces.append({"type": "scatter", "mode": "lines+markers", "name": f"{name} step",
                       "legendgroup": rank, "x": x, "y": [s.seconds for s in steps],
                       "marker": {"size": 4, "color": color},
                       "line": {"width": 1.8, "color": color}})
        traces.append({"type": "scatter", "mode": "lines", "name": f"{name} grad sync",
                       "legendgroup": rank, "x": x, "y": [s.sync_seconds for s in steps],
                       "line": {"width": 1, "dash": "dot", "color": color}})
    return {"data": traces, "layout": base_layout(data, "seconds per step", height=320)}


def phase_timeline(data: ReportData) -> dict:
    """A Gantt chart: one row per rank, a bar per phase from its start, coloured by kind."""
    ranks = sorted({p.rank for p in data.phases}, key=_rank_order)
    traces = []
    for phase, color in PHASE_COLORS.items():
        rows = [p for p in data.phases if p.phase == phase]
        if not rows:
            continue
        traces.append({"type": "bar", "orientation": "h", "name": phase,
                       "y": [f"rank {p.rank}" for p in rows],
                       "base": [iso(p.time_ns) for p in rows],
                       "x": [max(p.seconds, 0.001) * 1000 for p in rows],
                       "marker": {"color": color, "line": {"width": 0}},
                       "customdata": [round(p.seconds, 3) for p in rows],
                       "hovertemplate": f"{phase} %{{customdata}} s<br>%{{base}}<extra>"
                                        "%{y}</extra>"})
    layout = base_layout(data, "", height=90 + 36 * max(1, len(ranks)), marks="bare")
    layout["barmode"] = "overlay"
    layout["bargap"] = 0.25
    layout["yaxis"] = {"type": "category", "categoryorder": "array",
                       "categoryarray": [f"rank {r}" for r in reversed(ranks)],
                       "automargin": True}
    return {"data": traces, "layout": layout}


def nic_heatmap(data: ReportData) -> dict:
    """The busiest 100 us bin of each window as a rate: every link has it."""
    top = max((v or 0.0 for s in data.nic_peak for v in s.values), default=0.0)
    return _heatmap(data, data.nic_peak, top or 1.0, "peak bit/s", "~s",
                    "%{z:.3s}bit/s")


def nic_util_heatmap(data: ReportData) -> dict:
    """The same bins as a share of the line rate, for the links that have one."""
    return _heatmap(data, data.nic_util, 1, "peak / line rate", ".0%", "%{z:.0%}")


def _heatmap(data: ReportData, series: list[Series], zmax: float, title: str,
             tickformat: str, value: str) -> dict:
    busy = [s for s in series if s.has_data]
    times = sorted({t for s in busy for t in s.times_ns})
    column = {t: i for i, t in enumerate(times)}
    z = []
    for s in busy:
        row: list[float | None] = [None] * len(times)
        for t, v in zip(s.times_ns, s.values):
            row[column[t]] = v
        z.append(row)
    trace = {"type": "heatmap", "x": [iso(t) for t in times], "y": [s.name for s in busy], "z": z,
             "zmin": 0, "zmax": zmax, "colorscale": UTIL_SCALE, "xgap": 0, "ygap": 2,
             "colorbar": {"title": {"text": title, "side": "right"},
                          "tickformat": tickformat, "thickness": 12},
             "hovertemplate": f"%{{y}}<br>%{{x}}<br>busiest 100 \u00b5s: {value}<extra></extra>"}
    layout = base_layout(data, "", height=80 + 26 * max(3, len(busy)), legend=False,
                         marks="outlines")
    layout["yaxis"] = {"type": "category", "automargin": True, "autorange": "reversed"}
    return {"data": [trace] if busy else [], "layout": layout}


def bars(series: list[Series]) -> list[dict]:
    return [{"type": "bar", "name": s.name, "x": [iso(t) for t in s.times_ns], "y": s.values}
            for s in series]


def retransmits_by_kind(data: ReportData) -> dict:
    traces = bars([s for s in data.retrans_kinds if s.has_data])
    layout = base_layout(data, "segments retransmitted")
    layout["barmode"] = "stack"
    return {"data": traces, "layout": layout}


def retransmit_ratio(data: ReportData) -> dict:
    return {"data": lines(data.retrans_ratio),
            "layout": base_layout(data, "resent / sent segments", y_format=".1%")}


def rtt(data: ReportData) -> dict:
    return {"data": lines(data.rtt), "layout": base_layout(data, "RTT (\u00b5s)")}


def by_op(data: ReportData, series: list[Series]) -> list[dict]:
    """Lines coloured by op (the same colour in every collectives plot), dashed by
    statistic (p50 solid, p99 dashed, max dotted)."""
    ops = sorted({s.tags.get("op", "") for s in data.durations + data.busbw})
    traces = lines(series)
    for s, t in zip(series, traces):
        op = s.tags.get("op", "")
        t["line"] = {"width": 1.6, "dash": DASH.get(s.column, "solid"),
                     "color": PALETTE[ops.index(op) % len(PALETTE)] if op in ops else None}
    return traces


def durations(data: ReportData) -> dict:
    return {"data": by_op(data, data.durations),
            "layout": base_layout(data, "seconds per collective")}


def busbw(data: ReportData) -> dict:
    return {"data": by_op(data, data.busbw), "layout": base_layout(data, "bus bandwidth (GB/s)")}


def nccl(data: ReportData) -> dict:
    return {"data": lines([Series(s.name, s.times_ns, [None if v is None else v / 1e3
                                                         for v in s.values])
                           for s in data.nccl]),
            "layout": base_layout(data, "enqueue time p99 (\u00b5s)")}


def _rank_order(rank: str):
    return (0, int(rank)) if rank.isdigit() else (1, rank)


# -- the topology ---------------------------------------------------------------------------

LEVEL = {"spine": 3.0, "tor": 2.0, "node": 1.0}
SYMBOL = {"spine": "diamond", "tor": "square", "node": "circle"}


def positions(data: ReportData) -> dict[str, tuple[float, float]]:
    """Nodes side by side at the bottom, each ToR above the nodes of its ports, the
    spine above the ToRs."""
    by_kind: dict[str, list[str]] = {}
    for v in data.vertices:
        by_kind.setdefault(v.kind, []).append(v.id)
    pos = {vid: (2.0 * i, LEVEL["node"])
           for i, vid in enumerate(sorted(by_kind.get("node", []), key=_natural))}
    for level in ("tor", "spine"):
        below = "node" if level == "tor" else "tor"
        for i, vid in enumerate(sorted(by_kind.get(level, []), key=_natural)):
            xs = [pos[e.source][0] for e in data.edges if e.target == vid and e.source in pos
                  and _kind(data, e.source) == below]
            pos[vid] = (sum(xs) / len(xs) if xs else 2.0 * i, LEVEL[level])
    return pos


def _kind(data: ReportData, vid: str) -> str:
    return next((v.kind for v in data.vertices if v.id == vid), "")


def _curve(a: tuple[float, float], b: tuple[float, float], n: int = 21):
    """A ring hop: a quadratic curve below the nodes, deeper for farther ones."""
    cx, cy = (a[0] + b[0]) / 2, a[1] - 0.8 - 0.12 * abs(b[0] - a[0])
    pts = [((1 - t) ** 2 * a[0] + 2 * (1 - t) * t * cx + t * t * b[0],
            (1 - t) ** 2 * a[1] + 2 * (1 - t) * t * cy + t * t * b[1])
           for t in (i / (n - 1) for i in range(n))]
    return [p[0] for p in pts], [p[1] for p in pts]


def _edge_trace(e, a, b) -> tuple[dict, tuple[float, float]]:
    """The edge's line (a ring hop curved below the nodes, with an arrowhead half way)
    and where its label goes."""
    ok = e.health >= 1.0
    xs, ys = _curve(a, b) if e.kind == "ring" else ([a[0], b[0]], [a[1], b[1]])
    trace = {"type": "scatter", "mode": "lines", "x": xs, "y": ys, "showlegend": False,
             "hoverinfo": "skip", "line": {"color": HEALTH_COLORS[ok], "width": 2 if ok else 5,
                                           "dash": "dot" if e.kind == "ring" else "solid"}}
    if e.kind == "ring":
        mid = len(xs) // 2
        trace["mode"] = "lines+markers"
        trace["marker"] = {"symbol": "arrow", "angleref": "previous", "color": HEALTH_COLORS[ok],
                           "size": [12 if i == mid else 0 for i in range(len(xs))]}
        return trace, (xs[mid], ys[mid])
    # a port's label half way, clear of the node's name and of the ToR where ports meet
    return trace, (a[0] + 0.55 * (b[0] - a[0]), a[1] + 0.55 * (b[1] - a[1]))


def _vertex_traces(data: ReportData, pos: dict) -> list[dict]:
    out = []
    for ok, name in ((True, "healthy"), (False, "place of a warning or critical finding")):
        shown = [v for v in data.vertices if v.id in pos and (v.health >= 1.0) == ok]
        if not shown:
            continue
        out.append({
            "type": "scatter", "mode": "markers+text", "name": name,
            "x": [pos[v.id][0] for v in shown], "y": [pos[v.id][1] for v in shown],
            "text": [f"<b>{v.title or v.id}</b>" for v in shown], "textposition": "top center",
            "hovertext": [f"{v.title or v.id} ({v.kind})<br>{v.subtitle}<br>{v.status}"
                          f"{'<br>' + v.mainstat if v.mainstat else ''}" for v in shown],
            "hoverinfo": "text", "textfont": {"size": 13},
            "marker": {"size": 30, "color": HEALTH_COLORS[ok],
                       "symbol": [SYMBOL.get(v.kind, "circle") for v in shown],
                       "line": {"color": "#ffffff", "width": 2}}})
    return out


def topology(data: ReportData) -> dict:
    pos = positions(data)
    traces, notes = [], []
    for e in data.edges:
        if e.source not in pos or e.target not in pos:
            continue
        trace, (x, y) = _edge_trace(e, pos[e.source], pos[e.target])
        traces.append(trace)
        if e.mainstat:
            notes.append({"x": x, "y": y, "text": e.mainstat, "showarrow": False,
                          "bgcolor": "rgba(255,255,255,0.9)", "borderpad": 1,
                          "font": {"size": 10, "color": HEALTH_COLORS[e.health >= 1.0]}})
    traces += _vertex_traces(data, pos)
    for v in data.vertices:
        if v.kind == "node" and v.id in pos:      # rank, ToR and state beside each node
            notes.append({"x": pos[v.id][0] + 0.18, "y": pos[v.id][1], "xanchor": "left",
                          "align": "left", "showarrow": False, "font": {"size": 11},
                          "text": f"{v.subtitle}<br>{v.status}"})
    xs = [p[0] for p in pos.values()] or [0.0]
    low = min([y for t in traces for y in t["y"]] or [1.0])
    hidden = {"visible": False, "fixedrange": True}
    layout = {"height": 440, "margin": {"l": 20, "r": 20, "t": 30, "b": 10},
              "font": {"family": FONT, "size": 12, "color": "#263238"},
              "paper_bgcolor": "#ffffff", "plot_bgcolor": "#ffffff", "hovermode": "closest",
              "legend": {"orientation": "h", "x": 0, "y": 1.05}, "annotations": notes,
              "xaxis": {**hidden, "range": [min(xs) - 1.0, max(xs) + 1.6]},
              "yaxis": {**hidden, "range": [low - 0.25, 3.4]}}
    return {"data": traces, "layout": layout}


def _natural(text: str):
    import re
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]
