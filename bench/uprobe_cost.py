"""uprobe-cost: what the nccl probe adds to each NCCL call.

A small C program (bench/uprobe_cost.c, compiled with gcc into a temporary
directory) dlopens the real libnccl.so.2 (scripts/fetch-nccl.sh) and calls
ncclAllReduce with a NULL communicator in a tight loop; NCCL runs its argument
checks and returns ncclInvalidArgument, which is the same entry point, and the
same uprobe hits, as a real call. Figure: mean ns per call.

Baseline: no probe. Subject: the nccl probe attached as the agent runs it
(entry + return probes, one ring-buffer event per call). Each subject round also
runs the loop with the entry-only variant (-DFS_NCCL_ENTRY_ONLY), reported in
`extra` with the added ns per call of each. The ring buffer is sized to hold a
round's events, so the figure is the in-kernel cost of the probes; draining and
decoding them in the agent (Python) is reported separately per event.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from fabricscope.bench.harness import Benchmark
from fabricscope.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
EVENT_BYTES = 128           # 120-byte event + ring buffer record header, rounded


def _fetch_nccl() -> str:
    run = subprocess.run(["bash", str(ROOT / "scripts" / "fetch-nccl.sh")], text=True,
                         capture_output=True)
    if run.returncode != 0:
        raise UserError("cannot get libnccl.so.2: " + (run.stderr.strip().splitlines()
                                                        or ["fetch-nccl.sh failed"])[-1],
                        "run scripts/fetch-nccl.sh (needs PyPI access once)")
    return str(Path(run.stdout.strip().splitlines()[-1]) / "libnccl.so.2")


def _compile(tmp: str) -> str:
    if shutil.which("gcc") is None:
        raise UserError("gcc is not installed; the benchmark compiles a small C loop",
                        "apt-get install gcc")
    exe = str(Path(tmp) / "uprobe_cost")
    subprocess.run(["gcc", "-O2", "-o", exe, str(ROOT / "bench" / "uprobe_cost.c"), "-ldl"],
                   check=True, capture_output=True, text=True)
    return exe


class _Sides:
    def __init__(self, exe: str, lib: str, calls: int):
        self.exe, self.lib, self.calls = exe, lib, calls
        self._extra: dict[str, float] = {}
        self._last_baseline = 0.0

    def _loop(self) -> float:
        out = subprocess.run([self.exe, self.lib, str(self.calls)], check=True,
                             capture_output=True, text=True, timeout=600).stdout.split()
        if out[1] != "4":
            raise RuntimeError(f"ncclAllReduce returned {out[1]}, expected 4 (invalid argument)")
        return float(out[0])

    def _probed(self, entry_only: bool) -> tuple[float, dict[str, int], float]:
        from fabricscope.agent.probes.base import Clock, ProbeContext
        from fabricscope.agent.probes.nccl.probe import NcclProbe
        pages = 1 << max(1, (self.calls * EVENT_BYTES // 4096).bit_length())
        ctx = ProbeContext("bench", frozenset(), Clock(), SimpleNamespace(nccl_paths=[self.lib]))
        probe = NcclProbe(ctx, entry_only=entry_only, ringbuf_pages=pages, rescan_s=3600)
        probe.attach()
        try:
            ns = self._loop()
            start = time.perf_counter()
            records = 0
            while True:
                got = len(probe.poll())
                records += got
                if not got:
                    break
            drain_s = time.perf_counter() - start
            stats = probe.stats()
        finally:
            probe.detach()
        return ns, stats, drain_s / max(records, 1) * 1e9

    def baseline(self) -> float:
        self._last_baseline = self._loop()
        return self._last_baseline

    def subject(self) -> float:
        entry_ns, entry_stats, _ = self._probed(entry_only=True)
        ns, stats, decode_ns = self._probed(entry_only=False)
        self._extra = {
            "added_ns_per_call": ns - self._last_baseline,
            "entry_only_ns_per_call": entry_ns,
            "entry_only_added_ns_per_call": entry_ns - self._last_baseline,
            "events_emitted": stats.get("emitted", 0),
            "events_lost": stats.get("lost", 0) + entry_stats.get("lost", 0),
            "agent_decode_ns_per_event": decode_ns,
        }
        return ns

    def extra(self) -> dict[str, float]:
        return self._extra


@contextlib.contextmanager
def environment(args):
    from fabricscope.agent import kernel
    kernel.prepare()
    lib = _fetch_nccl()
    calls = getattr(args, "steps", None) or 100_000
    with tempfile.TemporaryDirectory(prefix="fs-uprobe-cost-") as tmp:
        yield _Sides(_compile(tmp), lib, calls)


BENCH = Benchmark(
    name="uprobe-cost",
    description="ns per NCCL call (ncclAllReduce, real libnccl) with the nccl probe / without",
    unit="ns/call",
    baseline_label="no probe",
    subject_label="nccl probe (entry+return)",
    environment=environment,
    repeats=5,
)
