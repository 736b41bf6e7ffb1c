"""What `fabricscope report` shows, read from the store: one ReportData per report.

Every time series comes from the same query builders as the Grafana boards
(surface/grafana_queries.select, the schema's names checked at build time),
expanded as Grafana would for the report's window (surface/grafana_macros) with
the job as the `job` variable and the job's nodes as `node`: the report and the
boards show the same numbers. The findings are those the live engine recorded
(fabricscope.diagnosis.cli.recorded); the compare section is fabricscope.diagnosis.compare's statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fabricscope.diagnosis.compare import Result
from fabricscope.diagnosis.finding import Finding
from fabricscope.diagnosis.timespan import Span
from fabricscope.errors import UserError
from fabricscope.surface.grafana.macros import ALL, TimeRange, Variable, expand_influxql, panel_interval
from fabricscope.surface.grafana.queries import Col, InfluxQL, agg, raw, select

#: a report plot is about 1200 px wide: at most this many points per series
MAX_POINTS = 600
RETRANSMIT_KINDS = ("fast", "rto", "tlp", "slow_start", "syn", "synack", "unknown")


@dataclass
class Series:
    """One line of a plot: a column of one tag set over time."""

    name: str
    times_ns: list[int] = field(default_factory=list)
    values: list[float | None] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    column: str = ""

    @property
    def has_data(self) -> bool:
        return any(v for v in self.values)


@dataclass
class Step:
    rank: str
    node: str
    time_ns: int
    seconds: float | None            # absent for a process's last step
    sync_seconds: float
    retrans_segs: int


@dataclass
class Phase:
    rank: str
    phase: str
    time_ns: int
    seconds: float


@dataclass
class Note:
    """An annotation (`fabricscope annotate`)."""

    time_ns: int
    text: str
    author: str


@dataclass
class Vertex:
    id: str
    kind: str                        # node, tor or spine
    title: str
    subtitle: str
    health: float
    status: str
    mainstat: str


@dataclass
class Edge:
    source: str
    target: str
    kind: str                        # port, uplink or ring
    health: float
    mainstat: str
    retrans_ratio: float | None
    rtt_p90_us: float | None


@dataclass
class TrafficModel:
    """The job's traffic as a square wave (traffic_model), one rank's mean over the
    window; B's share of the line rate only where the link has one."""

    rank: str
    series: str                      # what T is fitted to: gloo_sent, gloo_ring, gloo_windows
    period_s: float | None           # T
    burst_bytes_per_s: float | None  # B
    burst_util: float | None         # B / line rate; None: line rate unknown
    duty_cycle: float | None         # D


@dataclass
class Comparison:
    label: str                       # what split the windows, for a person
    before: Span
    after: Span
    results: list[Result]


@dataclass
class ReportData:
    job: str
    span: Span
    node_of_rank: dict[str, str]
    other_jobs: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    nic_peak: list[Series] = field(default_factory=list)       # bit/s, every link
    nic_util: list[Series] = field(default_factory=list)       # links with a line rate
    line_rate_unknown: list[str] = field(default_factory=list)  # nic_peak names without
    traffic: list[TrafficModel] = field(default_factory=list)
    #: the job's classification (surface/jobclass.py): collect() takes its latest stored
    #: job_class point of the window, else classifies its last collectives there
    job_class: object | None = None
    retrans_kinds: list[Series] = field(default_factory=list)
    retrans_ratio: list[Series] = field(default_factory=list)
    rtt: list[Series] = field(default_factory=list)
    durations: list[Series] = field(default_factory=list)
    busbw: list[Series] = field(default_factory=list)
    nccl: list[Series] = field(default_factory=list)
    vertices: list[Vertex] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    comparison: Comparison | None = None

    @property
    def nodes(self) -> list[str]:
        return sorted(set(self.node_of_rank.values()))


# -- the queries, as the boards build them ------------------------------------------------

def _by(name: str, columns: list[Col], *tags: str, **kw) -> InfluxQL:
    return select(name, columns, by_tags=tags, **kw)


