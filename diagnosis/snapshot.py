"""One evaluation of a job: every number the detectors decide by, computed once.

From the job's evidence (diagnosis/evidence.py) at one moment: the network cells
of the last `eval_seconds` with their verdicts (lossy, delayed), the nodes'
totals, each rank's recent steps (medians of its last `recent_steps`), the
job's medians across ranks, and the job's own baseline (found by the engine).
Detectors read a Snapshot and return candidates; none reads the store.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from fabricscope.diagnosis.evidence import (SECOND, CellTotals, JobEvidence, NodeTotals, Phase, PhaseIndex,
                                Progress, Step, Window)
from fabricscope.diagnosis.thresholds import Thresholds


@dataclass
class RankRecent:
    rank: str
    node: str
    steps: list[Step]
    seconds: float
    sync: float
    compute: float
    data_load: float | None     # seconds of data loading per step (None: unknown)
    throttled: float | None = None   # seconds its CPU cgroup was throttled per step
    #                                  (capped at the step; None: unread)
    in_progress: bool = False   # the last of `steps` is the one it is in (so far)
    #: cpu_compute() of each of `steps`, in their order (None: its read not in yet)
    step_cpu: list[float | None] = field(default_factory=list)

    @property
    def cpu_compute(self) -> float:
        """Its compute outside storage I/O per step (the median of step_cpu known)."""
        known = [c for c in self.step_cpu if c is not None]
        return _median(known) if known else 0.0

    def cpu_of(self, step: Step) -> float | None:
        """cpu_compute() of one of its steps (None: not known yet)."""
        return self.step_cpu[self.steps.index(step)]

    @property
    def duty(self) -> float:
        return self.sync / self.seconds if self.seconds else 0.0


@dataclass
class Baseline:
    """The job's own normal, from its first stretch of steps with nothing open."""

    step_s: float
    sync_s: float
    compute_s: float
    data_load_s: float
    spread_s: float             # median absolute deviation of step time
    duty: float
    start_ns: int
    end_ns: int


@dataclass
class Snapshot:
    job: str
    now_ns: int
    window: Window
    cells: list[CellTotals]
    data_cells: list[CellTotals]
    lossy: list[CellTotals]
    delayed: list[CellTotals]
    rtt_floor_us: float | None
    nodes: dict[str, NodeTotals]
    ranks: dict[str, RankRecent]
    baseline: Baseline | None
    evidence: JobEvidence
    thresholds: Thresholds
    # job-level medians across ranks of their recent medians (None: no steps yet)
    step_s: float | None = None
    sync_s: float | None = None
    compute_s: float | None = None
    data_load_s: float | None = None
    steps_end_ns: int = 0       # end of the latest step the ranks' medians include
    notes: dict = field(default_factory=dict)
    #: the cells whose delay could be judged (snapshot.classify_cells)
    timed: list[CellTotals] = field(default_factory=list)
    #: each hop's median RTT in the job's baseline (cell key -> us; empty before it)
    usual_rtt_us: dict = field(default_factory=dict)
    #: each node's usual busiest 100 us bin received (node -> bit/s)
    usual_rx_peak: dict = field(default_factory=dict)
    #: each node's usual rate of its reads from outside the job (node -> bytes/s)
    usual_read_bps: dict = field(default_factory=dict)

    @property
    def step_added_s(self) -> float:
        """Seconds each step lost against the baseline (0 without one)."""
        if self.baseline is None or self.step_s is None:
            return 0.0
        return max(0.0, self.step_s - self.baseline.step_s)

    @property
    def slow(self) -> bool:
        b = self.baseline
        return b is not None and self.step_s is not None and \
            self.step_s >= b.step_s * (1 + self.thresholds.slowdown)

    def cells_of(self, node: str) -> list[CellTotals]:
        """Cells sent by `node` or to it."""
        return [c for c in self.data_cells if node in (c.key.node, c.peer_node)]


def phase_seconds(ev: JobEvidence, rank: str, step: Step, kind: str) -> float:
    """Seconds of the step spent in `kind` phases: per peer, from the first phase's
    start to the last one's end. A slow store streams a read in pieces (each a
    transfer of its own, the pauses between them longer than the agent's transfer
    gap); the read lasts from its first byte to its last, pauses included."""
    return _spanned(ev.phases_between(rank, kind, step.time_ns, step.end_ns))


