"""The class causes, live: jobs of each kind with the split of their work drawn, judged by
what the collectors' engines wrote.

    python -m fabricscope.bench.class_matrix --set dev --runs 6
    python -m fabricscope.bench.class_matrix --set eval --runs 12 --json bench/results/class-eval.json
    python -m fabricscope.bench.class_matrix --family latency --set dev --runs 3
    python -m fabricscope.bench.class_matrix --family uplink --set eval --runs 9 \
        --json bench/results/class-uplink-eval.json
    python -m fabricscope.bench.class_matrix --family tail --set dev --runs 6

A run is one job on a bench (bench/scenarios.py running_bench: a leaf-spine lab,
InfluxDB, two collector replicas, an agent per node), drawn from its seed alone.
Four families of runs, each its own scenario space:

    split      an uneven split of the work, on 3-5 nodes on 1-2 ToRs:
      moe        MoE training (lab/workloads/moe.py), routing skew 0.8-2.0 with the
                 hot experts on a drawn rank; healthy: uniform routing
      pipeline   one stage per rank (lab/workloads/pipeline.py), a drawn stage holding
                 4-8x the layers of the others; healthy: balanced stages
    uplink     MoE training with uniform routing (UPLINK_TOKENS tokens per rank and
               step) on 4-6 nodes on 2-3 ToRs; after
               ONSET_S of healthy steps the uplink of a drawn ToR with two nodes or
               more is shaped by a shallow TBF (50-200 Mbit/s, burst 8-32 kB, the
               lab's 2 ms queue: a fraction of the n (N - n) / (N - 1) nodes' worth of
               each exchange that crosses it); healthy: no shaper
    latency    sharded training (FSDP2, LATENCY_LAYERS layers) on 3-5 nodes on 1-2
               ToRs; after ONSET_S of healthy steps every frame toward every node
               waits LATENCY_MS (lab.delay_stage on every port): its latency rose,
               without loss; healthy: no delay
    tail       a served model (lab/workloads/serve.py, MoE or pipeline, Poisson
               arrivals at TAIL_RATE) on 3-5 nodes on 1-2 ToRs; after TAIL_ONSET_S of
               healthy requests every frame toward one drawn node waits TAIL_MS (its
               port's delay stage); healthy: no delay

Every third run is healthy. The skew is there from the job's first step, so its
time to finding is counted from the job's first collective; the shaper's from its
onset, and its cost is the median step after it over the median step before. A
faulty run is right when a warning names its cause at its rank (split) or its ToR
(uplink) and no other warning is raised; a shaper that cost less than MILD of the
step need not be named (the bar of every cause); a healthy run is right when it
raises no warning. A served model's cost is its median request after the onset over
the median before (a P99 of a few dozen requests is their slowest, a warm-up's as
likely as the fault's); its warning must name tail_latency at the delayed node.

Two seed ranges per family keep the development set apart from the evaluation set,
as the network matrix's (bench/scenario_space.py).
"""

from __future__ import annotations

import argparse
import enum
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

from fabricscope.bench.scenario_space import (EVERY_NODE, Element, Fault, FaultKind, LabShape,
                                               SetName)
from fabricscope.diagnosis.evidence import SECOND
from fabricscope.diagnosis.finding import severity_rank
from fabricscope.errors import UserError


class Family(str, enum.Enum):
    SPLIT = "split"          # an uneven split of the work: hot experts, a slow stage
    UPLINK = "uplink"        # MoE across racks, one ToR's uplink narrowed
    LATENCY = "latency"      # sharded training, every port's latency raised
    TAIL = "tail"            # a served model, one node's port delayed


