"""Running and judging the scenarios of bench/scenario_space.py: real faults in a
real lab, judged by what the engine wrote (the `finding` points of the live
collectors), never by the fault settings.

A bench is one leaf-spine lab of a scenario's shape, its data server behind the
spine, InfluxDB, the collectors (two replicas by default: the agents split
between them) and one agent per node; every scenario of that shape runs in it as
a training job of its own (its own MASTER_PORT, so its own job id). The faults go
on after the drawn onset step and stay for the drawn number of steps; a cleared
one then goes off, `fabricscope annotate` marks it, and as many steps follow.

What a fault cost is measured from the job's own steps (gloo_step, read back after
the run): the median step time while it acted against the median before it. A
fault that costs less than SENSITIVITY of the step time need not be named; one
that costs more must be, with its cause and place.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field

from fabricscope.bench.scenario_space import Drawn, Element, FaultKind, LabShape
from fabricscope.bench.scenario_space import Fault
from fabricscope.diagnosis.evidence import SECOND
from fabricscope.diagnosis.finding import Finding, primary, severity_rank
from fabricscope.diagnosis.memory import place_of

#: the share of the step time a single fault must cost to have to be named
SENSITIVITY = 0.10
SETTLE_S = 6.0           # after the job: the engine's last evaluations land
DATA_BYTES = 1 << 20
WARMUP_STEPS = 2         # start-up steps left out of the cost's baseline
#: a fault stays at least this long: two confirming evaluations of the engine and the
#: evidence that comes only every few steps (checkpoints every 10, reads) fit in it
MIN_FAULT_S = 20.0
MAX_STEPS = 3000          # a cap on a job's steps after its onset (it is stopped sooner)


@dataclass
class Expect:
    cause: str
    place: dict            # the place's keys that must match (node, tor, peer)
    required: bool = True  # the fault cost >= SENSITIVITY of the step time


@dataclass
class Scenario:
    name: str
    faults: list
    expect: list[Expect]
    cleared: bool = False
    fault_steps: int = 16

    @classmethod
    def of(cls, d: Drawn) -> "Scenario":
        """The faults to name. Of two at once, the first must be named and the second
        may be: one fault's cost can hide the other's (a rank its quota slows is not
        late where every rank waits on a lossy link), and the cost of each alone is
        not measured; how often both are named is reported apart."""
        return cls(d.kind, list(d.faults),
                   [Expect(f.expected_cause(), f.expected_place(), required=i == 0)
                    for i, f in enumerate(d.faults)],
                   cleared=d.cleared, fault_steps=d.fault_steps)


@dataclass
class Outcome:
    scenario: str
    params: str
    job: str
    onset_ns: int = 0
    clear_ns: int = 0
    seed: int | None = None
    lab: dict = field(default_factory=dict)               # nodes, tors, model_mb
    cost: float | None = None                             # step time while faulty / before - 1
    expected: list[dict] = field(default_factory=list)
    found: list[dict] = field(default_factory=list)       # {cause, where, severity, ...}
    primary: dict | None = None                           # the primary warning's cause, place
    primary_ok: bool = False
    cause_ok: bool = False                                # the primary's cause is a fault's
    all_found: bool = False                               # every required fault
    every_found: bool = False                             # every fault, required or not
    named: list[bool] = field(default_factory=list)       # per expected fault
    false_alarms: list[str] = field(default_factory=list)
    #: warnings that a right finding took over (Finding.superseded_by): the fault
    #: localized again, or a slowdown explained since; counted here, not as false alarms
    moved: list[str] = field(default_factory=list)
    #: right warnings whose place is not the fault's but lies in series with it on
    #: every path of the lab (same_ways)
    in_series: list[str] = field(default_factory=list)
    warnings: int = 0                                     # distinct warnings raised
    right_warnings: int = 0                               # ... that name a fault
    latency_s: list[float] = field(default_factory=list)  # onset -> first_seen, per expected
    end_after_clear_s: float | None = None
    compare: dict = field(default_factory=dict)           # metric -> (verdict, p)
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.primary_ok and self.all_found and not self.false_alarms

    @property
    def required(self) -> bool:
        """Whether some fault of the run had to be named."""
        return any(e.get("required", True) for e in self.expected)

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


@dataclass
class Bench:
    """A lab of one shape, its stack and its data server, started once for many
    scenarios."""

    lab: object
    stack: object
    data_server: str
    store: object
    shape: LabShape
    ports: list = field(default_factory=lambda: list(range(29600, 29800)))


@contextlib.contextmanager
def running_bench(shape: LabShape = LabShape(4, 2, 8), replicas: int = 2,
                  name: str | None = None):
    from fabricscope.diagnosis.store import Store
    from fabricscope.lab.dataserver import running_dataserver
    from fabricscope.lab.running import running_lab
    from fabricscope.lab.stack import running_stack
    with running_lab(name, shape.nodes, wire_frames=True, tors=shape.tors) as lab, \
            running_dataserver(lab, None) as data_server, \
            running_stack(lab, collectors=min(replicas, shape.nodes)) as stack:
        yield Bench(lab, stack, data_server, Store(stack.influx.url), shape)


def apply(lab, fault: Fault) -> None:
    from fabricscope.lab import faults
    if fault.kind is FaultKind.CPU:
        faults.cpu(lab, fault.node_index, fault.value)
    elif fault.kind is FaultKind.STORAGE:
        faults.storage(lab, rate=f"{fault.value:g}mbit")
    elif fault.kind is FaultKind.DELAY:
        for i in range(len(lab.nodes)) if fault.every_node else [fault.node_index]:
            faults.delay(lab, i, f"{fault.value:g}ms")
    elif fault.element is Element.PORT:
        if fault.kind is FaultKind.LOSS:
            faults.loss(lab, fault.node_index, fault.value)
        else:
            faults.shape(lab, fault.node_index, f"{fault.value:g}mbit", f"{fault.burst_kb}kb")
    else:
        direction = "up" if fault.element is Element.UPLINK else "down"
        if fault.kind is FaultKind.LOSS:
            faults.loss_uplink(lab, fault.target, fault.value, direction)
        else:
            faults.shape_uplink(lab, fault.target, f"{fault.value:g}mbit",
                                f"{fault.burst_kb}kb", direction=direction)


def clear_all(lab) -> None:
    from fabricscope.lab import faults
    faults.clear(lab)


def run_scenario(bench: Bench, d: Drawn, log=lambda msg: None) -> Outcome:
    """Run `d` as a job of its own in the bench's lab and judge what the engine wrote.
    The faults stay for d.fault_steps steps and at least MIN_FAULT_S (steps last
    0.2-3 s by lab and model: a count of steps alone gave some faults 5 s); a
    cleared fault is then cleared and the job runs as long again; then the job is
    stopped."""
    sc, lab = Scenario.of(d), bench.lab
    port = bench.ports.pop(0)
    job = f"{lab.nodes[0].address}:{port}"
    out = Outcome(sc.name, "; ".join(f.describe() for f in d.faults) or "-", job, seed=d.seed,
                  lab=asdict(d.lab), expected=[asdict(e) for e in sc.expect])
    start_ns = time.time_ns()
    try:
        _train(bench, d, out, job, port, log)
    except BaseException as exc:
        if not isinstance(exc, Exception):
            raise
        out.error = str(exc)[:300]
    finally:
        clear_all(lab)
    end_ns = time.time_ns()
    time.sleep(SETTLE_S)
    dump = _dump_data(bench, out, start_ns) if os.environ.get("FABRICSCOPE_MATRIX_DUMP") \
        else None
    assess(out, sc, findings_of(bench.store, job, start_ns), bench.store, start_ns, end_ns)
    if dump is not None:
        dump["outcome"] = out.to_dict()
        _write_dump(dump, out, os.environ["FABRICSCOPE_MATRIX_DUMP"])
    return out


def _train(bench: Bench, d: Drawn, out: Outcome, job: str, port: int, log) -> None:
    """The job's phases by its rank 0's steps: before the onset, the faults (or, for a
    healthy job, as long without), after the clearing; then it is stopped."""
    from fabricscope.lab.training import start_training
    lab = bench.lab
    phase_start_ns, phase_start_step, cleared = 0, 0, False
    with start_training(lab, d.onset_step + 1 + MAX_STEPS, model_mb=d.lab.model_mb,
                        master_port=port, data_server=bench.data_server,
                        data_bytes=DATA_BYTES, checkpoint_every=10, timeout_s=600) as run:
        for row in run.steps():
            n, now = row["step"], time.time_ns()
            if n == d.onset_step:
                for f in d.faults:
                    apply(lab, f)
                out.onset_ns = now if d.faults else 0
                phase_start_ns, phase_start_step = now, n
                log(f"  fault on: {out.params}" if d.faults else "  (no fault)")
            elif phase_start_ns and n - phase_start_step >= d.fault_steps and \
                    now - phase_start_ns >= MIN_FAULT_S * SECOND:
                if d.cleared and not cleared:
                    clear_all(lab)
                    out.clear_ns, cleared = now, True
                    _annotate(bench, job, now, "fault cleared")
                    log("  fault cleared")
                    phase_start_ns, phase_start_step = now, n
                    continue
                run.terminate()
                return
        if run.wait() != 0:
            raise RuntimeError(run.error)
        raise RuntimeError(f"the job ended after {MAX_STEPS} steps of its fault")


def assess(out: Outcome, sc: Scenario, findings: list[Finding], store, start_ns: int,
           end_ns: int) -> None:
    """Measure the fault's cost, judge the findings, and run the scenario's compare:
    around the clearing, or a healthy job against itself (live runs and
    bench/matrix_replay alike)."""
    if out.onset_ns and out.cost is None:
        out.cost = fault_cost(store, out.job, start_ns, out.onset_ns,
                              out.clear_ns or end_ns)
    if out.cost is not None and sc.expect:
        sc.expect[0].required = out.cost >= SENSITIVITY
    out.expected = [asdict(e) for e in sc.expect]
    judge(out, sc, findings)
    if sc.cleared and out.clear_ns:
        out.compare = _compare(store, out.job, out.onset_ns, out.clear_ns, end_ns)
    if sc.name == "healthy":
        first = _after_startup(store, out.job, start_ns, end_ns)
        if first:
            out.compare = _null_compare(store, out.job, first, end_ns)


def fault_cost(store, job: str, start_ns: int, onset_ns: int, off_ns: int) -> float | None:
    """The job's median step time while the fault acted over its median before
    (start-up steps left out), minus one: what the fault cost each step. Each step
    is its slowest rank's (the ring waits for it)."""
    from fabricscope.diagnosis.store import quote
    rows = store.query(f"SELECT seconds FROM gloo_step WHERE job = {quote(job)} AND "
                       f"time >= {start_ns} GROUP BY rank")
    by_end: dict[int, float] = {}
    for r in rows:
        if r.get("seconds") is not None:
            key = round(int(r["time"]) / 1e8)         # a step's ranks end together
            by_end[key] = max(by_end.get(key, 0.0), float(r["seconds"]))
    times = sorted(by_end.items())[WARMUP_STEPS:]
    before = [s for t, s in times if t * 1e8 < onset_ns]
    during = [s for t, s in times if onset_ns + SECOND <= t * 1e8 <= off_ns]
    if len(before) < 3 or len(during) < 3:
        return None
    return round(statistics.median(during) / statistics.median(before) - 1, 3)