def _spanned(phases: list[Phase]) -> float:
    """phase_seconds of these phases."""
    if len(phases) == 1:           # most steps: one read, one checkpoint
        # end - start as the spans below compute it (not .seconds): the same to the bit
        start = phases[0].time_ns / SECOND
        return start + phases[0].seconds - start
    spans: dict[str, list[float]] = {}
    for p in phases:
        start, end = p.time_ns / SECOND, p.time_ns / SECOND + p.seconds
        lo_hi = spans.setdefault(p.peer, [start, end])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], start), max(lo_hi[1], end)
    return sum(hi - lo for lo, hi in spans.values())


class _StepPhases:
    """phase_seconds for the steps of one rank in one evaluation: each kind's order
    looked up once, each step's value computed once (a rank's recent steps are asked
    for their compute and for their reads)."""

    def __init__(self, ev: JobEvidence, rank: str):
        self.ev, self.rank = ev, rank
        self.index: dict[str, PhaseIndex] = {}
        self.memo: dict[tuple, float] = {}

    def seconds(self, step: Step, kind: str) -> float:
        key = (step.time_ns, step.seconds, step.sync_seconds, kind)    # its span
        value = self.memo.get(key)
        if value is None:
            index = self.index.get(kind)
            if index is None:
                index = self.index[kind] = self.ev.phases_of(self.rank, kind)
            value = self.memo[key] = _spanned(index.between(step.time_ns, step.end_ns))
        return value

    def cpu_compute(self, step: Step) -> float:
        """cpu_compute(ev, step) of this rank's step."""
        io = sum([self.seconds(step, kind) for kind in STORAGE_PHASES])
        return max(0.0, (step.seconds or 0.0) - step.sync_seconds - io)


#: the phases in which a rank waits on the store, not the CPU: its dataset reads and
#: its checkpoint writes (gloo_phase)
STORAGE_PHASES = ("data_load", "checkpoint")


def cpu_compute(ev: JobEvidence, step: Step) -> float:
    """The step's compute outside storage I/O: its time outside the collectives less its
    reads and checkpoint writes. A slow store lengthens a rank's compute as a slow CPU
    does, and the ranks' reads do not start together (the first reader meets the slow
    store a step before the others), so one rank can enter a collective late for a step
    or two while reading: that is the input's time (input_stall), not the rank's.
    A read is reported piece by piece as it streams, so most of a read in progress is
    already here."""
    return _StepPhases(ev, step.rank).cpu_compute(step)


def recent_ranks(ev: JobEvidence, until_ns: int, count: int) -> dict[str, RankRecent]:
    """Each rank's last `count` complete steps ending before until_ns, as medians.

    Phases arrive later than steps (a transfer is reported when its flow's next one
    starts), so a step's data loading may not be all in when it is read: what has
    come of it is a lower bound on the time its read took (a slow store streams a
    read in pieces, each reported when the next begins, so most of a slow read is in
    within one piece of its end). A lower bound never shows a stall that was not
    there; waiting for every step's last piece (the next step's read) named a slow
    store a step later."""
    out = {}
    # each rank's step in progress, looked up once: whether it waits in a collective,
    # whether it is late, and its read so far all come from it
    open_steps = {rank: ev.open_step(rank) for rank in ev.steps}
    waiting = {rank for rank, p in open_steps.items() if p is not None and p.waiting}
    others = len(ev.steps) - 1
    for rank, table in ev.steps.items():
        times = ev.step_times(rank)
        done = list(itertools.islice(_latest_first(table, times, until_ns), count))[::-1]
        if len(done) < count:
            continue
        now = open_steps[rank]
        done, in_progress = _with_open_step(now, done, until_ns) \
            if 2 * (len(waiting) - (rank in waiting)) > others else (done, False)
        phases = _StepPhases(ev, rank)
        reads = _reads_every_step(phases, itertools.islice(
            _latest_first(table, times, until_ns), PHASE_LOOKBACK_STEPS))
        out[rank] = RankRecent(
            rank, done[-1].node, done,
            _median([s.seconds for s in done]),
            _median([s.sync_seconds for s in done]),
            _median([max(0.0, s.seconds - s.sync_seconds) for s in done]),
            _data_load(phases, itertools.islice(_latest_first(table, times, until_ns),
                                                PHASE_LOOKBACK_STEPS), now),
            _throttled(done), in_progress,
            [phases.cpu_compute(s) if not reads or phases.seconds(s, "data_load") > 0
             else None for s in done])
    return out