#: the first seed of each family's sets; run i is drawn from its base + i
CLASS_BASE = {SetName.DEV: 20_000, SetName.EVAL: 95_000}
UPLINK_BASE = {SetName.DEV: 21_000, SetName.EVAL: 96_000}
LATENCY_BASE = {SetName.DEV: 22_000, SetName.EVAL: 97_000}
TAIL_BASE = {SetName.DEV: 23_000, SetName.EVAL: 98_000}
#: the latency family's delay on every port, one way (a round trip pays it twice)
LATENCY_MS = (1.0, 5.0)
#: layers of the latency family's FSDP job: a few small collectives each (AllGather,
#: AllGather, ReduceScatter), so that the step is many round trips, not bandwidth
LATENCY_LAYERS = 16
#: the tail family's delay at one node's port, one way, and its requests per second: a
#: 2-layer MoE request takes 40-80 ms on 3-5 of the lab's ranks (on 2 cores), so up to
#: 6 a second keeps the server under about half busy; at 13 a second a 5-node server
#: was saturated before any fault (its queue grows without end)
TAIL_MS = (1.0, 5.0)
TAIL_RATE = (3.0, 6.0)
#: healthy requests before the tail family's fault: its baseline is the first
#: classification's requests once they are REQUESTS_BASELINE (diagnosis/detect_class.py),
#: which at the lowest rate is the second classification (EVERY_S = 10 s apart) after
#: the collector finds the job
TAIL_ONSET_S = 25.0
HEALTHY_EVERY = 3
UPLINK_MBIT = (50, 200)
UPLINK_BURST_KB = (8, 32)
#: tokens per rank per step of the uplink family's MoE job: each exchange then carries
#: about 0.37 MB per rank (at the default 32, 46 kB: a shaper of a few hundred Mbit/s
#: cost its steps 4 %, measured, and no fault that costs nothing is worth a finding)
UPLINK_TOKENS = 256
SKEW = (0.8, 2.0)
STAGE_SKEW = (4.0, 8.0)
RUN_S = 35.0            # two analyses (every 10 s over 30 s) after the job is found
ONSET_S = 12.0          # uplink family: healthy steps first (the engine's baseline)
MILD = 0.10             # a fault that costs less of the step need not be named
SETTLE_S = 4.0
MODEL_MB = 2


@dataclass(frozen=True)
class ClassRun:
    seed: int
    kind: str                   # moe, pipeline, fsdp or serve
    lab: LabShape
    healthy: bool
    knobs: dict = field(default_factory=dict, compare=False)
    rank: int | None = None     # the skewed rank (hot experts, slow stage)
    fault: Fault | None = None  # the shaped uplink (family uplink)
    onset_s: float = 0.0        # healthy steps before the fault (and as long for a healthy run)
    batch: int = 32             # samples (MoE: tokens) per rank per step

    @property
    def cause(self) -> str | None:
        if self.healthy:
            return None
        if self.kind == "serve":
            return "tail_latency"
        if self.fault is not None:
            return self.fault.expected_cause() if self.fault.kind is FaultKind.DELAY \
                else "bisection_limit"
        return "alltoall_skew" if self.kind == "moe" else "stage_imbalance"

    def expected(self) -> dict | None:
        """The warning that names the fault: its cause and its rank or ToR."""
        if self.healthy:
            return None
        if self.fault is not None:
            return {"cause": self.cause, **self.fault.expected_place()}
        return {"cause": self.cause, "rank": str(self.rank)}

    def describe(self) -> str:
        what = "healthy" if self.healthy else self.fault.describe() if self.fault else (
            f"skew {self.knobs['skew']:g} hot on rank {self.rank}" if self.kind == "moe"
            else f"stage {self.rank} holds {self.knobs['stage_skew']:g}x the layers")
        kind = f"serve ({self.knobs['serve_mode']}, {self.knobs['rate']:g}/s)" \
            if self.kind == "serve" else self.kind
        return (f"seed {self.seed}: {kind}, {self.lab.nodes} nodes on {self.lab.tors} "
                f"ToR(s), {what}")


def draw(seed: int) -> ClassRun:
    rng = random.Random(seed)
    nodes = rng.randint(3, 5)
    lab = LabShape(nodes, rng.randint(1, 2), MODEL_MB)
    kind = rng.choice(("moe", "pipeline"))
    healthy = seed % HEALTHY_EVERY == 0
    rank = rng.randrange(nodes)
    if kind == "moe":
        skew = 0.0 if healthy else round(rng.uniform(*SKEW), 2)
        return ClassRun(seed, kind, lab, healthy, {"layers": 2, "skew": skew, "hot_rank": rank},
                        None if healthy else rank)
    if healthy:
        return ClassRun(seed, kind, lab, True, {"layers": 2})
    return ClassRun(seed, kind, lab, False, {"layers": 2, "slow_stage": rank,
                                             "stage_skew": round(rng.uniform(*STAGE_SKEW), 1)},
                    rank)