def _after_startup(store, job: str, start_ns: int, end_ns: int) -> int | None:
    """When the job's third step began: its first two (imports, rendezvous, DDP's
    buckets) are start-up (thresholds.warmup_steps)."""
    from fabricscope.diagnosis.store import quote
    rows = store.query(f"SELECT seconds FROM gloo_step WHERE job = {quote(job)} AND "
                       f"time >= {start_ns} AND time <= {end_ns} GROUP BY rank")
    by_rank: dict[str, list[int]] = {}
    for r in rows:
        by_rank.setdefault(r["_tags"].get("rank", ""), []).append(int(r["time"]))
    times = sorted(min(by_rank.values(), key=len)) if by_rank else []
    return times[2] if len(times) > 6 else None


def _null_compare(store, job: str, start_ns: int, end_ns: int) -> dict:
    """`compare` of a healthy job against itself: each metric's samples of the job
    after its start-up, dealt in alternating blocks of consecutive samples (the
    bootstrap's block length, n^(1/3)) into two windows. Both windows then span the
    whole run, so the shared machine's own changes of pace (another process's
    burst, influxd compacting), which move a healthy run's consecutive halves by up
    to 28 %, fall on both alike: what is left to see is what compare itself would
    invent from samples of one regime."""
    from fabricscope.diagnosis import compare as cmp
    from fabricscope.diagnosis.timespan import Span
    return _results(cmp.compare_samples(
        {m.name: deal(cmp.values(store, job, m.name, Span(start_ns, end_ns)))
         for m in cmp.METRICS}))