def _reads_every_step(phases: "_StepPhases", steps: Iterable[Step]) -> bool:
    """Whether most of the rank's recent steps read from outside the job: then a step
    whose read has not come is one whose compute is not known yet (the agent reports
    a read once its flow settles, up to a poll after the step's end, and a read slowed
    on its way in would otherwise count as compute: a rank behind a congested
    downlink looked a straggler a second after the queue came)."""
    steps = list(steps)
    return 2 * sum(phases.seconds(s, "data_load") > 0 for s in steps) > len(steps)


def _with_open_step(p: Progress | None, done: list[Step],
                    until_ns: int) -> tuple[list[Step], bool]:
    """The rank's recent steps, the newest being the step it is in (p: gloo_progress)
    where it is computing, outside the collectives, and has computed longer so far
    than its recent median: a rank late to the next collective is late before its
    step ends, and the peers that wait for it wait meanwhile. The caller asks only
    while most of the other ranks wait inside a collective: where they compute too
    (every rank reading from a slow store, or done with training and never opening
    another collective, their last step "in progress" until they exit), no rank is
    late to anyone, and the step's length is not known before it ends. A report's time so far
    is a lower bound of the step's, so it is taken only where it already exceeds
    what the rank's steps show (two of its three steps are at or above the median
    it replaces, so no median falls by taking it). A rank inside a collective has
    not done the compute that follows, and how much of a step its cgroup was
    throttled through is no bound at all until the step ends (a quota's throttling
    spills into the start of the next step): neither is taken.
    Returns the steps and whether the newest is the one in progress."""
    if p is None or p.waiting or p.time_ns + int(p.seconds * SECOND) > until_ns:
        return done, False
    step = p.as_step()
    if step.compute_seconds <= _median([max(0.0, s.seconds - s.sync_seconds) for s in done]) \
            or p.seconds < _median([s.seconds for s in done]):
        return done, False
    return done[1:] + [step], True


def _median(values: list[float]) -> float:
    """statistics.median of a short list, without its generality: every rank's recent
    steps take three of them each evaluation."""
    values.sort()
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def throttled_in(step: Step) -> float | None:
    """Seconds of the step its rank's CPU cgroup was throttled, at most the step's own
    length (the kernel sums the throttled time over the CPUs the cgroup ran on)."""
    if step.throttled_seconds is None or step.seconds is None:
        return None
    return min(step.throttled_seconds, step.seconds)


def _throttled(steps: list[Step]) -> float | None:
    known = [x for x in map(throttled_in, steps) if x is not None]
    return _median(known) if known else None


def _latest_first(table: dict, times: list[int], until_ns: int) -> Iterator[Step]:
    """The rank's complete steps that ended by until_ns, the latest first: evaluations
    need only the last few of the hundreds kept."""
    for t in reversed(times):
        s = table[t]
        if s.seconds is not None and s.end_ns <= until_ns:
            yield s


#: steps with a read that say how long the rank's reads take now: two, and the shorter
#: of the two, so that one read slowed by a descheduled reader is no trend
PHASE_STEPS = 2
#: how many of the latest steps are searched for them: a job that reads no
#: data over the network (data in memory, on local disk) has no data_load phase in
#: any step, and its evaluations must not walk every step kept; reads that none of
#: the last 16 steps showed say nothing about how long reads take now
PHASE_LOOKBACK_STEPS = 16


