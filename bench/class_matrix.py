"""The class causes, live: jobs of each kind with the split of their work drawn, judged by
what the collectors' engines wrote.

    python -m fabricscope.bench.class_matrix --set dev --runs 6
    python -m fabricscope.bench.class_matrix --set eval --runs 12 --json bench/results/class-eval.json

A run is one job on a bench (bench/scenarios.py running_bench: a leaf-spine lab,
InfluxDB, two collector replicas, an agent per node), drawn from its seed alone:

    moe        MoE training (lab/workloads/moe.py), routing skew 0.8-2.0 with the hot
               experts on a drawn rank; healthy: uniform routing
    pipeline   one stage per rank (lab/workloads/pipeline.py), a drawn stage holding
               4-8x the layers of the others; healthy: balanced stages

on a lab of 3-5 nodes on 1-2 ToRs; every third run is healthy. The skew is there
from the job's first step, so time to finding is counted from the job's first
collective. A skewed run is right when a warning names its cause at its rank and no
other warning is raised; a healthy run when it raises no warning. Sharded latency
and served-model tails need delay without loss, which this lab cannot add (no
netem): their causes are held by unit tests (tests/unit/test_diagnosis_class_causes.py).

Two seed ranges keep the development set apart from the evaluation set, as the
network matrix's (bench/scenario_space.py).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

from fabricscope.bench.scenario_space import LabShape, SetName
from fabricscope.diagnosis.evidence import SECOND
from fabricscope.diagnosis.finding import severity_rank
from fabricscope.errors import UserError

#: the first seed of each set; run i is drawn from CLASS_BASE + i
CLASS_BASE = {SetName.DEV: 20_000, SetName.EVAL: 95_000}
HEALTHY_EVERY = 3
SKEW = (0.8, 2.0)
STAGE_SKEW = (4.0, 8.0)
RUN_S = 35.0            # two analyses (every 10 s over 30 s) after the job is found
SETTLE_S = 4.0
MODEL_MB = 2


@dataclass(frozen=True)
class ClassRun:
    seed: int
    kind: str                   # moe or pipeline
    lab: LabShape
    healthy: bool
    knobs: dict = field(default_factory=dict, compare=False)
    rank: int | None = None     # the skewed rank (hot experts, slow stage)

    @property
    def cause(self) -> str | None:
        if self.healthy:
            return None
        return "alltoall_skew" if self.kind == "moe" else "stage_imbalance"

    def describe(self) -> str:
        what = "healthy" if self.healthy else (
            f"skew {self.knobs['skew']:g} hot on rank {self.rank}" if self.kind == "moe"
            else f"stage {self.rank} holds {self.knobs['stage_skew']:g}x the layers")
        return (f"seed {self.seed}: {self.kind}, {self.lab.nodes} nodes on {self.lab.tors} "
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


def run_class(bench, r: ClassRun, log=lambda msg: None) -> ClassOutcome:
    """Run `r` as a job of its own in the bench's lab for RUN_S and judge the findings."""
    from fabricscope.bench.scenarios import findings_of
    from fabricscope.lab.training import start_training
    lab = bench.lab
    port = bench.ports.pop(0)
    job = f"{lab.nodes[0].address}:{port}"
    out = ClassOutcome(r.seed, r.kind, r.describe(), asdict(r.lab),
                       None if r.healthy else {"cause": r.cause, "rank": str(r.rank)})
    start_ns, first_ns = time.time_ns(), 0
    try:
        with start_training(lab, 1_000_000, model_mb=r.lab.model_mb, master_port=port,
                            timeout_s=600, kind=r.kind, knobs=r.knobs) as run:
            for _row in run.steps():
                first_ns = first_ns or time.time_ns()
                if time.time_ns() - first_ns >= RUN_S * SECOND:
                    run.terminate()
                    break
            else:
                if run.wait() != 0:
                    raise RuntimeError(run.error)
    except Exception as exc:        # judged as a run with an error, the set goes on
        out.error = str(exc)[:300]
    time.sleep(SETTLE_S)
    findings = [f for f in findings_of(bench.store, job, start_ns)
                if severity_rank(f.severity) >= 1 and not f.superseded_by]
    out.found = [{"cause": str(f.cause), "rank": f.place.get("rank"), "severity": f.severity,
                  "first_seen_s": round((f.first_seen_ns - first_ns) / SECOND, 1)
                  if first_ns else None} for f in findings]
    right = [f for f in out.found if out.expected and f["cause"] == out.expected["cause"]
             and f["rank"] == out.expected["rank"]]
    out.false_alarms = len(out.found) - len(right)
    out.ok = not out.error and not out.false_alarms and (bool(right) or r.healthy)
    if right and right[0]["first_seen_s"] is not None:
        out.latency_s = min(f["first_seen_s"] for f in right)
    log(f"  {'right' if out.ok else 'WRONG'}: {out.found}")
    return out


