"""Helpers shared by the BCC probes: compile bpf/<family>.bpf.c, check struct
layouts, read per-CPU counters, read tracepoint formats (TC attach: agent/tc.py).

BCC is imported only inside functions: the agent must prepare the kernel
(fabricscope.agent.kernel.prepare: tracefs, headers) before the first `import bcc`, because
BCC picks its tracefs path at import time.
"""

from __future__ import annotations

import ctypes
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fabricscope.agent.probes.base import ProbeUnavailable

log = logging.getLogger("fabricscope.agent.bpf")

BPF_DIR = Path(__file__).resolve().parent.parent / "bpf"
TRACEFS = Path("/sys/kernel/tracing")


_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def inline_includes(path: Path, seen: set[Path] | None = None) -> str:
    """The source of `path` with its `#include "..."` files of the same directory
    pasted in (each once), `#line` directives keeping compiler messages right.

    Why: BCC rewrites map calls (`own_addrs.lookup(...)`) only in the main file;
    in an included file they compile to an indirect call the verifier rejects.
    Pasting makes shared helpers (bpf/fs_common.h) and composed programs
    (tcp_flows.bpf.c includes tcp_retransmit.bpf.c) part of the main file."""
    seen = set() if seen is None else seen
    out = [f'#line 1 "{path.name}"']
    for number, line in enumerate(path.read_text().splitlines(), 1):
        m = _LOCAL_INCLUDE.match(line)
        included = path.parent / m.group(1) if m else None
        if included is None or not included.is_file():
            out.append(line)
            continue
        if included.resolve() not in seen:
            seen.add(included.resolve())
            out.append(inline_includes(included, seen))
        out.append(f'#line {number + 1} "{path.name}"')
    return "\n".join(out) + "\n"


def compile_program(family: str, cflags: list[str]):
    """Compile and load bpf/<family>.bpf.c (tracepoint probes attach on load)."""
    from bcc import BPF

    path = BPF_DIR / f"{family}.bpf.c"
    if not path.is_file():
        raise ProbeUnavailable(f"BPF source {path} is missing")
    try:
        return BPF(text=inline_includes(path).encode(), cflags=[f"-I{BPF_DIR}", *cflags])
    except Exception as exc:  # BCC raises bare Exception on compile/load/attach errors
        raise ProbeUnavailable(f"{path.name} did not load: {str(exc).splitlines()[0]}") from None


def tracepoint_fields(category: str, event: str, tracefs: Path = TRACEFS) -> set[str] | None:
    """Field names of a tracepoint (None when the tracepoint does not exist)."""
    try:
        text = (tracefs / "events" / category / event / "format").read_text()
    except OSError:
        return None
    return {m.group(1) for m in re.finditer(r"field:[^;]*?(\w+)(?:\[\d*\])?;", text)}


def check_layout(mirror: type[ctypes.Structure], compiled: type[ctypes.Structure]) -> None:
    """The Python mirror of a C struct must match what clang compiled, field by field."""
    problems = []
    if ctypes.sizeof(mirror) != ctypes.sizeof(compiled):
        problems.append(f"size {ctypes.sizeof(mirror)} != {ctypes.sizeof(compiled)}")
    for name, *_ in compiled._fields_:
        ours = getattr(mirror, name, None)
        theirs = getattr(compiled, name)
        if ours is None or ours.offset != theirs.offset or ours.size != theirs.size:
            problems.append(f"field {name}")
    if problems:
        raise ProbeUnavailable(f"{mirror.__name__} does not match the compiled struct: "
                               + ", ".join(problems))


def percpu_sums(table, count: int, first: int = 0) -> list[int]:
    """Sum each index first..first+count-1 of a BPF_PERCPU_ARRAY of u64 over all CPUs
    (a program's `stats`, bpf/fs_common.h)."""
    out = []
    for i in range(first, first + count):
        try:
            out.append(int(sum(table[ctypes.c_int(i)])))
        except KeyError:
            out.append(0)
    return out


@dataclass(frozen=True)
class ProgStats:
    """What the kernel counts about a set of loaded BPF programs (/proc/self/fdinfo).

    run_ns, runs: only while BPF stats are enabled (sysctl kernel.bpf_stats_enabled=1
    or a BPF_ENABLE_STATS fd, itself ~20 ns per run); else 0.
    missed: runs the kernel skipped (recursion_misses, 5.12+; else 0). Tracepoint and
    kprobe programs share one per-CPU guard (bpf_prog_active) with each other and with
    every BPF map syscall, which raises it for its duration, preempted or not: a hit
    that comes meanwhile on that CPU (this agent draining a map, a softirq interrupting
    another of our programs) does not run ours. Raw tracepoints, TC and (6.1+) uprobe
    programs are guarded per program and miss only when they would recurse."""
    run_ns: int = 0
    runs: int = 0
    missed: int = 0

    def __add__(self, other: "ProgStats") -> "ProgStats":
        return ProgStats(self.run_ns + other.run_ns, self.runs + other.runs,
                         self.missed + other.missed)

    def counters(self) -> dict[str, int]:
        """As a probe's counters: bpf_run_ns, bpf_runs, missed_hits."""
        return {"bpf_run_ns": self.run_ns, "bpf_runs": self.runs, "missed_hits": self.missed}


def prog_stats(fds) -> ProgStats:
    """ProgStats summed over BPF program fds."""
    total = ProgStats()
    for fd in fds:
        try:
            text = Path(f"/proc/self/fdinfo/{fd}").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        total += ProgStats(*(int(fields.get(k, "0").strip() or 0)
                             for k in ("run_time_ns", "run_cnt", "recursion_misses")))
    return total


def prog_stat_counters(fds) -> dict[str, int]:
    """A probe's counters for its programs: bpf_run_ns, bpf_runs, missed_hits."""
    return prog_stats(fds).counters()


def open_ring(table, handler: Callable[[object, int, int], int], count: Callable[[], None],
              probe: str) -> None:
    """Open a ring buffer whose callback never loses an event silently.

    ring_buffer_consume() calls `handler` through ctypes, which prints an exception to
    stderr and drops the event uncounted. Here an exception is counted (`count`, the
    probe's handler_errors) and its first traceback logged; the probe keeps running."""
    logged = False

    def guarded(ctx, data, size) -> int:
        nonlocal logged
        try:
            return handler(ctx, data, size)
        except Exception:
            count()
            if not logged:
                logged = True
                log.warning("%s: an event could not be handled (counted as handler_errors; "
                            "later ones are not logged)", probe, exc_info=True)
            return 0

    table.open_ring_buffer(guarded)
