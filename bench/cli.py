"""`fabricscope bench NAME [--json] [--repeats N]` and `fabricscope bench --list`."""

from __future__ import annotations

import importlib
import json
import sys

from fabricscope.errors import UserError


def register(sub) -> None:
    p = sub.add_parser("bench", help="run a benchmark (ratio against a baseline, repeated)",
                       description="Run one benchmark: baseline and subject alternate, "
                                   "repeated; prints medians, min/max and the ratio.")
    p.add_argument("name", nargs="?", help="benchmark name (see --list)")
    p.add_argument("--list", action="store_true", help="list the benchmarks")
    p.add_argument("--json", action="store_true", help="print one JSON object (keys include ratio)")
    p.add_argument("--repeats", type=int, default=None, help="alternating rounds (default: per bench)")
    p.add_argument("--steps", type=int, default=None, help="workload size knob, where a bench has one")
    p.set_defaults(func=run)


def _load(name: str):
    from fabricscope.bench import REGISTRY
    if name not in REGISTRY:
        raise UserError(f"unknown benchmark {name!r}",
                        f"pick one of: {', '.join(sorted(REGISTRY))}")
    module, _, attr = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), attr or "BENCH")


def run(args) -> int:
    from fabricscope.bench import REGISTRY
    from fabricscope.bench.harness import run as run_bench
    if args.list:
        for name in sorted(REGISTRY):
            bench = _load(name)
            print(f"{name:<18} {bench.description}" + (f" (goal: {bench.goal})" if bench.goal else ""))
        return 0
    if not args.name:
        raise UserError("no benchmark named", "give a NAME or --list")
    if args.repeats is not None and args.repeats < 1:
        raise UserError("--repeats must be at least 1", "e.g. --repeats 5")
    bench = _load(args.name)
    if hasattr(bench, "report"):         # not a ratio: a report of its own (diagnosis-matrix)
        print(bench.report(args))
        return 0
    try:
        result = run_bench(bench, args, args.repeats,
                           progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    except (RuntimeError, TimeoutError) as exc:   # a round failed: its cause, no traceback
        raise UserError(f"benchmark {args.name} failed: {exc}",
                        "rerun it; what it needs is in docs/PERFORMANCE.md") from exc
    print(json.dumps(result.to_dict()) if args.json else result.to_text())
    return 0