def draw_uplink(seed: int) -> ClassRun:
    """A MoE job across racks, the uplink of a ToR with two of its nodes or more shaped
    (a ToR with one node is its port, to the job's hops: the network matrix's)."""
    from fabricscope.lab.naming import tor_blocks
    rng = random.Random(seed)
    nodes = rng.randint(4, 6)
    tors = rng.randint(2, 3) if nodes == 6 else 2
    lab = LabShape(nodes, tors, MODEL_MB)
    racks = [f"tor{k}" for k, block in enumerate(tor_blocks(nodes, tors)) if len(block) >= 2]
    fault = Fault(FaultKind.SHAPE, Element.UPLINK, rng.choice(racks), rng.randint(*UPLINK_MBIT),
                  rng.randint(*UPLINK_BURST_KB))
    healthy = seed % HEALTHY_EVERY == 0
    return ClassRun(seed, "moe", lab, healthy, {"layers": 2, "skew": 0.0, "hot_rank": 0},
                    fault=None if healthy else fault, onset_s=ONSET_S, batch=UPLINK_TOKENS)


def draw_latency(seed: int) -> ClassRun:
    """Sharded training (FSDP2, LATENCY_LAYERS layers: AllGather, AllGather and
    ReduceScatter of each) on 3-5 nodes; after ONSET_S of healthy steps every frame
    toward every node waits LATENCY_MS (each port's delay stage): the fabric's
    latency rose, with no loss and no queue that overflows."""
    rng = random.Random(seed)
    nodes = rng.randint(3, 5)
    lab = LabShape(nodes, rng.randint(1, 2), MODEL_MB)
    fault = Fault(FaultKind.DELAY, Element.PORT, EVERY_NODE,
                  round(rng.uniform(*LATENCY_MS), 1))
    healthy = seed % HEALTHY_EVERY == 0
    return ClassRun(seed, "fsdp", lab, healthy, {"layers": LATENCY_LAYERS},
                    fault=None if healthy else fault, onset_s=ONSET_S)


def draw_tail(seed: int) -> ClassRun:
    """A served model (lab/workloads/serve.py, MoE or pipeline, Poisson arrivals at
    TAIL_RATE) on 3-5 nodes; after TAIL_ONSET_S of healthy requests every frame toward one
    drawn node waits TAIL_MS (its port's delay stage): the requests that cross it
    are slower, with no loss and no period to judge them by."""
    rng = random.Random(seed)
    nodes = rng.randint(3, 5)
    lab = LabShape(nodes, rng.randint(1, 2), MODEL_MB)
    mode = rng.choice(("moe", "pipeline"))
    rate = round(rng.uniform(*TAIL_RATE), 1)
    fault = Fault(FaultKind.DELAY, Element.PORT, f"node{rng.randrange(nodes)}",
                  round(rng.uniform(*TAIL_MS), 1))
    healthy = seed % HEALTHY_EVERY == 0
    return ClassRun(seed, "serve", lab, healthy, {"serve_mode": mode, "layers": 2, "rate": rate},
                    fault=None if healthy else fault, onset_s=TAIL_ONSET_S)


DRAW = {Family.SPLIT: (CLASS_BASE, draw), Family.UPLINK: (UPLINK_BASE, draw_uplink),
        Family.LATENCY: (LATENCY_BASE, draw_latency), Family.TAIL: (TAIL_BASE, draw_tail)}


def _names(f: dict, expected: dict | None) -> bool:
    return bool(expected) and all(f.get(k) == v for k, v in expected.items())


@dataclass
class ClassOutcome:
    seed: int
    kind: str
    params: str
    lab: dict
    expected: dict | None
    ok: bool = False
    found: list = field(default_factory=list)     # [{cause, rank, severity, first_seen_s}]
    false_alarms: int = 0
    latency_s: float | None = None
    error: str = ""
    cost: float | None = None   # uplink: the fault's share of the step (median after / before - 1)
    mild: bool = False          # cost under MILD: naming it is not required
    #: the job's last classification: its class, period and exchange ops per step
    job_class: dict = field(default_factory=dict)