STEPS = _by("gloo_step", [raw("seconds"), raw("sync_seconds"), raw("retrans_segs")],
            "rank", "node", by_time=False)
PHASES = _by("gloo_phase", [raw("phase"), raw("seconds")], "rank", by_time=False)
NOTES = select("annotation", [raw("text"), raw("author"), raw("job")], by_time=False,
               wildcards={"job": "-"})
NIC_PEAK = _by("nic_window", [agg("max", "peak_bps")], "node", "interface", "direction",
               fill="0")
NIC_UTIL = _by("nic_window", [agg("max", "peak_util")], "node", "interface", "direction",
               fill="0")
# links with a line rate: a virtual link's windows carry no link_speed_bps
NIC_SPEED = _by("nic_window", [agg("max", "link_speed_bps")], "node", "interface",
                "direction", by_time=False)
TRAFFIC = _by("traffic_model", [agg("mean", "period_s", "T"),
                                agg("mean", "burst_bytes_per_s", "B"),
                                agg("mean", "burst_util", "B_util"),
                                agg("mean", "duty_cycle", "D")],
              "rank", "series", by_time=False)
RETRANS_KINDS = select("tcp_node", [agg("sum", f"{k}_segs", k) for k in RETRANSMIT_KINDS])
RETRANS_NODES = _by("tcp_node", [agg("sum", "retrans_segs"), agg("sum", "segs_out")], "node")
RTT = select("tcp_flow", [agg("mean", "rtt_p50_us", "p50"), agg("mean", "rtt_p90_us", "p90"),
                          agg("max", "rtt_p99_us", "p99"), agg("min", "rtt_min_us", "floor")])
DURATIONS = _by("gloo_collective", [agg("percentile", "seconds", "p50", "50"),
                                    agg("percentile", "seconds", "p99", "99"),
                                    agg("max", "seconds", "max")], "op")
BUSBW = _by("gloo_collective", [agg("mean", "busbw_gbs")], "op")
NCCL = _by("nccl_call", [agg("percentile", "duration_ns", "p99", "99")], "op")
# Each vertex and edge at its worst in the window: min() is a selector, so the other
# columns come from the same point (what the engine drew while the place was faulty).
VERTICES = _by("topology_node", [agg("min", "health", "health"), raw("title"),
                                 raw("subtitle"), raw("status"), raw("mainstat")],
               "id", "kind", by_time=False, wildcards={"job": "-"}, result_format="table")
EDGES = _by("topology_edge", [agg("min", "health", "health"), raw("mainstat"),
                              raw("retrans_ratio"), raw("rtt_p90_us")],
            "source", "target", "kind", by_time=False, wildcards={"job": "-"},
            result_format="table")


