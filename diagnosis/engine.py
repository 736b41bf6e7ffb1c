"""The engine of one job: evidence in, findings out, evaluation by evaluation.

    job = JobEngine("198.18.0.1:29500", tor_of=topology.tor_of)
    job.feed(evidence)                    # what the store holds of the job (merged)
    changed = job.evaluate(now_ns)        # findings opened, updated or closed

Three parts, each with its own state:
- the evaluation (diagnosis/evaluation.py): the job's evidence, what is usual for
  it, and the detectors run over each window's Snapshot;
- the place memory (diagnosis/memory.py): what one window's hops leave for the next
  ones (recent loss, standing queues, a place's cause under revision);
- the lifecycle (diagnosis/lifecycle.py): the findings, opened, confirmed, updated,
  taken over and closed.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from fabricscope.diagnosis import detect_network
from fabricscope.diagnosis.candidate import Candidate
from fabricscope.diagnosis.evaluation import Evaluation, Gauges
from fabricscope.diagnosis.evidence import JobEvidence
from fabricscope.diagnosis.finding import Finding
from fabricscope.diagnosis.lifecycle import AMBIGUOUS_EVALS, Lifecycle
from fabricscope.diagnosis.memory import PlaceMemory
from fabricscope.diagnosis.snapshot import Snapshot, median_or_none
from fabricscope.diagnosis.thresholds import DEFAULT, Thresholds

#: a file every evaluation appends one JSON line to (the hops it judged bad, the
#: candidates, what waits, what is open), to follow a live run's decisions after the
#: fact: a replay of the records cannot repeat the order in which they arrived. Unset
#: (the default), nothing is written
TRACE_PATH = os.environ.get("FABRICSCOPE_DIAGNOSIS_TRACE", "")


@dataclass
class JobEngine:
    job: str
    tor_of: object = staticmethod(lambda node: None)
    thresholds: Thresholds = DEFAULT
    backend: str = "gloo"
    clock: object = staticmethod(time.time_ns)
    evaluation: Evaluation = None                   # type: ignore[assignment]
    memory: PlaceMemory = field(default_factory=PlaceMemory)
    lifecycle: Lifecycle = None                     # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.evaluation is None:
            self.evaluation = Evaluation(self.job, self.tor_of, self.thresholds)
        if self.lifecycle is None:
            self.lifecycle = Lifecycle(self.job, self.thresholds, self.backend)

    # what callers read of the parts
    ev = property(lambda self: self.evaluation.ev,
                  lambda self, ev: setattr(self.evaluation, "ev", ev))
    baseline = property(lambda self: self.evaluation.baseline)
    rtt_floor_us = property(lambda self: self.evaluation.rtt_floor_us)
    jitter = property(lambda self: self.evaluation.jitter)
    gauges = property(lambda self: self.evaluation.gauges)
    last_snapshot = property(lambda self: self.evaluation.last_snapshot)
    open = property(lambda self: self.lifecycle.open)
    closed = property(lambda self: self.lifecycle.closed)

    def feed(self, evidence: JobEvidence) -> None:
        """Take what was read (evidence read into the engine's own is taken already)."""
        self.evaluation.feed(evidence)

    def classified(self, classification) -> None:
        """Take the job's latest class and model (fabricscope.jobclass.Classification):
        the class causes are judged from them (diagnosis/detect_class.py)."""
        self.evaluation.job_class = classification

    def evaluate(self, now_ns: int | None = None) -> list[Finding]:
        now_ns = self.clock() if now_ns is None else now_ns
        latest = self.ev.latest_second()
        if latest is None:
            return []
        snap = self.evaluation.snapshot(latest + 1)
        bad = self.memory.with_recent_queue(snap.window.end_s, detect_network.bad_cells(snap),
                                            self.thresholds.eval_seconds)
        candidates, ruled_out = self.evaluation.detect(snap, bad, self.memory, self.open)
        self.evaluation.warned(candidates)
        self.evaluation.update_gauges(snap)
        changed = self.lifecycle.apply(snap, candidates, ruled_out, now_ns)
        if TRACE_PATH:
            self._trace(snap, bad, candidates, now_ns)
        return changed

    def snapshot(self, end_s: int) -> Snapshot:
        return self.evaluation.snapshot(end_s)

    def close_all(self, end_ns: int | None = None) -> list[Finding]:
        """End every open finding (the job stopped, or its ownership moved)."""
        return self.lifecycle.close_all(end_ns)

    def findings(self) -> list[Finding]:
        return self.lifecycle.findings()

    def _trace(self, snap: Snapshot, bad: list, candidates: list[Candidate],
               now_ns: int) -> None:
        hops = [f"{b.src or b.cell.key.peer}>{b.dst or b.cell.key.peer}{'L' if b.lossy else ''}"
                f"{'D' if b.delayed else ''} {(b.cell.rtt_p50_us or 0) / 1000:.1f}ms"
                for b in bad]
        life = self.lifecycle
        line = {"job": self.job, "now_ns": now_ns, "window_end_s": snap.window.end_s,
                "bad": hops, "floor_us": self.rtt_floor_us,
                "candidates": [[c.cause, c.severity, c.place,
                                sorted(map(sorted, c.hops.evidence))] for c in candidates],
                "pending": [[list(k), n] for k, (n, _) in life.pending.items()],
                "open": [[f.cause, f.where, f.id, sorted(map(sorted, life.hops_of[k].evidence))
                          if k in life.hops_of else None] for k, f in life.open.items()]}
        with open(TRACE_PATH, "a") as out:
            out.write(json.dumps(line, default=str) + "\n")


__all__ = ["JobEngine", "Gauges", "median_or_none", "AMBIGUOUS_EVALS"]
