"""The diagnosis scenario matrix: real faults in a real lab, judged by what the engine
wrote (the `finding` points of the live collectors), never by the fault settings.

One leaf-spine lab (4 nodes, 2 ToRs: nodes 0-1 on tor0, 2-3 on tor1), one data
server behind the spine, InfluxDB, a collector (two with `replicas=2`: the agents
split between them) and one agent per node serve every scenario; each scenario is
a training job of its own (its own MASTER_PORT, so its own job id):

    healthy       nothing
    loss          random loss (1-3 %) on one node's switch port
    shape-node    a shallow TBF on one node's switch port, below the job's rate there
    shape-uplink  a shallow TBF on tor0's uplink
    cpu           a CPU quota (5-10 % of a CPU) on one rank
    storage       the data server throttled (10-30 Mbit/s)
    loss+cpu      loss on one node and a CPU straggler on another
    cleared       loss on one node, cleared halfway; `fabricscope annotate` marks it

A fault goes on after the job's baseline steps and stays for FAULT_STEPS steps
(the combined one COMBINED_FAULT_STEPS; the cleared one stays CLEARED_STEPS, then
runs CLEARED_STEPS more). The parameters (node, rate,
share) are drawn from a seeded generator, so repeats vary them.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from dataclasses import asdict, dataclass, field

from diagnosis.evidence import SECOND
from diagnosis.finding import Finding, primary, severity_rank

WARM_STEPS = 14          # the baseline (2 + 8 steps) is in before the fault
FAULT_STEPS = 14
#: a rank its CPU limit starves beside a lossy ring is judged on its complete steps
#: and is throttled through 40-90 % of them (it also waits on the lossy hops): named
#: 3-33 s after the onset in the nine live runs measured, so its scenario gives the
#: faults as many steps as the cleared one's
COMBINED_FAULT_STEPS = 24
#: the cleared fault's steps, and the steps after it: compare's windows, 24 steps (8
#: blocks) a side, so that a lossy window's steps, which vary 3x from one to the next,
#: still leave the clearing's change plain at compare's ALPHA
CLEARED_STEPS = 24
SETTLE_S = 6.0           # after the job: the engine's last evaluations land
MODEL_MB = 8
DATA_BYTES = 1 << 20
NAMES = ["healthy", "loss", "shape-node", "shape-uplink", "cpu", "storage", "loss+cpu",
         "cleared"]


@dataclass
class Fault:
    kind: str              # loss, shape, uplink, cpu, storage
    target: str | int | None
    value: str | float


@dataclass
class Expect:
    cause: str
    place: dict            # the place's keys that must match (node, tor, peer)


@dataclass
class Scenario:
    name: str
    faults: list[Fault]
    expect: list[Expect]
    cleared: bool = False
    fault_steps: int = FAULT_STEPS     # how long the faults stay


@dataclass
class Outcome:
    scenario: str
    params: str
    job: str
    onset_ns: int = 0
    clear_ns: int = 0
    expected: list[dict] = field(default_factory=list)
    found: list[dict] = field(default_factory=list)       # {cause, where, severity, ...}
    primary_ok: bool = False
    all_found: bool = False
    false_alarms: list[str] = field(default_factory=list)
    #: warnings that a right finding took over (Finding.superseded_by): the fault
    #: localized again, or a slowdown explained since; counted here, not as false alarms
    moved: list[str] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)  # onset -> first_seen, per expected
    end_after_clear_s: float | None = None
    compare: dict = field(default_factory=dict)           # metric -> (verdict, p)
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.primary_ok and self.all_found and not self.false_alarms

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def draw(name: str, rng: random.Random, nodes: int = 4) -> Scenario:
    """The scenario `name` with parameters drawn from rng (what repeats vary)."""
    k = rng.randrange(nodes)
    other = rng.choice([i for i in range(nodes) if i != k])
    node = {"node": f"node{k}"}
    if name == "healthy":
        return Scenario(name, [], [])
    if name == "loss":
        return Scenario(name, [Fault("loss", k, rng.choice([1, 2, 3]))],
                        [Expect("lossy_link", node)])
    if name == "cleared":     # a fault that costs enough for its clearing to be seen
        return Scenario(name, [Fault("loss", k, rng.choice([2, 3]))],
                        [Expect("lossy_link", node)], cleared=True,
                        fault_steps=CLEARED_STEPS)
    if name == "shape-node":
        # below what the job sends through one node's port (one ring hop each way,
        # 160-200 Mbit/s per second of the lab's DDP): a TBF at 300 Mbit/s there
        # costs the steps nothing measurable (+0 to +3 %), so it is no fault to find
        # (150 stays first: the CI seed's draw)
        return Scenario(name, [Fault("shape", k, rng.choice(["150mbit", "200mbit", "100mbit"]))],
                        [Expect("buffer_saturation", node)])
    if name == "shape-uplink":
        return Scenario(name, [Fault("uplink", "tor0", rng.choice(["150mbit", "200mbit",
                                                                    "300mbit"]))],
                        [Expect("buffer_saturation", {"tor": "tor0"})])
    if name == "cpu":
        return Scenario(name, [Fault("cpu", k, rng.choice([5, 8, 10]))],
                        [Expect("straggler_compute", node)])
    if name == "storage":
        return Scenario(name, [Fault("storage", None, rng.choice(["10mbit", "20mbit",
                                                                    "30mbit"]))],
                        [Expect("input_stall", {})])
    if name == "loss+cpu":
        # a straggler matters (and shows) only where its compute outlasts the network:
        # under heavy loss a mildly slow rank is hidden inside the ring's own waiting
        return Scenario(name, [Fault("loss", k, rng.choice([1, 2])),
                               Fault("cpu", other, rng.choice([5, 8]))],
                        [Expect("lossy_link", node),
                         Expect("straggler_compute", {"node": f"node{other}"})],
                        fault_steps=COMBINED_FAULT_STEPS)
    raise ValueError(f"unknown scenario {name!r}")


def apply(lab, fault: Fault) -> None:
    from lab import faults
    if fault.kind == "loss":
        faults.loss(lab, fault.target, fault.value)
    elif fault.kind == "shape":
        faults.shape(lab, fault.target, fault.value, "32kb")
    elif fault.kind == "uplink":
        faults.shape_uplink(lab, fault.target, fault.value, "32kb")
    elif fault.kind == "cpu":
        faults.cpu(lab, fault.target, fault.value)
    elif fault.kind == "storage":
        faults.storage(lab, rate=fault.value)
    else:
        raise ValueError(fault.kind)


def clear_all(lab) -> None:
    from lab import faults
    faults.clear(lab)


@dataclass
class Bench:
    """The lab, its stack and its data server, started once for many scenarios."""

    lab: object
    stack: object
    data_server: str
    store: object
    ports: list = field(default_factory=lambda: list(range(29600, 29700)))


@contextlib.contextmanager
def running_bench(replicas: int = 1, name: str | None = None):
    from diagnosis.store import Store
    from lab.dataserver import running_dataserver
    from lab.stack import running_stack
    from lab.testing import running_lab
    with running_lab(name, 4, wire_frames=True, tors=2) as lab, \
            running_dataserver(lab, None) as data_server, \
            running_stack(lab, collectors=replicas) as stack:
        yield Bench(lab, stack, data_server, Store(stack.influx.url))


def run_scenario(bench: Bench, scenario: Scenario, log=lambda msg: None) -> Outcome:
    from lab.training import start_training
    sc, lab = scenario, bench.lab
    port = bench.ports.pop(0)
    job = f"{lab.nodes[0].address}:{port}"
    out = Outcome(sc.name, "; ".join(f"{f.kind} {f.target} {f.value}" for f in sc.faults), job,
                  expected=[asdict(e) for e in sc.expect])
    fault_steps = sc.fault_steps
    steps = WARM_STEPS + fault_steps + (CLEARED_STEPS if sc.cleared else 0)
    start_ns = time.time_ns()
    try:
        with start_training(lab, steps, model_mb=MODEL_MB, master_port=port,
                            data_server=bench.data_server, data_bytes=DATA_BYTES,
                            checkpoint_every=10, timeout_s=300) as run:
            for row in run.steps():
                n = row["step"]
                if n == WARM_STEPS - 1 and sc.faults:
                    for f in sc.faults:
                        apply(lab, f)
                    out.onset_ns = time.time_ns()
                    log(f"  {sc.name}: fault on ({out.params})")
                if sc.cleared and n == WARM_STEPS + fault_steps - 1:
                    clear_all(lab)
                    out.clear_ns = time.time_ns()
                    _annotate(bench, job, out.clear_ns, "fault cleared")
                    log(f"  {sc.name}: fault cleared")
            if run.wait() != 0:
                raise RuntimeError(run.error)
    except BaseException as exc:
        if not isinstance(exc, Exception):
            raise
        out.error = str(exc)[:300]
    finally:
        clear_all(lab)
    end_ns = time.time_ns()
    time.sleep(SETTLE_S)
    if os.environ.get("FABRICSCOPE_MATRIX_DUMP"):
        _dump(bench, out, start_ns, os.environ["FABRICSCOPE_MATRIX_DUMP"])
    assess(out, sc, findings_of(bench.store, job, start_ns), bench.store, start_ns, end_ns)
    return out


def assess(out: Outcome, sc: Scenario, findings: list[Finding], store, start_ns: int,
           end_ns: int) -> None:
    """Judge the findings, and run the scenario's compare: around the clearing, or a
    healthy job against itself (live runs and bench/matrix_replay alike)."""
    judge(out, sc, findings)
    if sc.cleared and out.clear_ns:
        out.compare = _compare(store, out.job, out.onset_ns, out.clear_ns, end_ns)
    if sc.name == "healthy":
        first = _after_startup(store, out.job, start_ns, end_ns)
        if first:
            out.compare = _null_compare(store, out.job, first, end_ns)


def _after_startup(store, job: str, start_ns: int, end_ns: int) -> int | None:
    """When the job's third step began: its first two (imports, rendezvous, DDP's
    buckets) are start-up (thresholds.warmup_steps)."""
    from diagnosis.store import quote
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
    from diagnosis import compare as cmp
    from diagnosis.timespan import Span
    return _results(cmp.compare_samples(
        {m.name: deal(cmp.values(store, job, m.name, Span(start_ns, end_ns)))
         for m in cmp.METRICS}))


def deal(xs: list[float]) -> tuple[list[float], list[float]]:
    """Consecutive blocks of n^(1/3) samples dealt alternately into two windows."""
    from diagnosis.compare import block_length
    k = block_length(len(xs))
    return ([x for i, x in enumerate(xs) if (i // k) % 2 == 0],
            [x for i, x in enumerate(xs) if (i // k) % 2 == 1])


def _dump(bench: Bench, out: Outcome, start_ns: int, folder: str) -> None:
    """Debugging aid: the run's raw measurements as JSON (replayable offline)."""
    import json
    data = {"events": [{"event": "on", "ns": out.onset_ns}, {"event": "off",
                                                              "ns": out.clear_ns}],
            "nodes": [n.to_dict() for n in bench.lab.nodes], "outcome": out.to_dict()}
    for m in ("tcp_node", "tcp_flow", "gloo_step", "gloo_progress", "gloo_phase", "nic_window",
              "nic_qdisc", "agent_loss", "finding"):
        data[m] = bench.store.query(f'SELECT * FROM "{m}" WHERE time >= {start_ns - 30 * SECOND}')
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{out.scenario}-{out.job.replace(':', '_')}.json"), "w") as fh:
        json.dump(data, fh)