def run_set(set_name: SetName, runs: int, first: int = 0, log=print) -> list[ClassOutcome]:
    from fabricscope.bench.scenarios import running_bench
    drawn = [draw(CLASS_BASE[set_name] + i) for i in range(first, first + runs)]
    by_shape: dict = {}
    for r in drawn:
        by_shape.setdefault((r.lab.nodes, r.lab.tors), []).append(r)
    out = []
    for _, group in sorted(by_shape.items()):
        with running_bench(group[0].lab, replicas=2) as bench:
            for r in group:
                log(r.describe())
                out.append(run_class(bench, r, log))
    return sorted(out, key=lambda o: o.seed)


def summarize(outcomes: list[ClassOutcome]) -> dict:
    skewed = [o for o in outcomes if o.expected]
    healthy = [o for o in outcomes if not o.expected]
    warnings = sum(len(o.found) for o in outcomes)
    right_warnings = sum(len(o.found) - o.false_alarms for o in outcomes)
    latencies = sorted(o.latency_s for o in skewed if o.latency_s is not None)

    def share(n: int, d: int):
        return round(n / d, 4) if d else None
    return {"runs": len(outcomes), "skewed": len(skewed), "healthy": len(healthy),
            "right": share(sum(o.ok for o in outcomes), len(outcomes)),
            "named": share(sum(any(f["cause"] == o.expected["cause"] and f["rank"] ==
                                   o.expected["rank"] for f in o.found) for o in skewed),
                           len(skewed)),
            "precision": share(right_warnings, warnings),
            "healthy_warnings": sum(len(o.found) for o in healthy),
            "latency_median_s": statistics.median(latencies) if latencies else None,
            "latency_max_s": latencies[-1] if latencies else None,
            "errors": sum(bool(o.error) for o in outcomes)}


def text(summary: dict, outcomes: list[ClassOutcome]) -> str:
    rows = [f"{o.seed:>6} {'right' if o.ok else 'WRONG':<6} {o.params}; found "
            f"{[(f['cause'], f['rank'], f['first_seen_s']) for f in o.found]}"
            + (f"; error {o.error}" if o.error else "") for o in outcomes]
    s = summary
    rows.append(f"\n{s['runs']} runs ({s['skewed']} skewed, {s['healthy']} healthy): right "
                f"{s['right']}, skew named at its rank {s['named']}, warnings precision "
                f"{s['precision']}, {s['healthy_warnings']} warnings on healthy runs; job "
                f"start -> first_seen median {s['latency_median_s']} s, max "
                f"{s['latency_max_s']} s; {s['errors']} runs with errors")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fabricscope.bench.class_matrix",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--set", choices=[s.value for s in SetName], default="dev")
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--json", help="write the summary and runs to this file")
    args = p.parse_args(argv)
    if args.runs < 1 or args.first < 0:
        p.error("--runs must be at least 1 and --first at least 0")
    try:
        outcomes = run_set(SetName(args.set), args.runs, args.first,
                           log=lambda m: print(m, file=sys.stderr, flush=True))
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