def run_class(bench, r: ClassRun, log=lambda msg: None, dump: str = "") -> ClassOutcome:
    """Run `r` as a job of its own in the bench's lab for r.onset_s + RUN_S, its fault
    (if any) from r.onset_s on, and judge the findings; with `dump` (a folder), write
    the run's rows there (_dump)."""
    from fabricscope.bench.scenarios import apply, clear_all, findings_of
    from fabricscope.lab.training import start_training
    lab = bench.lab
    port = bench.ports.pop(0)
    job = f"{lab.nodes[0].address}:{port}"
    out = ClassOutcome(r.seed, r.kind, r.describe(), asdict(r.lab), r.expected())
    start_ns, first_ns, onset_ns = time.time_ns(), 0, 0
    before, after = [], []          # rank 0's step seconds, before and after the onset
    try:
        with start_training(lab, 1_000_000, model_mb=r.lab.model_mb, master_port=port,
                            batch=r.batch, timeout_s=600, kind=r.kind, knobs=r.knobs) as run:
            for row in run.steps():
                now = time.time_ns()
                first_ns = first_ns or now
                if r.fault is not None and not onset_ns and \
                        now - first_ns >= r.onset_s * SECOND:
                    # from its first element on: a delay stage takes a second or two to
                    # start, one port after the other
                    onset_ns = time.time_ns()
                    apply(lab, r.fault)
                (after if onset_ns else before).append(row["seconds"])
                if now - first_ns >= (r.onset_s + RUN_S) * SECOND:
                    run.terminate()
                    break
            else:
                if run.wait() != 0:
                    raise RuntimeError(run.error)
    except Exception as exc:        # judged as a run with an error, the set goes on
        out.error = str(exc)[:300]
    finally:
        if r.fault is not None:
            clear_all(lab)           # the bench's lab serves the next run of its shape
    time.sleep(SETTLE_S)
    if before[2:] and after[1:]:        # past the warm-up and the step the onset cut
        out.cost = _cost(before[2:], after[1:])
        out.mild = out.cost < MILD
    since_ns = onset_ns or first_ns
    findings = [f for f in findings_of(bench.store, job, start_ns)
                if severity_rank(f.severity) >= 1 and not f.superseded_by]
    out.found = [{"cause": str(f.cause), "rank": f.place.get("rank"), "tor": f.place.get("tor"),
                  "node": f.place.get("node"),
                  "severity": f.severity,
                  "first_seen_s": round((f.first_seen_ns - since_ns) / SECOND, 1)
                  if since_ns else None} for f in findings]
    out.job_class = _last_class(bench.store, job, start_ns)
    right = [f for f in out.found if _names(f, out.expected)]
    out.false_alarms = len(out.found) - len(right)
    out.ok = not out.error and not out.false_alarms and (bool(right) or r.healthy or out.mild)
    if right and right[0]["first_seen_s"] is not None:
        out.latency_s = min(f["first_seen_s"] for f in right)
    log(f"  {'right' if out.ok else 'WRONG'}: cost {out.cost}, found {out.found}, "
        f"class {out.job_class}")
    if dump:
        _dump(bench, out, job, start_ns, onset_ns, dump)
    return out


#: what a dump holds: the job's rows, and its nodes' of its time
DUMPED_JOB = ("tcp_flow", "gloo_step", "gloo_progress", "gloo_phase", "gloo_collective",
              "job_class", "finding")
DUMPED_NODES = ("tcp_node", "nic_window")


def _dump(bench, out: ClassOutcome, job: str, start_ns: int, onset_ns: int,
          folder: str) -> None:
    """The run's rows as the store answers them, gzipped JSON in `folder` (SEED.json.gz),
    to follow the engine's and the analyzer's decisions after the fact."""
    import gzip
    import os

    from fabricscope.diagnosis.store import quote
    since = f"time >= {start_ns - 30 * SECOND}"
    data = {"outcome": asdict(out), "job": job, "onset_ns": onset_ns,
            "nodes": [n.to_dict() for n in bench.lab.nodes]}
    for m in DUMPED_NODES:
        data[m] = bench.store.query(f'SELECT * FROM "{m}" WHERE {since}')
    for m in DUMPED_JOB:
        data[m] = bench.store.query(f'SELECT * FROM "{m}" WHERE {since} AND job = {quote(job)}')
    os.makedirs(folder, exist_ok=True)
    with gzip.open(os.path.join(folder, f"{out.seed}.json.gz"), "wt") as fh:
        json.dump(data, fh, separators=(",", ":"))


def _cost(before: list[float], after: list[float]) -> float:
    """The fault's share of the step (of a served model's request: its latency): the
    median after the onset over the median before."""
    return round(statistics.median(after) / statistics.median(before) - 1, 3)


