"""ncclprof_cost: what the NCCL profiler plugin costs per collective.

A C driver (bench/ncclprof_cost.c, the harness's event order without Python) dlopens
the plugin's ncclProfiler_v6 and drives collectives as NCCL does: a Group, a CollApi,
the Coll, 2 kernel channels (GPU timer stamps), per channel a send and a receive ProxyOp
of 4 ProxySteps with their 3 state transitions each, one IB QP event per send step:
53 plugin calls, 26 events per collective. The baseline rounds drive a plugin whose
every function returns at once, so the difference is the plugin's own work. Rounds
alternate; the figure is the median over rounds of (subject - baseline) ns per
collective, on this machine's CPU. NCCL's own call overhead is not in it.

    .venv/bin/python -m fabricscope.bench.ncclprof_cost [--rounds 7] [--collectives 20000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from tests.support import nccl_profiler_host as nh

DRIVER = Path(__file__).resolve().with_suffix(".c")
NOOP_C = r"""
#include <stdint.h>
#include <stddef.h>
static int init(void **c, uint64_t id, int *m, const char *n, int a, int b, int r, void *l) {
  (void)id; (void)n; (void)a; (void)b; (void)r; (void)l; *c = (void *)1; *m = 0xde; return 0; }
static int start(void *c, void **h, void *d) { (void)c; (void)d; *h = (void *)1; return 0; }
static int stop(void *h) { (void)h; return 0; }
static int state(void *h, int s, void *a) { (void)h; (void)s; (void)a; return 0; }
static int fin(void *c) { (void)c; return 0; }
struct { const char *name; void *f[5]; } ncclProfiler_v6 = {"noop",
  {(void *)init, (void *)start, (void *)stop, (void *)state, (void *)fin}};
"""


def _build(tmp: Path) -> tuple[Path, Path, Path]:
    noop, driver = tmp / "libnoop.so", tmp / "driver"
    (tmp / "noop.c").write_text(NOOP_C)
    subprocess.run(["gcc", "-O2", "-fPIC", "-shared", "-o", str(noop), str(tmp / "noop.c")],
                   check=True)
    subprocess.run(["gcc", "-O2", f"-I{nh.PROFILER_DIR}", "-o", str(driver), str(DRIVER),
                    "-ldl"], check=True)
    return nh.build_plugin(tmp), noop, driver


def _round(driver: Path, lib: Path, n: int, ring_dir: Path) -> float:
    env = {**os.environ, "FABRICSCOPE_NCCLPROF_DIR": str(ring_dir),
           "FABRICSCOPE_NCCLPROF_RECORDS": str(8 * n)}
    out = subprocess.run([str(driver), str(lib), "1", str(n)], check=True, env=env,
                         capture_output=True, text=True).stdout
    return float(out.split()[0])


def measure(rounds: int, collectives: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        plugin, noop, driver = _build(tmp)
        base, subj = [], []
        for _ in range(rounds):
            base.append(_round(driver, noop, collectives, tmp))
            subj.append(_round(driver, plugin, collectives, tmp))
    diffs = [s - b for s, b in zip(subj, base, strict=True)]
    return {"ns_per_collective": statistics.median(diffs), "min_ns": min(diffs),
            "max_ns": max(diffs), "baseline_ns": statistics.median(base), "rounds": rounds,
            "collectives_per_round": collectives}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--collectives", type=int, default=20000)
    a = ap.parse_args(argv)
    r = measure(a.rounds, a.collectives)
    print(f"plugin: {r['ns_per_collective']:.0f} ns per collective (median of {r['rounds']} "
          f"rounds of {r['collectives_per_round']}; range {r['min_ns']:.0f}..{r['max_ns']:.0f}); "
          f"no-op plugin {r['baseline_ns']:.0f} ns")


if __name__ == "__main__":
    main()
