"""diagnosis-matrix: how often the engine names the right cause and place, how fast,
over scenarios drawn from the space of bench/scenario_space.py.

    fabricscope bench diagnosis-matrix [--set dev|eval] [--runs N] [--first K] [--json]
    python -m bench.diagnosis_matrix --set eval --runs 60

Run i of a set is drawn from its own seed (the set's base + i) and printed with
its parameters. Runs of one lab shape (nodes, ToRs) share one lab, stack and
data server, brought up once; every run is a training job of its own. Everything
is judged from the findings the live engine wrote (bench/scenarios.judge).

The report, for the set's runs:
- right: the primary warning names a fault's cause and place, every fault that
  cost >= 10 % of the step time is named, and no warning names anything else;
  cause accuracy and place accuracy over the faulty runs apart;
- precision of warnings (the distinct warnings that name a fault, over all) and
  recall (the faults that had to be named and were);
- warnings on healthy runs; runs whose named cause or place changed after it was
  first raised (a warning a right finding took over);
- onset -> first_seen, median and p95; a confusion matrix of the fault's cause
  against the primary warning's.
The development set is for work; the evaluation set is run only to measure it
(docs/DIAGNOSIS.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter

from bench.harness import percentile
from bench.scenario_space import SetName, draw, seeds
from bench.scenarios import run_scenario, running_bench
from fabricscope.errors import UserError

NONE = "none"


def run_set(set_name: SetName, runs: int, first: int = 0, replicas: int = 2,
            log=lambda msg: print(msg, file=sys.stderr, flush=True)):
    drawn = [draw(s) for s in seeds(set_name, runs, first)]
    outcomes = []
    by_shape: dict = {}
    for d in drawn:
        by_shape.setdefault((d.lab.nodes, d.lab.tors), []).append(d)
    done = 0
    for (nodes, tors), group in sorted(by_shape.items()):
        with running_bench(group[0].lab, replicas=replicas) as bench:
            for d in group:
                done += 1
                log(f"[{done}/{len(drawn)}] {d.describe()}")
                out = run_scenario(bench, d, log)
                log(f"  -> {'right' if out.ok else 'WRONG'}; cost {out.cost}; found "
                    f"{[(f['cause'], f['where'], f['severity'], f['first_seen_s']) for f in out.found if f['severity'] != 'info']}"
                    + (f"; error {out.error}" if out.error else ""))
                outcomes.append(out)
    return outcomes


def truth(o) -> str:
    """The cause of the run's first fault that had to be named ('none': healthy, or a
    fault too mild to matter)."""
    return next((e["cause"] for e in o.expected if e.get("required", True)), NONE)


def summarize(outcomes) -> dict:
    faulty = [o for o in outcomes if o.required]
    healthy = [o for o in outcomes if o.scenario == "healthy"]
    lat = sorted(x for o in outcomes for x in o.latency_s)
    warnings = sum(o.warnings for o in outcomes)
    must = sum(sum(e.get("required", True) for e in o.expected) for o in outcomes)
    found = sum(n for o in outcomes for n, e in zip(o.named, o.expected)
                if e.get("required", True))

    def share(n, d):
        return round(n / d, 4) if d else None
    confusion = Counter((truth(o), o.primary["cause"] if o.primary else NONE)
                        for o in outcomes)
    return {
        "runs": len(outcomes), "faulty": len(faulty), "healthy": len(healthy),
        "mild": len(outcomes) - len(faulty) - len(healthy),
        "right": share(sum(o.ok for o in faulty), len(faulty)),
        "cause_accuracy": share(sum(o.cause_ok for o in faulty), len(faulty)),
        "place_accuracy": share(sum(o.primary_ok for o in faulty), len(faulty)),
        "precision": share(sum(o.right_warnings for o in outcomes), warnings),
        "recall": share(found, must),
        "healthy_warnings": sum(o.warnings for o in healthy),
        "changed": share(sum(bool(o.moved) for o in faulty), len(faulty)),
        "both_of_two": share(sum(o.every_found for o in outcomes if len(o.expected) == 2),
                             sum(len(o.expected) == 2 for o in outcomes)),
        "errors": sum(bool(o.error) for o in outcomes),
        "latency_median_s": statistics.median(lat) if lat else None,
        "latency_p95_s": percentile(lat, 95),
        "confusion": {f"{t} -> {n}": c for (t, n), c in sorted(confusion.items())},
    }


def text(summary: dict, outcomes) -> str:
    rows = [f"{'seed':>6} {'kind':<8} {'lab':<10} {'cost':>6}  {'verdict':<7} "
            "primary warning; faults"]
    for o in outcomes:
        lab = f"{o.lab.get('nodes')}n/{o.lab.get('tors')}t/{o.lab.get('model_mb')}M"
        cost = "-" if o.cost is None else f"{o.cost:+.0%}"
        top = f"{o.primary['cause']} at {o.primary['place']}" if o.primary else "none"
        rows.append(f"{o.seed:>6} {o.scenario:<8} {lab:<10} {cost:>6}  "
                    f"{'right' if o.ok else 'WRONG':<7} {top}; {o.params}")
    s = summary

    def pct(v):
        return "-" if v is None else f"{v:.1%}"
    rows.append(
        f"\n{s['runs']} runs ({s['faulty']} faulty, {s['healthy']} healthy, {s['mild']} with a "
        f"fault under 10 % of the step): right {pct(s['right'])}, cause {pct(s['cause_accuracy'])},"
        f" place {pct(s['place_accuracy'])}; warnings precision {pct(s['precision'])}, recall "
        f"{pct(s['recall'])}; {s['healthy_warnings']} warnings on healthy runs; changed after "
        f"first raised {pct(s['changed'])}; both of two faults named {pct(s['both_of_two'])}; "
        f"onset -> first_seen median {s['latency_median_s']} s,"
        f" p95 {s['latency_p95_s']} s; {s['errors']} runs with errors")
    rows.append("confusion (fault -> primary warning): " +
                ", ".join(f"{k}: {v}" for k, v in s["confusion"].items()))
    return "\n".join(rows)


class Matrix:
    name = "diagnosis-matrix"
    description = "diagnosis accuracy, false alarms and latency over drawn scenarios"
    goal = (">= 97 % of faulty runs right, precision >= 98 %, no warning when healthy, "
            "changed <= 2 %, first_seen median <= 3 s, p95 <= 6 s")

    def report(self, args) -> str:
        outcomes = run_set(SetName.DEV, args.repeats or 12)
        summary = summarize(outcomes)
        if args.json:
            return json.dumps({"summary": summary, "runs": [o.to_dict() for o in outcomes]},
                              indent=1)
        return text(summary, outcomes)


BENCH = Matrix()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.diagnosis_matrix",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--set", choices=[s.value for s in SetName], default=SetName.DEV.value,
                   help="the development set (for work) or the evaluation set (to measure)")
    p.add_argument("--runs", type=int, default=12)
    p.add_argument("--first", type=int, default=0, help="the set's first run to draw")
    p.add_argument("--json", help="also write the runs and the summary to this file")
    args = p.parse_args(argv)
    if args.runs < 1 or args.first < 0:
        p.error("--runs must be at least 1 and --first at least 0")
    try:
        outcomes = run_set(SetName(args.set), args.runs, args.first)
    except UserError as exc:
        print(exc.one_line(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:       # SIGINT, or SIGTERM (the lab turns it into this)
        print("bench.diagnosis_matrix: interrupted; the lab and its servers are down, "
              "and no summary is printed for the runs cut short", file=sys.stderr)
        return 130
    summary = summarize(outcomes)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"summary": summary, "runs": [o.to_dict() for o in outcomes]}, fh,
                      indent=1)
    print(text(summary, outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
