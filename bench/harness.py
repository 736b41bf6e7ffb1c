"""Benchmark harness: alternate baseline and subject, repeat, report medians and the ratio.

A benchmark is a module in bench/ exposing `BENCH = Benchmark(...)`. Its
`environment(args)` is a context manager that builds what both sides need (a
lab, a server, ...) and yields a `Sides` object with `baseline()` and
`subject()`, each running one measurement and returning one number in `unit`.
The harness runs them alternately (baseline, subject, baseline, ...) so that
drift on a shared machine hits both sides alike, and reports per-side median,
min and max, and ratio = median(subject) / median(baseline). Beside it, the
paired ratio: the median over rounds of each subject against the mean of the two
baselines measured around it (the last against its own), which cancels a drift of
the machine that the two medians do not (this VM's DDP step time drifts by 10-15 %
within a five-minute run); and the quartiles of those per-round ratios, which say
what difference the run can resolve at all.
Extra per-run figures (e.g. CPU seconds) go in `Sides.extra()` and are reported
as medians too.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, ContextManager, Protocol


class Sides(Protocol):
    def baseline(self) -> float: ...
    def subject(self) -> float: ...


@dataclass(frozen=True)
class Benchmark:
    name: str
    description: str
    unit: str
    baseline_label: str
    subject_label: str
    environment: Callable[[object], ContextManager[Sides]]
    repeats: int = 5
    goal: str = ""                       # e.g. "ratio <= 1.02"


@dataclass
class SideStats:
    label: str
    median: float
    min: float
    max: float
    samples: list[float]

    @classmethod
    def of(cls, label: str, samples: list[float]) -> "SideStats":
        return cls(label, statistics.median(samples), min(samples), max(samples), samples)


@dataclass
class Result:
    name: str
    unit: str
    repeats: int
    baseline: SideStats
    subject: SideStats
    ratio: float
    goal: str
    wall_s: float
    extra: dict[str, float] = field(default_factory=dict)
    paired_ratio: float = float("nan")
    paired_quartiles: tuple[float, float] = (float("nan"), float("nan"))

    def to_dict(self) -> dict:
        return asdict(self)

    def to_text(self) -> str:
        def side(s: SideStats) -> str:
            return (f"  {s.label:<28} median {s.median:.6g} {self.unit}  "
                    f"(min {s.min:.6g}, max {s.max:.6g}, n={len(s.samples)})")
        lines = [f"{self.name}: {self.repeats} alternating rounds in {self.wall_s:.0f} s",
                 side(self.baseline), side(self.subject),
                 f"  ratio subject/baseline       {self.ratio:.4f}" +
                 (f"  (goal: {self.goal})" if self.goal else ""),
                 f"  paired ratio                 {self.paired_ratio:.4f}  (per-round "
                 f"ratios: quartiles {self.paired_quartiles[0]:.4f}-"
                 f"{self.paired_quartiles[1]:.4f})"]
        for key, value in self.extra.items():
            lines.append(f"  {key:<28} {value:.6g}")
        return "\n".join(lines)


def run(bench: Benchmark, args=None, repeats: int | None = None,
        progress: Callable[[str], None] = lambda _msg: None) -> Result:
    repeats = repeats or bench.repeats
    base: list[float] = []
    subj: list[float] = []
    extras: dict[str, list[float]] = {}
    start = time.monotonic()
    with bench.environment(args) as sides:
        for i in range(repeats):
            base.append(float(sides.baseline()))
            subj.append(float(sides.subject()))
            for key, value in (getattr(sides, "extra", lambda: {})() or {}).items():
                extras.setdefault(key, []).append(float(value))
            progress(f"{bench.name}: round {i + 1}/{repeats}: baseline {base[-1]:.6g} "
                     f"subject {subj[-1]:.6g} {bench.unit}")
    b, s = SideStats.of(bench.baseline_label, base), SideStats.of(bench.subject_label, subj)
    ratio = s.median / b.median if b.median else float("nan")
    per_round = paired_ratios(base, subj)
    return Result(bench.name, bench.unit, repeats, b, s, ratio, bench.goal,
                  time.monotonic() - start,
                  {k: statistics.median(v) for k, v in extras.items()},
                  statistics.median(per_round) if per_round else float("nan"),
                  quartiles(per_round))


def paired_ratios(base: list[float], subj: list[float]) -> list[float]:
    """Subject i against the baselines measured just before and just after it (the
    next round's); the last subject against its own round's baseline only."""
    out = []
    for i, s in enumerate(subj):
        around = base[i:i + 2]
        ref = sum(around) / len(around)
        if ref:
            out.append(s / ref)
    return out


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile by nearest rank over the sorted values (one of them, never
    an interpolation); None for no values."""
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))]


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        v = values[0] if values else float("nan")
        return v, v
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


@contextlib.contextmanager
def nothing(_args=None):
    yield None