def _data_load(phases: _StepPhases, steps: Iterable[Step],
               p: Progress | None) -> float | None:
    """The shorter data_load time of the latest PHASE_STEPS reads: of the first of
    these steps (the latest first) that had one, and of the read of the step the rank
    is in (p: gloo_progress) where that takes the value up. The agent reports a read's
    pieces only from one that is large enough or follows another closely, so a slow
    store's read may go unreported in some steps; a step without one says nothing
    about how long its read took (None when too few have one). A read in progress
    is reported piece by piece as it streams: what has come of it is a lower bound
    of its length, so the shortest of it and the latest complete reads is a lower
    bound of the latest reads' shortest, taken only where it exceeds what the complete
    steps give (a read just begun would lower it). It names a slow store while its
    second slow read still streams, a step sooner."""
    spans = []
    for step in steps:
        seconds = phases.seconds(step, "data_load")
        if seconds > 0:
            spans.append(seconds)
            if len(spans) == PHASE_STEPS:
                break
    done = min(spans) if len(spans) == PHASE_STEPS else None
    if p is None or len(spans) < PHASE_STEPS - 1:
        return done
    so_far = phases.seconds(p.as_step(), "data_load")
    if so_far <= 0:
        return done
    return max(done or 0.0, min([so_far, *spans[:PHASE_STEPS - 1]]))


def resends_as_lossy(c, t: Thresholds, min_segs: int | None = None) -> bool:
    """A hop's window or second (CellTotals, CellSecond) resent as a lossy one does: at
    least min_segs segments (loss_min_segs unless given), and loss_ratio of the
    payload it sent."""
    sent = c.bytes_acked + c.retrans_bytes
    return c.retrans_segs >= (t.loss_min_segs if min_segs is None else min_segs) and \
        sent > 0 and c.retrans_bytes / sent >= t.loss_ratio


def rtt_inflated(rtt_us: float, floor_us: float, t: Thresholds) -> bool:
    """A median RTT that stands rtt_inflation times, and rtt_excess_us, above the
    floor: a queue's, not the hosts' own pace."""
    return rtt_us >= max(floor_us * t.rtt_inflation, floor_us + t.rtt_excess_us)


def classify_cells(cells: list[CellTotals], floor_of, t: Thresholds):
    """(data cells, lossy cells, delayed cells, timed cells) of one window;
    floor_of(cell) is the RTT floor the cell is judged against (None: not known, or
    a peer outside the job). Timed cells are those whose delay was judged: data
    cells with RTT samples and a floor; only of them is "delayed or not" known."""
    data = [c for c in cells if c.bytes_acked >= t.cell_min_bytes]
    lossy = [c for c in cells if c.bytes_acked + c.retrans_bytes >= t.cell_min_bytes
             and resends_as_lossy(c, t)]
    delayed, timed = [], []
    for c in data:
        floor = floor_of(c)
        if floor is None or c.rtt_p50_us is None:
            continue
        timed.append(c)
        if rtt_inflated(c.rtt_p50_us, floor, t):
            delayed.append(c)
    return data, lossy, delayed, timed


def read_rates(ev: JobEvidence, t0_ns: int, t1_ns: int) -> dict[str, float]:
    """Each node's reads from peers outside the job in the steps its ranks began in
    [t0, t1): the median over those steps of the step's read rate, its bytes over its
    span from first byte to last (phase_seconds: a read paced by a slow path comes in
    pieces, each fast, with the pauses between them). A read of a sample takes many
    round trips and lasts far longer than a shaper's bucket drains, so its rate is
    the path's sustained rate into the node, which a 100 us peak is not."""
    rates: dict[str, list[float]] = {}
    for rank, node in ev.node_of_rank.items():
        times = ev.step_times(rank)
        table = ev.steps.get(rank, {})
        for t_ns in times[bisect.bisect_left(times, t0_ns):bisect.bisect_left(times, t1_ns)]:
            step = table[t_ns]
            end = t_ns + int(step.seconds * SECOND) if step.seconds is not None else t1_ns
            pieces = ev.phases_between(rank, "data_load", t_ns, end)
            span = _spanned(pieces) if pieces else 0.0
            if span > 0:
                rates.setdefault(node, []).append(sum(p.bytes for p in pieces) / span)
    return {node: statistics.median(r) for node, r in rates.items()}


def median_or_none(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
