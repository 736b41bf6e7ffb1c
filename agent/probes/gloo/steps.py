"""Training steps and phases inferred from one process's collectives (no markers needed).

Facts about data-parallel training this relies on (PyTorch DDP, and any trainer
that syncs gradients once per step):

1. Every step allreduces the same gradient bytes G: each parameter's gradient is
   in exactly one bucket. Bucket boundaries may change (DDP rebuilds its buckets
   after step 0), the total does not.
2. A step boundary lies where no collective is in flight: the backward pass waits
   for all its buckets before the optimizer runs, then the next forward computes
   without communicating.

So AllReduce windows that overlap (or nearly touch) are merged into bursts, and a
step is a run of consecutive bursts carrying exactly G bytes. G is chosen, in order:
(a) the parameter bytes DDP broadcast at construction, when the bursts cut into
groups of that total (models without buffers: gradient bytes == parameter bytes);
(b) the only total that cuts the bursts into >= 2 complete groups, when sizes
alone decide; (c) when several totals cut (e.g. equal buckets: G, 2G, ... all do),
the smallest one whose cuts fall on the long gaps (boundary gaps at least twice
every gap inside a group, over >= 3 groups; for one burst per step: no gap twice
another): the forward pass and optimizer separate steps, backward compute
separates buckets; (d) after FALLBACK_BURSTS undecided bursts, the smallest. A
total that stops cutting (the model changed) is searched again, dropping up to
MAX_SKIP leftover bursts.

A sharded job (FSDP, ZeRO-3) breaks (c): it reduces each layer's gradients on its own,
and ProcessGroupGloo runs each ReduceScatter as an AllReduce, so equal layers make
equal bursts whose first gaps are alike, and a step of 16 layers would be read as 16
steps. Such a job also gathers parameters (AllGather) or exchanges tokens (AlltoAll);
once a process issues those after its first AllReduce, G is taken from the period of
its whole call sequence instead (agent/probes/callseq.py, as for NCCL): the AllReduce
bytes of one repeat, cut at that repeat's first AllReduce. Nothing is decided until the
sequence has repeated MIN_REPEATS times.

Phases: `param_broadcast` (the collectives before the first AllReduce: DDP's
parameter broadcast and shape check), then per step `grad_sync` (time with an
AllReduce in flight) and `compute` (the rest of the step: forward, backward not
overlapped with communication, optimizer, data loading). Data loading and
checkpoint writes inside `compute` come from the process's TCP transfers outside
its collectives (agent/training_join.py), not from collective windows.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from fabricscope.agent.probes.callseq import MAX_HISTORY, MAX_PERIOD, SEPARATION, find_pattern
from fabricscope.agent.probes.gloo.layout import Collective
from fabricscope.jobclass import VARIABLE_SIZE_OPS

MERGE_GAP_NS = 200_000        # windows closer than this belong to one burst
MIN_GROUPS = 2                # complete groups needed before G is trusted
MIN_GAPS = 3                  # gaps needed before their pattern decides G
FALLBACK_BURSTS = 16          # undecided this long: take the smallest G
MAX_SKIP = 8                  # bursts dropped at most to find a G again after a change
HINT_MIN_BYTES = 4096         # init broadcasts below this are control data, not parameters
MAX_BURSTS = 64               # pending bursts kept (bounds the search for G)
#: ops that make a step more than one gradient sync: the step is then a period of the
#: whole call sequence (the module doc)
SEQUENCE_OPS = frozenset({"AllGather", "AllGatherv", "AlltoAll", "AlltoAllv"})


@dataclass(frozen=True, order=True)
class SequenceCall:
    """A collective as the call-sequence search sees it (callseq.Timed)."""

    ts_ns: int
    token: tuple


def sequence_call(c: Collective) -> SequenceCall:
    """Its op, and its size unless the size follows the data (a v-variant)."""
    size = () if c.op.lower() in VARIABLE_SIZE_OPS else (c.bytes or 0,)
    return SequenceCall(c.start_ns, (c.op, *size))


@dataclass
class Burst:
    start_ns: int
    end_ns: int
    bytes: int = 0
    sent_bytes: int = 0
    collectives: int = 0
    busy_ns: int = 0          # union of the windows (time with an AllReduce in flight)
    windows: list[tuple[int, int]] = field(default_factory=list)

    def add(self, c: Collective) -> None:
        self.start_ns, self.end_ns = min(self.start_ns, c.start_ns), max(self.end_ns, c.end_ns)
        self.bytes += c.bytes or 0
        self.sent_bytes += c.sent_bytes
        self.collectives += 1
        self.windows.append((c.start_ns, c.end_ns))
        self.busy_ns = _union(self.windows)


@dataclass(frozen=True)
class Step:
    index: int                 # 0 for the first step this tracker saw
    start_ns: int              # start of its first AllReduce
    seconds: float | None      # to the next step's start; None for the last one
    sync_seconds: float        # time with an AllReduce in flight
    buckets: int               # AllReduce calls
    bytes: int                 # sum of their S
    sent_bytes: int

    @property
    def compute_seconds(self) -> float | None:
        return None if self.seconds is None else max(0.0, self.seconds - self.sync_seconds)


@dataclass(frozen=True)
class OpenStep:
    """The step a process is in now, not yet emitted (its length needs the next
    step's start): what is known of it so far, each a lower bound of the step's own."""

    index: int                 # the index the step will have
    start_ns: int              # start of its first AllReduce
    seconds: float             # from its start to now
    sync_seconds: float        # time with an AllReduce in flight, up to now
    waiting: bool              # an AllReduce is in flight now

    @property
    def compute_seconds(self) -> float:
        return max(0.0, self.seconds - self.sync_seconds)


@dataclass(frozen=True)
class Phase:
    name: str                  # param_broadcast, grad_sync, compute
    start_ns: int
    seconds: float
    bytes: int
    collectives: int
    step: int                  # -1 for phases before the first step


def _union(windows: list[tuple[int, int]]) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(windows):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


def partition(sizes: list[int], total: int) -> list[int] | None:
    """Indexes where groups of `total` start, if the sizes cut exactly; else None.

    The last group may be incomplete (a step in progress)."""
    starts, acc = [0], 0
    for i, size in enumerate(sizes):
        acc += size
        if acc == total:
            acc = 0
            if i + 1 < len(sizes):
                starts.append(i + 1)
        elif acc > total:
            return None
    return starts


@dataclass(frozen=True)
class Candidate:
    total: int                 # G
    starts: list[int]          # indexes of the bursts that open a group
    complete: int              # complete groups

    def single(self) -> bool:
        """Every group is one burst."""
        return len(self.starts) >= self.complete and \
            all(b - a == 1 for a, b in zip(self.starts, self.starts[1:]))


def candidates(sizes: list[int]) -> list[Candidate]:
    """Every prefix total that cuts the sizes into >= MIN_GROUPS complete groups."""
    out, acc, whole = [], 0, sum(sizes)
    for size in sizes:
        acc += size
        if acc == 0 or whole // acc < MIN_GROUPS:
            continue
        starts = partition(sizes, acc)
        if starts is not None:
            out.append(Candidate(acc, starts, whole // acc))
    return out


def _clean(c: Candidate, gaps: list[int]) -> bool:
    """Do c's cuts fall on the long gaps? (gaps[i-1] precedes burst i)"""
    cut = set(c.starts[1:])
    boundary = [g for i, g in enumerate(gaps, start=1) if i in cut]
    inner = [g for i, g in enumerate(gaps, start=1) if i not in cut]
    if not boundary:
        return False
    if not inner:        # one burst per group: no hidden grouping in the gaps
        return max(boundary) < SEPARATION * max(min(boundary), 1)
    return c.complete >= 3 and min(boundary) >= SEPARATION * max(max(inner), 1)


def choose_step_bytes(bursts: list[Burst], hints: frozenset[int] = frozenset()) -> int | None:
    """G for these bursts (see the module doc), or None when not yet decidable.

    In order: a total DDP announced by broadcasting the parameters at construction
    (hints); the only total when sizes alone decide; the smallest total whose cuts
    fall on the long gaps; after FALLBACK_BURSTS bursts, the smallest total."""
    sizes = [b.bytes for b in bursts]
    for hint in sorted(hints):
        starts = partition(sizes, hint)
        if starts is not None and sum(sizes) >= hint:
            return hint
    found = candidates(sizes)
    if not found:
        return None
    if len(found) == 1 and not found[0].single():
        return found[0].total
    gaps = [bursts[i].start_ns - bursts[i - 1].end_ns for i in range(1, len(bursts))]
    if len(gaps) >= MIN_GAPS:
        for c in found:
            if _clean(c, gaps):
                return c.total
    return found[0].total if len(bursts) >= FALLBACK_BURSTS else None


class StepTracker:
    """Feed one process's collectives (any order); collect Steps and Phases."""

    def __init__(self, merge_gap_ns: int = MERGE_GAP_NS):
        self.merge_gap_ns = merge_gap_ns
        self.bursts: list[Burst] = []       # not yet part of an emitted step
        self.step_bytes: int | None = None  # G once known
        self.next_index = 0
        self.frozen_ns = 0                  # emitted steps end here
        self.cut_ns = 0                     # the last burst left behind (emitted, skipped) ends here
        self.init: Burst | None = None      # collectives before the first AllReduce
        self.init_done = False
        self.hints: set[int] = set()        # parameter bytes DDP broadcast at construction
        self.hints_seen: list[int] = []
        self.late = 0                       # windows that arrived after their step left
        self.resyncs = 0                    # G stopped cutting and was searched again
        self.skipped = 0                    # bursts left out of any step (before it, after a change)
        self.sequence: list[SequenceCall] = []  # its collectives (not empty AllReduces), by start
        self.sequenced = False              # a step is a period of the sequence (module doc)

    def add(self, c: Collective) -> tuple[list[Step], list[Phase]]:
        if c.op != "AllReduce" or c.bytes:
            self._note(c)
        if c.op != "AllReduce":
            if not self.init_done:
                self.init = self.init or Burst(c.start_ns, c.end_ns)
                self.init.add(c)
                if c.op == "Broadcast" and (c.bytes or 0) >= HINT_MIN_BYTES:
                    # DDP broadcasts the parameters (coalesced, <= 250 MB a call): each
                    # call and their sum may equal the gradient bytes of a step
                    big = sum(self.hints_seen) + c.bytes if self.hints_seen else c.bytes
                    self.hints_seen.append(c.bytes)
                    self.hints.update({c.bytes, big})
            return [], []
        phases = self._close_init() if not self.init_done else []
        if not c.bytes:
            return [], phases
        self._insert(c)
        steps, more = self._emit(final=False)
        return steps, phases + more

    def next_started(self, start_ns: int) -> tuple[list[Step], list[Phase]]:
        """An AllReduce has been in flight since start_ns (its return not seen yet).
        When the bursts held make up whole steps and it starts past the last of them
        (not in that burst), it is the next step's first: the last step ends at its
        start, and is emitted now rather than at its return (a collective waiting
        for a slow rank returns up to a step later)."""
        if self.step_bytes is None or not self.bursts or \
                start_ns <= self.bursts[-1].end_ns + self.merge_gap_ns:
            return [], []
        return self._emit(final=False, next_start_ns=start_ns)

    def open_step(self, now_ns: int, in_flight_ns: int | None) -> OpenStep | None:
        """The step in progress at now_ns, given since when an AllReduce has been in
        flight (None: none is). After next_started closed the last step, that
        AllReduce (not returned yet, so not among the bursts) is the open step's first;
        else the open step is the last group of the bursts held, opened by that
        AllReduce where it began before the group's first returned one (gloo runs a
        process group's collectives on several threads: a bucket's AllReduce can return
        before the one begun just before it). None until G is known, where the bursts
        held do not cut into steps of G, or where the AllReduce in flight reaches back
        into the group before (the cut is then unknown)."""
        if self.step_bytes is None:
            return None
        if in_flight_ns is not None and in_flight_ns > now_ns:
            in_flight_ns = None         # it began after now: not in flight then
        if not self.bursts:
            if in_flight_ns is None or in_flight_ns < self.frozen_ns:
                return None
            waited = (now_ns - in_flight_ns) / 1e9
            return OpenStep(self.next_index, in_flight_ns, waited, waited, True)
        starts = partition([b.bytes for b in self.bursts], self.step_bytes)
        if starts is None:
            return None
        group = self.bursts[starts[-1]:]
        if now_ns < group[-1].end_ns:
            return None
        start = group[0].start_ns
        windows = [w for b in group for w in b.windows]
        waiting = in_flight_ns is not None and in_flight_ns >= self.cut_ns
        if waiting and in_flight_ns < start:
            before = self.bursts[starts[-1] - 1].end_ns if starts[-1] else self.cut_ns
            if in_flight_ns <= before + self.merge_gap_ns:
                return None
            start = in_flight_ns
        if waiting:
            windows.append((in_flight_ns, now_ns))
        return OpenStep(self.next_index + len(starts) - 1, start, (now_ns - start) / 1e9,
                        _union(windows) / 1e9, waiting)

    def flush(self) -> tuple[list[Step], list[Phase]]:
        """The process ended: emit what is left (the last step has no duration)."""
        phases = self._close_init() if not self.init_done else []
        steps, more = self._emit(final=True)
        return steps, phases + more

    def _close_init(self) -> list[Phase]:
        self.init_done = True
        b, self.init = self.init, None
        if b is None:
            return []
        return [Phase("param_broadcast", b.start_ns, (b.end_ns - b.start_ns) / 1e9, b.bytes,
                      b.collectives, -1)]

    def _note(self, c: Collective) -> None:
        """Keep a collective in the call sequence (by start: they arrive as they
        return). Gathers before the first AllReduce are DDP's set-up or a sharded
        step's forward pass; only those after it tell the two apart."""
        self.sequenced = self.sequenced or (self.init_done and c.op in SEQUENCE_OPS)
        bisect.insort(self.sequence, sequence_call(c))
        if len(self.sequence) > MAX_HISTORY:
            del self.sequence[:len(self.sequence) - MAX_HISTORY]

    def _insert(self, c: Collective) -> None:
        if c.start_ns < self.frozen_ns:
            self.late += 1          # its step was emitted already: count it in the next
        lo, hi = c.start_ns - self.merge_gap_ns, c.end_ns + self.merge_gap_ns
        merged = Burst(c.start_ns, c.end_ns)
        merged.add(c)
        keep = []
        for b in self.bursts:
            if b.end_ns >= lo and b.start_ns <= hi:
                merged.start_ns, merged.end_ns = min(merged.start_ns, b.start_ns), \
                    max(merged.end_ns, b.end_ns)
                merged.bytes += b.bytes
                merged.sent_bytes += b.sent_bytes
                merged.collectives += b.collectives
                merged.windows += b.windows
            else:
                keep.append(b)
        merged.busy_ns = _union(merged.windows)
        keep.append(merged)
        # the search by bytes tries every prefix (quadratic); the sequence needs a step
        # of bursts held, and a step has at most MAX_PERIOD calls
        held = MAX_PERIOD if self.sequenced else MAX_BURSTS
        self.bursts = sorted(keep, key=lambda b: b.start_ns)[-held:]

    def _emit(self, final: bool,
              next_start_ns: int | None = None) -> tuple[list[Step], list[Phase]]:
        sizes = [b.bytes for b in self.bursts]
        if self.step_bytes is not None and partition(sizes, self.step_bytes) is None:
            self.step_bytes = None
            self.resyncs += 1
        if self.step_bytes is None and not self._resync():
            return [], []
        sizes = [b.bytes for b in self.bursts]
        starts = partition(sizes, self.step_bytes)
        groups = [self.bursts[a:b] for a, b in zip(starts, starts[1:] + [len(self.bursts)])]
        complete = sum(b.bytes for b in groups[-1]) == self.step_bytes
        # a step's duration needs the next step's start: keep the last complete group
        # unless the process ended or the next step's first AllReduce is in flight
        last = complete and (final or next_start_ns is not None)
        ready = len(groups) if last else len(groups) - 1
        steps, phases = [], []
        for i in range(ready):
            nxt = groups[i + 1][0].start_ns if i + 1 < len(groups) else next_start_ns
            step, sync_phase = self._step(groups[i], nxt)
            steps.append(step)
            phases.append(sync_phase)
            if step.seconds is not None:
                phases.append(Phase("compute", step.start_ns, step.compute_seconds, 0, 0,
                                    step.index))
        if ready:
            self.bursts = [b for g in groups[ready:] for b in g]
            self.cut_ns = groups[ready - 1][-1].end_ns
            self.frozen_ns = self.bursts[0].start_ns if self.bursts else self.cut_ns
        return steps, phases

    def _resync(self) -> bool:
        """Find G; after a change, dropping up to MAX_SKIP leading bursts left over."""
        if self.sequenced:
            return self._resync_by_sequence()
        most = min(MAX_SKIP, len(self.bursts)) if self.resyncs else 0
        for skip in range(most + 1):
            total = choose_step_bytes(self.bursts[skip:], frozenset(self.hints))
            if total is not None:
                self._adopt(total, skip)
                return True
        return False

    def _adopt(self, total: int, skip: int) -> None:
        """G is `total`; the first `skip` bursts held are left out of any step."""
        self.step_bytes = total
        self.skipped += skip
        if skip:
            self.cut_ns = self.bursts[skip - 1].end_ns
        self.bursts = self.bursts[skip:]

    def _resync_by_sequence(self) -> bool:
        """G from the period of the call sequence: the AllReduce bytes of one repeat;
        the bursts before the first held one that opens a repeat are dropped."""
        found = find_pattern(self.sequence, fresh=not self.resyncs)
        if found is None:
            return False
        q = found.period
        repeat = self.sequence[found.anchor:found.anchor + q]
        first = next((i for i, c in enumerate(repeat) if c.token[0] == "AllReduce"), None)
        if first is None:
            return False
        total = sum(c.token[1] for c in repeat if c.token[0] == "AllReduce")
        for k in range(found.anchor + first, len(self.sequence), q):
            opens = self.sequence[k].ts_ns
            skip = next((i for i, b in enumerate(self.bursts)
                         if b.start_ns <= opens <= b.end_ns), None)
            if skip is not None and \
                    partition([b.bytes for b in self.bursts[skip:]], total) is not None:
                break
        else:
            return False
        self._adopt(total, skip)
        return True

    def _step(self, group: list[Burst], next_start: int | None) -> tuple[Step, Phase]:
        start = group[0].start_ns
        sync = sum(b.busy_ns for b in group) / 1e9
        step = Step(index=self.next_index, start_ns=start,
                    seconds=None if next_start is None else (next_start - start) / 1e9,
                    sync_seconds=sync, buckets=sum(b.collectives for b in group),
                    bytes=sum(b.bytes for b in group),
                    sent_bytes=sum(b.sent_bytes for b in group))
        self.next_index += 1
        return step, Phase("grad_sync", start, sync, step.bytes, step.buckets, step.index)
