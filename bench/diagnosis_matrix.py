"""diagnosis-matrix: how often the engine names the right cause and place, how fast,
over scenarios drawn from the space of bench/scenario_space.py.

    fabricscope bench diagnosis-matrix [--set dev|eval] [--runs N] [--first K] [--json]
    python -m fabricscope.bench.diagnosis_matrix --set eval --runs 60
    python -m fabricscope.bench.diagnosis_matrix --render bench/results/diagnosis-eval.json

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

from fabricscope.bench.harness import percentile
from fabricscope.bench.scenario_space import SET_BASE, SetName, draw, seeds
from fabricscope.bench.scenarios import SENSITIVITY, run_scenario, running_bench
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


def read_results(path: str) -> dict:
    """A results file as `--json` writes it: {"summary": ..., "runs": [...]}."""
    fix = f"write it with `python -m fabricscope.bench.diagnosis_matrix --set dev --json {path}`"
    try:
        with open(path) as fh:
            results = json.load(fh)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}", fix) from exc
    except ValueError as exc:
        raise UserError(f"{path} is not JSON ({exc})", fix) from exc
    if not isinstance(results, dict) or not isinstance(results.get("summary"), dict) \
            or not isinstance(results.get("runs"), list) or not results["runs"]:
        raise UserError(f"{path} holds no runs of bench.diagnosis_matrix (it needs "
                        "'summary' and 'runs')", fix)
    return results


def set_of(seed: int) -> SetName:
    """The set a seed was drawn for (the highest base at or below it)."""
    return max((s for s in SetName if SET_BASE[s] <= seed), key=SET_BASE.__getitem__,
               default=SetName.DEV)


def markdown(results: dict, path: str) -> str:
    """The accuracy table of one results file, with the command that measures it again
    (docs/DIAGNOSIS.md embeds one per set)."""
    s, runs = results["summary"], results["runs"]
    seeds = sorted(r["seed"] for r in runs if r.get("seed") is not None)
    the_set = set_of(seeds[0]) if seeds else SetName.DEV
    first = seeds[0] - SET_BASE[the_set] if seeds else 0
    command = results.get("command") or (
        f"python -m fabricscope.bench.diagnosis_matrix --set {the_set.value} --runs {len(runs)}"
        + (f" --first {first}" if first else "") + f" --json {path}")
    how = ("recorded live, replayed through the engine as it is now, with"
           if results.get("replayed") else "measured with")
    seed_text = f", seeds {seeds[0]}-{seeds[-1]}" if seeds else ""

    def must(r):
        return [e.get("required", True) for e in r.get("expected", [])]
    faulty = [r for r in runs if any(must(r))]

    def pct(v, of: str = "") -> str:
        return "-" if v is None else f"{v:.1%}" + (f" ({of})" if of else "")

    def of_faulty(key: str) -> str:
        return f"{sum(bool(r.get(key)) for r in faulty)} of {len(faulty)}"
    named = sum(n for r in runs for n, m in zip(r.get("named", []), must(r)) if m)
    lat = "-" if s.get("latency_median_s") is None else \
        f"{s['latency_median_s']:.2f} / {s['latency_p95_s']:.2f} s"
    rows = [
        (f"right: the primary warning names a fault, every fault that cost >= "
         f"{SENSITIVITY * 100:g} % is named, nothing else is warned of",
         pct(s["right"], of_faulty("ok"))),
        ("the primary warning's cause is a fault's", pct(s["cause_accuracy"],
                                                          of_faulty("cause_ok"))),
        ("the primary warning's cause and place are a fault's",
         pct(s["place_accuracy"], of_faulty("primary_ok"))),
        ("precision: warnings that name a fault", pct(
            s["precision"], f"{sum(r.get('right_warnings', 0) for r in runs)} of "
                            f"{sum(r.get('warnings', 0) for r in runs)}")),
        ("recall: faults that had to be named and were", pct(
            s["recall"], f"{named} of {sum(sum(must(r)) for r in runs)}")),
        ("... of the right warnings, at a place in series with the fault's on every path "
         "of the lab", str(sum(len(r.get("in_series", [])) for r in runs))),
        ("warnings on healthy runs", str(s["healthy_warnings"])),
        ("faulty runs whose named cause or place moved after it was first raised",
         pct(s["changed"])),
        ("runs with two faults that named both", pct(s["both_of_two"])),
        ("onset -> first_seen, median / p95", lat),
        ("runs that failed to run", str(s["errors"]))]
    out = [f"{s['runs']} runs of the {the_set.value} set{seed_text} ({s['faulty']} with a "
           f"fault to name, {s['healthy']} healthy, {s['mild']} with a fault that cost under "
           f"{SENSITIVITY * 100:g} % of the step), {how} `{command}`:", "",
           "| measure | result |", "|---|---|"]
    out += [f"| {name} | {value} |" for name, value in rows]
    out += ["", "| kind | runs | with a fault to name | right |", "|---|---|---|---|"]
    for kind in sorted({r["scenario"] for r in runs}):
        of_kind = [r for r in runs if r["scenario"] == kind]
        must_name = [r for r in of_kind if any(must(r))]
        out.append(f"| {kind} | {len(of_kind)} | {len(must_name)} | "
                   f"{sum(bool(r.get('ok')) for r in must_name)} |")
    confusion = ", ".join(f"{k}: {v}" for k, v in s.get("confusion", {}).items())
    out += ["", f"Fault -> primary warning: {confusion or '-'}.", "",
            f"Goal: {Matrix.goal}."]
    return "\n".join(out) + "\n"


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
    p = argparse.ArgumentParser(prog="python -m fabricscope.bench.diagnosis_matrix",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--set", choices=[s.value for s in SetName], default=SetName.DEV.value,
                   help="the development set (for work) or the evaluation set (to measure)")
    p.add_argument("--runs", type=int, default=12)
    p.add_argument("--first", type=int, default=0, help="the set's first run to draw")
    p.add_argument("--json", help="also write the runs and the summary to this file")
    p.add_argument("--render", metavar="FILE.json",
                   help="run nothing; print the markdown accuracy table of a --json file")
    args = p.parse_args(argv)
    if args.render:
        try:
            sys.stdout.write(markdown(read_results(args.render), args.render))
        except UserError as exc:
            print(exc.one_line(), file=sys.stderr)
            return exc.exit_code
        return 0
    if args.runs < 1 or args.first < 0:
        p.error("--runs must be at least 1 and --first at least 0")
    try:
        outcomes = run_set(SetName(args.set), args.runs, args.first)
    except UserError as exc:
        print(exc.one_line(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:       # SIGINT, or SIGTERM (the lab turns it into this)
        print("fabricscope.bench.diagnosis_matrix: interrupted; the lab and its servers are down, "
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
