"""diagnosis-matrix: how often the engine names the right cause and place, how fast.

    fabricscope bench diagnosis-matrix [--repeats N] [--json]

Runs every scenario of bench/scenarios.py N times (parameters drawn anew each
time, seeded) in one leaf-spine lab with two collector replicas, and prints per
scenario: runs, right primary cause and place, every expected finding found,
false alarms (warnings that match no fault), onset -> first_seen (median, p95),
for the cleared fault its end after the clearing, and the compare verdicts.
Everything is read back from the findings the live engine wrote.
"""

from __future__ import annotations

import json
import random
import statistics
import sys

from bench.harness import percentile
from bench.scenarios import NAMES, draw, run_scenario, running_bench
from fabricscope.errors import UserError


def run_matrix(repeats: int, seed: int = 1, names: list[str] = NAMES, replicas: int = 2,
               log=lambda msg: print(msg, file=sys.stderr, flush=True)):
    rng = random.Random(seed)
    outcomes = []
    with running_bench(replicas=replicas) as bench:
        for r in range(repeats):
            for name in names:
                sc = draw(name, rng)
                log(f"[{r + 1}/{repeats}] {name}: {', '.join(f'{f.kind} {f.target} {f.value}' for f in sc.faults) or '-'}")
                out = run_scenario(bench, sc, log)
                log(f"  -> {'ok' if out.ok else 'WRONG'}; found {[(f['cause'], f['where'], f['severity'], f['first_seen_s']) for f in out.found if f['severity'] != 'info']}"
                    + (f"; error {out.error}" if out.error else ""))
                outcomes.append(out)
    return outcomes


def summarize(outcomes) -> dict:
    rows = {}
    for name in NAMES:
        mine = [o for o in outcomes if o.scenario == name]
        if not mine:
            continue
        lat = [x for o in mine for x in o.latency_s]
        ends = [o.end_after_clear_s for o in mine if o.end_after_clear_s is not None]
        rows[name] = {
            "runs": len(mine), "right": sum(o.primary_ok and o.all_found for o in mine),
            "false_alarms": sum(len(o.false_alarms) for o in mine),
            "moved": sum(len(o.moved) for o in mine),
            "errors": sum(bool(o.error) for o in mine),
            "latency_median_s": statistics.median(lat) if lat else None,
            "latency_p95_s": percentile(lat, 95),
            "end_after_clear_max_s": max(ends) if ends else None,
            "compare": [o.compare.get("step_time", {}).get("verdict") for o in mine
                        if o.compare] if name != "healthy" else
            [sorted({v["verdict"] for v in o.compare.values()}) for o in mine if o.compare]}
    faulty = [o for o in outcomes if o.scenario != "healthy"]
    lat = [x for o in faulty for x in o.latency_s]
    total = {"runs": len(outcomes),
             "right": sum(o.primary_ok and o.all_found for o in outcomes),
             "accuracy": sum(o.primary_ok and o.all_found for o in outcomes) / len(outcomes)
             if outcomes else None,
             "false_alarms": sum(len(o.false_alarms) for o in outcomes),
             "moved": sum(len(o.moved) for o in outcomes),
             "healthy_warnings": sum(len(o.false_alarms) for o in outcomes
                                     if o.scenario == "healthy"),
             "latency_median_s": statistics.median(lat) if lat else None,
             "latency_p95_s": percentile(lat, 95)}
    return {"scenarios": rows, "total": total}


def text(summary: dict) -> str:
    out = [f"{'scenario':<14}{'runs':>5}{'right':>7}{'false':>7}{'moved':>7}{'latency med':>13}"
           f"{'p95':>7}{'end after clear':>17}  compare (step time)"]
    for name, r in summary["scenarios"].items():
        def s(v):
            return "-" if v is None else f"{v:.1f}"
        out.append(f"{name:<14}{r['runs']:>5}{r['right']:>7}{r['false_alarms']:>7}{r['moved']:>7}"
                   f"{s(r['latency_median_s']):>13}{s(r['latency_p95_s']):>7}"
                   f"{s(r['end_after_clear_max_s']):>17}  {r['compare']}")
    t = summary["total"]
    out.append(f"\nall: {t['right']}/{t['runs']} right ({t['accuracy']:.1%}), "
               f"{t['false_alarms']} false alarms ({t['healthy_warnings']} in healthy runs), "
               f"{t['moved']} moved, "
               f"onset -> first_seen median {t['latency_median_s']} s, p95 "
               f"{t['latency_p95_s']} s")
    return "\n".join(out)


class Matrix:
    name = "diagnosis-matrix"
    description = "diagnosis accuracy, false alarms and latency over the scenario matrix"
    goal = ">= 97 % right, no warning when healthy, first_seen <= 5 s"

    def report(self, args) -> str:
        outcomes = run_matrix(args.repeats or 1)
        summary = summarize(outcomes)
        if args.json:
            return json.dumps({"summary": summary,
                               "runs": [o.to_dict() for o in outcomes]}, indent=1)
        return text(summary)


BENCH = Matrix()


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.diagnosis_matrix [--repeats N] [--seed S] [--only A,B]`: the
    bench with another seed, so that its parameters are drawn anew (the CLI's runs use
    seed 1), or with some scenarios only (their draws then differ from a full run's)."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m bench.diagnosis_matrix")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only", help=f"comma-separated scenarios, of: {', '.join(NAMES)}")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    names = args.only.split(",") if args.only else NAMES
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        p.error(f"--only: no scenario {', '.join(unknown)} (there are {', '.join(NAMES)})")
    try:
        outcomes = run_matrix(args.repeats, seed=args.seed, names=names)
    except UserError as exc:
        print(exc.one_line(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:       # SIGINT, or SIGTERM (the lab turns it into this)
        print("bench.diagnosis_matrix: interrupted; the lab and its servers are down, "
              "and no summary is printed for the runs cut short", file=sys.stderr)
        return 130
    print(text(summarize(outcomes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