def _annotate(bench: Bench, job: str, at_ns: int, text: str) -> None:
    from fabricscope.records import Record
    bench.store.write([Record("annotation", at_ns, {"job": job},
                              {"text": text, "author": "diagnosis-matrix"})])


def _compare(store, job: str, a: int, b: int, c: int) -> dict:
    from diagnosis import compare as cmp
    from diagnosis.timespan import Span
    return _results(cmp.compare_samples(cmp.samples(store, job, Span(a, b), Span(b, c))))


def _results(results) -> dict:
    return {r.metric: {"verdict": r.verdict, "p_holm": r.p_holm, "change_pct": r.change_pct,
                       "drift": [r.drift_before, r.drift_after]} for r in results}


def findings_of(store, job: str, since_ns: int) -> list[Finding]:
    from diagnosis.store import quote
    rows = store.query(f"SELECT * FROM finding WHERE job = {quote(job)} AND "
                       f"time >= {since_ns - 60 * SECOND}")
    return [Finding.from_row({**r, **r.get("_tags", {})}) for r in rows]


def _matches(f: Finding, e: Expect) -> bool:
    return f.cause == e.cause and all(f.place.get(k) == v for k, v in e.place.items())


def judge(out: Outcome, sc: Scenario, findings: list[Finding]) -> None:
    serious = [f for f in findings if severity_rank(f.severity) >= 1]
    out.found = [{"cause": f.cause, "where": f.where, "severity": f.severity,
                  "first_seen_s": round((f.first_seen_ns - out.onset_ns) / 1e9, 2)
                  if out.onset_ns else None, "id": f.id,
                  "superseded_by": f.superseded_by,
                  "end_s": round((f.end_ns - out.onset_ns) / 1e9, 2)
                  if out.onset_ns and f.end_ns else None,
                  "summary": f.summary} for f in findings]
    expected = sc.expect
    # a fault's finding may close and open again (a gray-zone straggler between its
    # late steps): how fast it was found is its first finding's, its end the last's
    by_time = sorted(serious, key=lambda f: f.first_seen_ns)
    hits = [next((f for f in by_time if _matches(f, e)), None) for e in expected]
    lasts = [next((f for f in reversed(by_time) if _matches(f, e)), None) for e in expected]
    out.all_found = all(hits)
    top = primary(serious)
    out.primary_ok = (top is None) if not expected else \
        (top is not None and any(_matches(top, e) for e in expected))
    # false alarms: a warning that matches no expected cause and place
    explained = {id(f) for f in hits if f is not None}
    wrong = [f for f in serious
             if id(f) not in explained and not any(_matches(f, e) for e in expected)]
    right_ids = {f.id for f in serious if any(_matches(f, e) for e in expected)}
    out.moved = [f"{f.cause} at {f.where} ({f.severity})" for f in wrong
                 if f.superseded_by in right_ids]
    out.false_alarms = [f"{f.cause} at {f.where} ({f.severity})" for f in wrong
                        if f.superseded_by not in right_ids]
    if out.onset_ns:
        out.latency_s = [round((f.first_seen_ns - out.onset_ns) / 1e9, 2) for f in hits if f]
    if sc.cleared and out.clear_ns:
        ends = [f.end_ns for f in lasts if f is not None and f.end_ns]
        out.end_after_clear_s = round((max(ends) - out.clear_ns) / 1e9, 2) if ends else None