def deal(xs: list[float]) -> tuple[list[float], list[float]]:
    """Consecutive blocks of n^(1/3) samples dealt alternately into two windows."""
    from fabricscope.diagnosis.compare import block_length
    k = block_length(len(xs))
    return ([x for i, x in enumerate(xs) if (i // k) % 2 == 0],
            [x for i, x in enumerate(xs) if (i // k) % 2 == 1])


def _dump_data(bench: Bench, out: Outcome, start_ns: int) -> dict:
    """The run's raw measurements as the store answers them (bench/matrix_replay
    replays them through the engine; tests/corpus/ keeps some): the job's rows, and
    the nodes' rows of its time, from 30 s before it (the engine's memory)."""
    from fabricscope.diagnosis.store import quote
    data = {"events": [{"event": "on", "ns": out.onset_ns}, {"event": "off",
                                                              "ns": out.clear_ns}],
            "nodes": [n.to_dict() for n in bench.lab.nodes]}
    since = f"time >= {start_ns - 30 * SECOND}"
    for m in ("tcp_node", "nic_window", "nic_qdisc", "agent_loss"):
        data[m] = bench.store.query(f'SELECT * FROM "{m}" WHERE {since}')
    for m in ("tcp_flow", "gloo_step", "gloo_progress", "gloo_phase", "finding"):
        data[m] = bench.store.query(f'SELECT * FROM "{m}" WHERE {since} AND '
                                    f'job = {quote(out.job)}')
    return data


def _write_dump(data: dict, out: Outcome, folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    name = f"{out.seed if out.seed is not None else out.scenario}-{out.scenario}.json.gz"
    with gzip.open(os.path.join(folder, name), "wt") as fh:
        json.dump(data, fh, separators=(",", ":"))


def _annotate(bench: Bench, job: str, at_ns: int, text: str) -> None:
    from fabricscope.records import Record
    bench.store.write([Record("annotation", at_ns, {"job": job},
                              {"text": text, "author": "diagnosis-matrix"})])


def _compare(store, job: str, a: int, b: int, c: int) -> dict:
    from fabricscope.diagnosis import compare as cmp
    from fabricscope.diagnosis.timespan import Span
    return _results(cmp.compare_samples(cmp.samples(store, job, Span(a, b), Span(b, c))))


def _results(results) -> dict:
    return {r.metric: {"verdict": r.verdict, "p_holm": r.p_holm, "change_pct": r.change_pct,
                       "drift": [r.drift_before, r.drift_after]} for r in results}


def findings_of(store, job: str, since_ns: int) -> list[Finding]:
    from fabricscope.diagnosis.store import quote
    rows = store.query(f"SELECT * FROM finding WHERE job = {quote(job)} AND "
                       f"time >= {since_ns - 60 * SECOND}")
    return [Finding.from_row({**r, **r.get("_tags", {})}) for r in rows]


def _matches(f: Finding, e: Expect | dict, lab: dict | None = None) -> bool:
    """The finding names the fault's cause and its place, or a place that lies in
    series with it on every path of the lab (same_ways)."""
    cause, place = (e.cause, e.place) if isinstance(e, Expect) else (e["cause"], e["place"])
    if f.cause != cause:
        return False
    return all(f.place.get(k) == v for k, v in place.items()) or \
        same_ways(place_of(f.place), place_of(place), lab or {})


def same_ways(a, b, lab: dict) -> bool:
    """Whether two places (diagnosis.localize.Place, a node's port or a ToR's uplink)
    are crossed by the same transfers: between every two of the lab's nodes, and
    between every node and a host behind the spine (storage, the collector), both
    ways. Such places lie in series on every path there is (a ToR with one node: its
    uplink and that node's port), so no telemetry of any job can tell them apart, and
    naming either names the fault. Places that some transfer crosses apart are never
    the same."""
    from fabricscope.diagnosis.localize import crossed_apart, path, path_in, ways_between
    from fabricscope.lab.naming import tor_blocks
    if a == b:
        return True
    if a.kind not in ("node", "tor") or b.kind not in ("node", "tor") or lab.get("tors", 1) < 2:
        return False
    tor_of = {f"node{i}": f"tor{k}" for k, block in
              enumerate(tor_blocks(lab["nodes"], lab["tors"])) for i in block}.get
    nodes = [f"node{i}" for i in range(lab["nodes"])]
    ways = ways_between(nodes, tor_of) + [path(n, None, tor_of, "outside") for n in nodes] \
        + [path_in(n, "outside", tor_of) for n in nodes]
    return not crossed_apart(a, b, ways)


def judge(out: Outcome, sc: Scenario, findings: list[Finding]) -> None:
    """The primary warning must name a fault (cause and place), every required fault
    must be named, and no warning may name anything else: a warning that a right
    finding took over (`superseded_by`) counts as moved, any other as a false alarm.
    A fault that cost less than SENSITIVITY need not be named; naming it right is no
    false alarm."""
    serious = [f for f in findings if severity_rank(f.severity) >= 1]
    out.found = [{"cause": str(f.cause), "where": f.where, "severity": f.severity,
                  "first_seen_s": round((f.first_seen_ns - out.onset_ns) / 1e9, 2)
                  if out.onset_ns else None, "id": f.id,
                  "superseded_by": f.superseded_by,
                  "end_s": round((f.end_ns - out.onset_ns) / 1e9, 2)
                  if out.onset_ns and f.end_ns else None,
                  "summary": f.summary} for f in findings]
    expected = sc.expect
    required = [e for e in expected if e.required]
    # a fault's finding may close and open again (a gray-zone straggler between its
    # late steps): how fast it was found is its first finding's, its end the last's
    by_time = sorted(serious, key=lambda f: f.first_seen_ns)
    def matches(f, e):
        return _matches(f, e, out.lab)
    hits = [next((f for f in by_time if matches(f, e)), None) for e in expected]
    lasts = [next((f for f in reversed(by_time) if matches(f, e)), None) for e in expected]
    out.all_found = all(h is not None for h, e in zip(hits, expected) if e.required)
    out.every_found = all(h is not None for h in hits)
    out.named = [h is not None for h in hits]
    top = primary(serious)
    out.primary = {"cause": top.cause, "place": top.place} if top is not None else None
    if not required:
        out.primary_ok = top is None or any(matches(top, e) for e in expected)
        out.cause_ok = top is None or any(top.cause == e.cause for e in expected)
    else:
        out.primary_ok = top is not None and any(matches(top, e) for e in expected)
        out.cause_ok = top is not None and any(top.cause == e.cause for e in expected)
    wrong = [f for f in serious if not any(matches(f, e) for e in expected)]
    right_ids = {f.id for f in serious if any(matches(f, e) for e in expected)}
    out.warnings, out.right_warnings = len(serious), len(right_ids)
    out.in_series = [f"{f.cause} at {f.where} ({f.severity})" for f in serious
                     if f.id in right_ids and not any(_matches(f, e) for e in expected)]
    out.moved = [f"{f.cause} at {f.where} ({f.severity})" for f in wrong
                 if f.superseded_by in right_ids]
    out.false_alarms = [f"{f.cause} at {f.where} ({f.severity})" for f in wrong
                        if f.superseded_by not in right_ids]
    if out.onset_ns:
        out.latency_s = [round((f.first_seen_ns - out.onset_ns) / 1e9, 2)
                         for f in hits if f is not None]
    if sc.cleared and out.clear_ns:
        ends = [f.end_ns for f in lasts if f is not None and f.end_ns]
        out.end_after_clear_s = round((max(ends) - out.clear_ns) / 1e9, 2) if ends else None