@dataclass(frozen=True)
class Scope:
    """What every query narrows to: the window, the job and the job's nodes."""

    span: Span
    job: str | None                  # None: every job
    nodes: tuple[str, ...] = ()      # (): every node
    max_points: int = MAX_POINTS

    @property
    def time_range(self) -> TimeRange:
        return TimeRange(self.span.start_ns // 10**6, self.span.end_ns // 10**6)

    def variables(self) -> dict[str, Variable]:
        nodes = self.nodes or (ALL,)
        job = Variable("job", ALL, include_all=True, all_value=".*") if self.job is None \
            else Variable("job", self.job)
        return {"job": job,
                "node": Variable("node", nodes, self.nodes, multi=True, include_all=True,
                                 all_value=".*"),
                "interface": Variable("interface", ALL, (), multi=True, include_all=True,
                                      all_value=".*")}

    def expand(self, q: InfluxQL) -> str:
        interval = panel_interval(self.time_range, self.max_points, "1s")
        return expand_influxql(q.text, self.time_range, self.variables(), interval)

    def rows(self, store, q: InfluxQL) -> list[dict]:
        return store.query(self.expand(q))


def series(rows: list[dict], q: InfluxQL, label=None) -> list[Series]:
    """One Series per tag set and value column, named by label(tags, column) (default:
    the tags' values, then the column when the query has several)."""
    def default(tags: dict, column: str) -> str:
        parts = [tags[t] for t in q.group_tags if tags.get(t)]
        if len(q.columns) > 1 or not parts:
            parts.append(column)
        return " ".join(parts)
    label = label or default
    out: dict[tuple, Series] = {}
    for r in rows:
        tags = r.get("_tags") or {}
        for column in q.columns:
            key = (tuple(sorted(tags.items())), column)
            s = out.setdefault(key, Series(label(tags, column), tags=dict(tags), column=column))
            s.times_ns.append(int(r["time"]))
            value = r.get(column)
            s.values.append(None if value is None else float(value))
    return sorted(out.values(), key=lambda s: s.name)


def ratio_series(rows: list[dict], num: str, den: str) -> list[Series]:
    """num / den per node and time (a node's retransmitted share of its segments)."""
    out: dict[str, Series] = {}
    for r in rows:
        node = (r.get("_tags") or {}).get("node", "")
        if not r.get(den):
            continue
        s = out.setdefault(node, Series(node, tags={"node": node}, column=num))
        s.times_ns.append(int(r["time"]))
        s.values.append(float(r.get(num) or 0) / float(r[den]))
    return [out[n] for n in sorted(out)]


# -- reading --------------------------------------------------------------------------------

def pick_job(store, span: Span, job: str | None, findings: list[Finding]):
    """(job, its members, the other jobs of the window): the job asked for, else the one
    of the primary finding, else the one with the most ranks."""
    from fabricscope.diagnosis.finding import primary
    from fabricscope.diagnosis.source import StoreSource
    jobs = StoreSource(store).jobs(span.start_ns, span.end_ns)
    if job and job not in jobs:
        raise UserError(f"the store holds no training steps of job {job} for {span}",
                        "widen --since, or pick a job the window has"
                        + (f" ({', '.join(sorted(jobs))})" if jobs else ""))
    if not jobs:
        raise UserError(f"the store holds no training steps for {span}",
                        "widen --since, or check --influx-url and --database")
    if not job:
        top = primary([f for f in findings if f.job in jobs and f.severity != "info"])
        job = top.job if top else max(sorted(jobs), key=lambda j: len(jobs[j].node_of_rank))
    return job, jobs[job], sorted(j for j in jobs if j != job)


def collect(store, span: Span, job: str | None = None) -> ReportData:
    """Everything the report shows of `job` (or the job pick_job chooses) in `span`."""
    from fabricscope.diagnosis.cli import recorded
    from fabricscope.diagnosis.jobclass import job_classes
    every = recorded(store, span, None)
    job, members, others = pick_job(store, span, job, every)
    scope = Scope(span, job, tuple(members.nodes))
    data = ReportData(job, span, dict(members.node_of_rank), others,
                      findings=[f for f in every if f.job == job])
    data.job_class = job_classes(store, span.start_ns, span.end_ns, job).get(job) if job \
        else None
    data.steps = [Step(r["_tags"].get("rank", "-"), r["_tags"].get("node", ""), int(r["time"]),
                       r.get("seconds"), float(r.get("sync_seconds") or 0.0),
                       int(r.get("retrans_segs") or 0)) for r in scope.rows(store, STEPS)]
    data.phases = [Phase(r["_tags"].get("rank", "-"), r["phase"], int(r["time"]),
                         float(r.get("seconds") or 0.0)) for r in scope.rows(store, PHASES)
                   if r.get("phase")]
    data.notes = [Note(int(r["time"]), r.get("text") or "", r.get("author") or "")
                  for r in scope.rows(store, NOTES)]
    data.nic_peak = series(scope.rows(store, NIC_PEAK), NIC_PEAK)
    data.nic_util = series(scope.rows(store, NIC_UTIL), NIC_UTIL)
    data.line_rate_unknown = without_line_rate(data.nic_peak, scope.rows(store, NIC_SPEED))
    data.traffic = [TrafficModel(r["_tags"].get("rank", "-"), r["_tags"].get("series", ""),
                                 r.get("T"), r.get("B"), r.get("B_util"), r.get("D"))
                    for r in scope.rows(store, TRAFFIC)]
    data.retrans_kinds = series(scope.rows(store, RETRANS_KINDS), RETRANS_KINDS)
    data.retrans_ratio = ratio_series(scope.rows(store, RETRANS_NODES), *RETRANS_NODES.columns)
    data.rtt = series(scope.rows(store, RTT), RTT)
    data.durations = series(scope.rows(store, DURATIONS), DURATIONS)
    data.busbw = series(scope.rows(store, BUSBW), BUSBW)
    data.nccl = series(scope.rows(store, NCCL), NCCL)
    data.vertices = [Vertex(r["_tags"]["id"], r["_tags"].get("kind", ""), r.get("title") or "",
                            r.get("subtitle") or "", _health(r),
                            r.get("status") or "", r.get("mainstat") or "")
                     for r in scope.rows(store, VERTICES)]
    data.edges = [Edge(r["_tags"]["source"], r["_tags"]["target"], r["_tags"].get("kind", ""),
                       _health(r), r.get("mainstat") or "",
                       r.get("retrans_ratio"), r.get("rtt_p90_us"))
                  for r in scope.rows(store, EDGES)]
    return data


def without_line_rate(peaks: list[Series], speeds: list[dict]) -> list[str]:
    """The names of the busy links among `peaks` that no row of NIC_SPEED gives a line
    rate: their utilization is unknown, not zero."""
    known = {" ".join(r["_tags"][t] for t in NIC_SPEED.group_tags if r["_tags"].get(t))
             for r in speeds if r.get("link_speed_bps")}
    return [s.name for s in peaks if s.has_data and s.name not in known]


def _health(row: dict) -> float:
    return 1.0 if row.get("health") is None else float(row["health"])


# -- the compare section --------------------------------------------------------------------

def compare_windows(text: str, span: Span, notes: list[Note], side: str) -> tuple[Span, Span,
                                                                                 str]:
    """(before, after, what split them) of `--compare`: T1..T2..T3, T1..T2,T3..T4, or the
    latest annotation of the window whose text contains `text`, each side `side` long
    and clipped to the window."""
    from fabricscope.diagnosis.timespan import SECOND, parse_duration
    windows = _time_windows(text)
    if windows:
        return windows[0], windows[1], f"{windows[0]} against {windows[1]}"
    hits = [n for n in notes if text and text in n.text]
    if not hits:
        raise UserError(f"--compare {text!r} is no T1..T2..T3 or T1..T2,T3..T4, and no "
                        f"annotation of the window {span} contains it",
                        "give the text of an annotation the window holds, or the windows")
    note = max(hits, key=lambda n: n.time_ns)
    width = int(parse_duration(side) * SECOND)
    if not span.start_ns < note.time_ns < span.end_ns:
        raise UserError(f"the annotation {note.text!r} is at the edge of the window {span}",
                        "widen the window so that it has time on both sides")
    before = Span(max(span.start_ns, note.time_ns - width), note.time_ns)
    after = Span(note.time_ns, min(span.end_ns, note.time_ns + width))
    return before, after, f"annotation \u201c{note.text}\u201d ({note.author})"


def _time_windows(text: str) -> tuple[Span, Span] | None:
    from fabricscope.diagnosis.timespan import ordered, parse_range, parse_time
    try:
        if "," in text:
            first, second = text.split(",", 1)
            return parse_range(first), parse_range(second)
        parts = text.split("..")
        if len(parts) == 3:
            t1, t2, t3 = (parse_time(p) for p in parts)
            return ordered(t1, t2), ordered(t2, t3)
    except UserError:
        return None
    return None


def comparison(store, data: ReportData, text: str, side: str = "2m") -> Comparison:
    """fabricscope.diagnosis.compare's statistics of the job across the split `text` names."""
    from fabricscope.diagnosis.compare import compare_samples, samples
    before, after, label = compare_windows(text, data.span, data.notes, side)
    results = compare_samples(samples(store, data.job, before, after))
    if all(r.n_before == 0 and r.n_after == 0 for r in results):
        raise UserError(f"the store holds no samples of job {data.job} in the compare "
                        f"windows {before} and {after}", "check --compare and the window")
    return Comparison(label, before, after, results)
