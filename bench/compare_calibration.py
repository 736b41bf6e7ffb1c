"""How often compare invents a change, and how often it sees a real one.

    FABRICSCOPE_MATRIX_DUMP=/tmp/dump python -m fabricscope.bench.diagnosis_matrix --set dev --runs 12
    python -m fabricscope.bench.compare_calibration /tmp/dump/*-healthy.json.gz /tmp/dump/*-cleared.json.gz

From matrix dumps (bench/scenarios._dump), the step times of each job's reference
rank (its lowest), as compare reads them:
- healthy runs: their steps after start-up, pooled. The pool's lag-1
  autocorrelation is printed; near 0, resampling single steps keeps its structure.
  RUNS synthetic healthy runs of the dumps' length are drawn from it, dealt as the
  matrix's null compare deals them (bench/scenarios.deal), and compared with
  themselves: the share that compare calls changed is its false-change rate, at its
  ALPHA and, for contrast, at 0.05, and with the test taken over single steps
  instead of block means.
- cleared runs: the fault's window against the one after the clearing, as recorded,
  and resampled RUNS times in moving blocks of 3 steps (the faulted steps'
  correlation, lag-1 0.3-0.8, lasts a few steps), to the windows' own lengths or to
  --steps a side: the share called `better` is compare's power for that clearing.
Every figure is a count over RUNS draws with a fixed seed, so a rerun gives the same.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from contextlib import contextmanager

import numpy as np

from fabricscope.bench.scenarios import deal
from fabricscope.diagnosis import compare as cmp


def steps_of(dump: dict) -> list[tuple[int, float]]:
    job = dump["outcome"]["job"]
    rows = [r for r in dump["gloo_step"] if r.get("job") == job and r.get("seconds") is not None]
    ranks = sorted({r["rank"] for r in rows}, key=lambda r: (len(r), r))
    return sorted((int(r["time"]), float(r["seconds"])) for r in rows if r["rank"] == ranks[0])


def lag1(x: list[float]) -> float:
    y = np.asarray(x) - np.median(x)
    return float(np.corrcoef(y[:-1], y[1:])[0, 1])


@contextmanager
def rule(alpha: float, blocks: bool):
    """compare with another ALPHA, or testing single steps instead of block means."""
    saved = cmp.ALPHA, cmp.block_means
    cmp.ALPHA = alpha
    if not blocks:
        cmp.block_means = list
    try:
        yield
    finally:
        cmp.ALPHA, cmp.block_means = saved


RULES = [("compare (block means, ALPHA %g)" % cmp.ALPHA, cmp.ALPHA, True),
         ("block means at 0.05", 0.05, True), ("single steps at 0.05", 0.05, False)]


def changed(a: list[float], b: list[float], seed: int) -> str:
    return cmp.compare_samples({"step_time": (a, b)}, seed=seed)[0].verdict


def null_rates(healthy: list[dict], runs: int, rng: np.random.Generator) -> None:
    series = [[s for _, s in steps_of(d)][2:] for d in healthy]
    pool = np.concatenate(series)
    n = int(np.median([len(x) for x in series]))
    print(f"healthy: {len(series)} runs, {len(pool)} steps, median {np.median(pool):.3f} s, "
          f"lag-1 autocorrelation {', '.join(f'{lag1(x):+.2f}' for x in series)}")
    draws = [rng.choice(pool, n).tolist() for _ in range(runs)]
    for name, alpha, blocks in RULES:
        with rule(alpha, blocks):
            wrong = sum(changed(*deal(x), seed=i) != "no change" for i, x in enumerate(draws))
        print(f"  {name}: {wrong}/{runs} of {n}-step runs called changed "
              f"({100 * wrong / runs:.1f} %)")


def moving_blocks(x: list[float], n: int, rng: np.random.Generator, block: int = 3
                  ) -> list[float]:
    out: list[float] = []
    while len(out) < n:
        start = int(rng.integers(0, max(1, len(x) - block + 1)))
        out += x[start:start + block]
    return out[:n]


def power(cleared: list[dict], runs: int, steps: int | None, rng: np.random.Generator) -> None:
    for d in cleared:
        o = d["outcome"]
        recorded = steps_of(d)
        a = [s for t, s in recorded if o["onset_ns"] <= t < o["clear_ns"]]
        b = [s for t, s in recorded if t >= o["clear_ns"]]
        r = cmp.compare_samples({"step_time": (a, b)})[0]
        draws = [(moving_blocks(a, steps or len(a), rng), moving_blocks(b, steps or len(b), rng))
                 for _ in range(runs)]
        seen = []
        for _, alpha, blocks in RULES:
            with rule(alpha, blocks):
                seen.append(sum(changed(x, y, seed=i) == "better"
                                for i, (x, y) in enumerate(draws)))
        print(f"cleared ({o['params']}): {len(a)} -> {len(b)} steps, {r.change_pct:+.1f} %, "
              f"p {r.p_value:.3g}, {r.verdict}; resampled to "
              f"{f'{steps} a side' if steps else 'as recorded'}, `better`: "
              + ", ".join(f"{n}/{runs}" for n in seen) + " (" + "; ".join(
                  name for name, _, _ in RULES) + ")")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dumps", nargs="+", help="matrix dumps (FABRICSCOPE_MATRIX_DUMP)")
    parser.add_argument("--runs", type=int, default=1000, help="draws per figure (1000)")
    parser.add_argument("--steps", type=int, help="resample each cleared window to this many "
                        "steps (default: as recorded)")
    args = parser.parse_args(argv)
    dumps = []
    for path in args.dumps:
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as fh:
            dumps.append(json.load(fh))
    rng = np.random.default_rng(1)
    healthy = [d for d in dumps if d["outcome"]["scenario"] == "healthy"]
    cleared = [d for d in dumps if d["outcome"]["scenario"] == "cleared"
               and d["outcome"].get("clear_ns")]
    if not healthy and not cleared:
        print("compare_calibration: no healthy or cleared dumps among the files given; "
              "write some with FABRICSCOPE_MATRIX_DUMP=DIR", file=sys.stderr)
        return 2
    if healthy:
        null_rates(healthy, args.runs, rng)
    if cleared:
        power(cleared, min(args.runs, 300), args.steps, rng)
    return 0


if __name__ == "__main__":
    sys.exit(main())