def _last_class(store, job: str, since_ns: int) -> dict:
    from fabricscope.diagnosis.store import quote
    rows = store.query(f"SELECT * FROM job_class WHERE job = {quote(job)} AND "
                       f"time >= {since_ns} ORDER BY time DESC LIMIT 1")
    if not rows:
        return {}
    r = {**rows[0], **rows[0].get("_tags", {})}
    return {k: r.get(k) for k in ("class", "period_s", "collectives_per_step", "p50_bytes")}


def run_set(set_name: SetName, runs: int, first: int = 0, log=print,
            family: Family = Family.SPLIT, dump: str = "") -> list[ClassOutcome]:
    from fabricscope.bench.scenarios import running_bench
    base, draw_one = DRAW[family]
    drawn = [draw_one(base[set_name] + i) for i in range(first, first + runs)]
    by_shape: dict = {}
    for r in drawn:
        by_shape.setdefault((r.lab.nodes, r.lab.tors), []).append(r)
    out = []
    for _, group in sorted(by_shape.items()):
        with running_bench(group[0].lab, replicas=2) as bench:
            for r in group:
                log(r.describe())
                out.append(run_class(bench, r, log, dump))
    return sorted(out, key=lambda o: o.seed)


def summarize(outcomes: list[ClassOutcome]) -> dict:
    skewed = [o for o in outcomes if o.expected and not o.mild]
    healthy = [o for o in outcomes if not o.expected]
    warnings = sum(len(o.found) for o in outcomes)
    right_warnings = sum(len(o.found) - o.false_alarms for o in outcomes)
    latencies = sorted(o.latency_s for o in skewed if o.latency_s is not None)

    def share(n: int, d: int):
        return round(n / d, 4) if d else None
    return {"runs": len(outcomes), "skewed": len(skewed), "healthy": len(healthy),
            "mild": sum(o.mild for o in outcomes),
            "right": share(sum(o.ok for o in outcomes), len(outcomes)),
            "named": share(sum(any(_names(f, o.expected) for f in o.found) for o in skewed),
                           len(skewed)),
            "precision": share(right_warnings, warnings),
            "healthy_warnings": sum(len(o.found) for o in healthy),
            "latency_median_s": statistics.median(latencies) if latencies else None,
            "latency_max_s": latencies[-1] if latencies else None,
            "errors": sum(bool(o.error) for o in outcomes)}


def text(summary: dict, outcomes: list[ClassOutcome]) -> str:
    rows = [f"{o.seed:>6} {'right' if o.ok else 'WRONG':<6} {o.params}"
            + (f"; cost {o.cost:+.0%}" if o.cost is not None else "") + "; found "
            f"{[(f['cause'], f['tor'] or f['rank'] or f['node'], f['first_seen_s']) for f in o.found]}"
            + (f"; error {o.error}" if o.error else "") for o in outcomes]
    s = summary
    rows.append(f"\n{s['runs']} runs ({s['skewed']} faulty, {s['healthy']} healthy, "
                f"{s['mild']} with a fault under {MILD:.0%} of the step): right "
                f"{s['right']}, named at its place {s['named']}, warnings precision "
                f"{s['precision']}, {s['healthy_warnings']} warnings on healthy runs; job "
                f"start -> first_seen median {s['latency_median_s']} s, max "
                f"{s['latency_max_s']} s; {s['errors']} runs with errors")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fabricscope.bench.class_matrix",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--family", choices=[f.value for f in Family], default="split")
    p.add_argument("--set", choices=[s.value for s in SetName], default="dev")
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--json", help="write the summary and runs to this file")
    p.add_argument("--dump", metavar="DIR", default="",
                   help="write each run's rows to DIR/SEED.json.gz")
    args = p.parse_args(argv)
    if args.runs < 1 or args.first < 0:
        p.error("--runs must be at least 1 and --first at least 0")
    try:
        outcomes = run_set(SetName(args.set), args.runs, args.first,
                           log=lambda m: print(m, file=sys.stderr, flush=True),
                           family=Family(args.family), dump=args.dump)
    except UserError as exc:
        print(exc.one_line(), file=sys.stderr)
        return exc.exit_code
    summary = summarize(outcomes)
    print(text(summary, outcomes))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"command": "python -m fabricscope.bench.class_matrix " +
                       " ".join(argv if argv is not None else sys.argv[1:]),
                       "summary": summary, "runs": [asdict(o) for o in outcomes]}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
