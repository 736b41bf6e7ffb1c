"""Records of the gloo probe: per collective, per inferred step and phase, and the
traffic model, for one training process at a time (ProcessState). Pure: times in
monotonic ns go through `to_wall`; the wall clock for the model window is given.

The traffic model needs no buffer hooks: T comes from the autocorrelation and onsets
of the collectives' bytes over time (the ring model's bytes from the options, or
with gloo_buffer_hooks the payload sent), D from the collective windows, and B from
the NIC's busiest bins inside those windows (agent/probes/nic/history.py, when the
nic probe runs).
"""

from __future__ import annotations

import collections
import enum
import threading
from dataclasses import dataclass
from typing import Callable

from fabricscope.agent.probes.gloo import layout
from fabricscope.agent.probes.gloo.layout import Collective
from fabricscope.agent.probes.gloo.procs import ProcessInfo
from fabricscope.agent.probes.gloo.steps import OpenStep, Phase, Step, StepTracker
from fabricscope import busbw, trafficmodel
from fabricscope.cgroupcpu import CgroupCpu
from fabricscope.records import Record

MODEL_BIN_S = 0.001         # 1 ms: well below a gradient burst on any real link
MIN_MODEL_WINDOWS = 6       # collectives needed in the window before fitting
CPU_SAMPLE_S = 0.05         # the sampler's period: half of CFS's default period
CPU_SAMPLES = 2400          # throttling samples kept per cgroup: 2 min of them


class ModelSeries(str, enum.Enum):
    """What the bandwidth series T is fitted to (traffic_model `series`)."""

    SENT = "gloo_sent"          # payload handed to the transport (gloo_buffer_hooks)
    RING = "gloo_ring"          # the ring model's bytes per rank, from the message sizes
    WINDOWS = "gloo_windows"    # time in collectives: no size known


#: the point-to-point ops (agent/probes/gloo/layout.py P2P), and the receiving one
P2P_OPS = frozenset(op.name for op in layout.P2P)
P2P_RECEIVE = frozenset({"Recv"}) & P2P_OPS


def _model_weight(c: Collective, payload_known: bool) -> int:
    """The bytes a collective puts in the model's series (0: none known)."""
    if payload_known:
        return c.sent_bytes
    if c.model and c.bytes and c.nranks:
        return round(busbw.ring_bytes_per_rank(c.model, c.bytes, c.nranks))
    return 0


def _tags(info: ProcessInfo) -> dict[str, str]:
    pod = {"namespace": info.namespace, "pod": info.pod} if info.pod else {}
    return {"job": info.job, "rank": info.rank, **pod}


def collective_record(c: Collective, info: ProcessInfo, to_wall: Callable[[int], int],
                      payload_known: bool = True) -> Record:
    """payload_known: the UnboundBuffer hooks ran (gloo_buffer_hooks); without them the
    sent and posted payload is unknown, and left out rather than written as 0."""
    fields: dict = {"seconds": c.seconds, "bytes_source": c.bytes_source,
                    "pid": c.pid, "tid": c.tid}
    if payload_known:
        fields.update(sent_bytes=c.sent_bytes, recv_bytes=c.recv_bytes, sends=c.sends)
    if c.bytes is not None:
        fields["bytes"] = c.bytes
    if c.nranks is not None:
        fields["nranks"] = c.nranks
    if c.rank is not None:
        fields["comm_rank"] = c.rank
    if c.peer is not None:
        fields["peer"] = c.peer
    if c.model and c.bytes and c.nranks:
        if c.seconds > 0:
            fields["algbw_gbs"] = busbw.algbw_gbs(c.bytes, c.seconds)
            fields["busbw_gbs"] = busbw.busbw_gbs(c.model, c.bytes, c.seconds, c.nranks)
        if c.op not in P2P_RECEIVE:          # a receiver sends nothing
            ring = round(busbw.ring_bytes_per_rank(c.model, c.bytes, c.nranks))
            fields["ring_bytes"] = ring
            if c.sent_bytes:
                fields["wire_efficiency"] = ring / c.sent_bytes
    return Record("gloo_collective", to_wall(c.start_ns), {**_tags(info), "op": c.op}, fields)


def step_record(s: Step, info: ProcessInfo, nranks: int | None,
                to_wall: Callable[[int], int], payload_known: bool = True,
                cpu: CpuSpan | None = None) -> Record:
    fields: dict = {"step": s.index, "sync_seconds": s.sync_seconds, "buckets": s.buckets,
                    "bytes": s.bytes}
    if cpu is not None:
        fields["throttled_seconds"] = cpu.throttled_s
        if cpu.limit_cpus is not None:
            fields["cpu_limit"] = cpu.limit_cpus
            fields["cpu_limit_held"] = cpu.limit_held
    if payload_known:
        fields["sent_bytes"] = s.sent_bytes
    if s.seconds is not None:
        fields["seconds"] = s.seconds
        fields["compute_seconds"] = s.compute_seconds
        if s.seconds > 0:
            fields["comm_fraction"] = min(1.0, s.sync_seconds / s.seconds)
    if nranks and nranks > 1:
        if s.sync_seconds > 0:
            fields["busbw_gbs"] = busbw.busbw_gbs("AllReduce", s.bytes, s.sync_seconds, nranks)
        if s.sent_bytes:
            fields["wire_efficiency"] = \
                busbw.ring_bytes_per_rank("AllReduce", s.bytes, nranks) / s.sent_bytes
    return Record("gloo_step", to_wall(s.start_ns), _tags(info), fields)


def progress_record(o: OpenStep, info: ProcessInfo, to_wall: Callable[[int], int],
                    cpu: CpuSpan | None = None) -> Record:
    """The step in progress (time = its start, as its gloo_step will have): each poll
    writes it again, and the store keeps the latest."""
    fields: dict = {"step": o.index, "seconds": o.seconds, "sync_seconds": o.sync_seconds,
                    "compute_seconds": o.compute_seconds, "waiting": o.waiting}
    if cpu is not None:
        fields["throttled_seconds"] = cpu.throttled_s
    return Record("gloo_progress", to_wall(o.start_ns), _tags(info), fields)


def phase_record(p: Phase, info: ProcessInfo, to_wall: Callable[[int], int]) -> Record:
    return Record("gloo_phase", to_wall(p.start_ns), {**_tags(info), "phase": p.name},
                  {"seconds": p.seconds, "bytes": p.bytes, "collectives": p.collectives,
                   "step": p.step})


@dataclass(frozen=True)
class CpuSpan:
    throttled_s: float          # the cgroup's throttled time in the span (over its CPUs)
    limit_cpus: float | None    # its CPU quota at the span's end (None: unlimited)
    limit_held: bool = False    # every sample from the span's start to its end showed it


class CpuSamples:
    """A cgroup's cumulative throttled time, sampled every CPU_SAMPLE_S by the probe's
    sampler thread and at every poll before the probe reads its events (so that a
    step ending in an event read now lies between two samples); a step's share is
    interpolated linearly between the samples around its ends. CFS decides
    throttling per period (100 ms by default), and sampling at half of that keeps a
    step's share to within a period: steps a quota throttles on and off, one after
    the other, stay apart. The quota is read with every sample (a few tens of us:
    under 1 ms of CPU a second per cgroup), so that each step carries the quota at
    its own end: the diagnosis names a rank that one standing limit paces, and a
    quota changed between two steps must show as changed (read once a second, a
    quota on every other 0.4 s step showed the same value on neighbouring steps)."""

    def __init__(self, cgroup: CgroupCpu, keep: int = CPU_SAMPLES):
        self.cgroup = cgroup
        self.samples: collections.deque = collections.deque(maxlen=keep)  # (ns, ns, cpus)
        self._lock = threading.Lock()

    def sample(self, now_ns: int) -> None:
        throttled = self.cgroup.throttled_ns()
        if throttled is None:
            return
        limit = self.cgroup.limit_cpus()
        with self._lock:
            if not self.samples or self.samples[-1][0] < now_ns:
                self.samples.append((now_ns, throttled, limit))

    def span(self, start_ns: int, end_ns: int) -> CpuSpan | None:
        """None unless samples bracket the span (a cgroup that could not be read, a
        step older than the samples kept, an event read after the latest sample)."""
        with self._lock:
            if not self.samples or self.samples[0][0] > start_ns \
                    or self.samples[-1][0] < end_ns:
                return None
            (a, first), (b, limit) = self._at(start_ns), self._at(end_ns)
            held = first == limit and all(
                sample[2] == limit for sample in self._within(start_ns, end_ns))
        return CpuSpan(max(0.0, (b - a) / 1e9), limit, held)

    def _within(self, start_ns: int, end_ns: int):
        """The samples taken from start_ns to end_ns, newest first."""
        for sample in reversed(self.samples):
            if sample[0] < start_ns:
                return
            if sample[0] <= end_ns:
                yield sample

    def _at(self, t_ns: int) -> tuple[float, float | None]:
        """The throttled ns at t_ns and the quota of the first sample from it on; from
        the newest sample back, where the steps being recorded are."""
        later = None
        for sample in reversed(self.samples):
            if sample[0] <= t_ns:
                if later is None or later[0] == sample[0]:
                    return float(sample[1]), sample[2]
                f = (t_ns - sample[0]) / (later[0] - sample[0])
                return sample[1] + f * (later[1] - sample[1]), later[2]
            later = sample
        return float(later[1]), later[2]


class ProcessState:
    """Everything the probe keeps about one local training process."""

    def __init__(self, info: ProcessInfo, model_window_s: float, payload_known: bool = True,
                 cpu: CpuSamples | None = None):
        self.info = info
        self.cpu = cpu
        self.payload_known = payload_known
        self.tracker = StepTracker()
        self.model_window_ns = int(model_window_s * 1e9)
        # (start_ns, end_ns, bytes: _model_weight) of recent collectives, for the model
        self.windows: collections.deque = collections.deque()
        self.nranks: int | None = info.world_size
        self.last_end_ns = 0
        self.modelled_to_ns = 0      # the last collective end a model record covered

    def on_collective(self, c: Collective, to_wall: Callable[[int], int]) -> list[Record]:
        if c.nranks and c.op == "AllReduce":
            self.nranks = c.nranks           # the gradient communicator's size
        out = [collective_record(c, self.info, to_wall, self.payload_known)]
        if c.op in P2P_OPS:
            # a pipeline's transfers: part of its traffic model, not of DDP's steps (no
            # gradient sync), and never the parameter broadcast before them
            self.windows.append((c.start_ns, c.end_ns, c.bytes or 0))
            self.last_end_ns = max(self.last_end_ns, c.end_ns)
            return out
        # the wave starts with the first gradient sync: the parameter broadcast before
        # it would set the burst level and hide the steps
        if c.op == "AllReduce" or self.tracker.init_done:
            self.windows.append((c.start_ns, c.end_ns, _model_weight(c, self.payload_known)))
        self.last_end_ns = max(self.last_end_ns, c.end_ns)
        steps, phases = self.tracker.add(c)
        return out + self._records(steps, phases, to_wall)

    def on_next_step(self, start_ns: int, to_wall: Callable[[int], int]) -> list[Record]:
        """The process has had an AllReduce in flight since start_ns: the steps it
        closes (StepTracker.next_started)."""
        steps, phases = self.tracker.next_started(start_ns)
        return self._records(steps, phases, to_wall)

    def progress(self, now_ns: int, in_flight_ns: int | None,
                 to_wall: Callable[[int], int]) -> list[Record]:
        """The step in progress now (StepTracker.open_step), with its throttled time so
        far where the cgroup was sampled since now (the probe samples every cgroup once
        per poll); none before the steps are known."""
        o = self.tracker.open_step(now_ns, in_flight_ns)
        if o is None:
            return []
        cpu = self.cpu.span(o.start_ns, now_ns) if self.cpu is not None else None
        return [progress_record(o, self.info, to_wall, cpu)]

    def flush(self, to_wall: Callable[[int], int], nic_bins=None) -> list[Record]:
        """The process exited: its last steps and phases, and the traffic model of its
        last window where collectives ended since the last model (a process that exits
        between two periodic models, or lives shorter than the interval, keeps its
        traffic model)."""
        steps, phases = self.tracker.flush()
        out = self._records(steps, phases, to_wall)
        if self.last_end_ns > self.modelled_to_ns:
            model = self.model_record(self.last_end_ns, to_wall, nic_bins)
            if model is not None:
                out.append(model)
        return out

    def _records(self, steps: list[Step], phases: list[Phase], to_wall) -> list[Record]:
        return [step_record(s, self.info, self.nranks, to_wall, self.payload_known,
                            self._cpu_span(s))
                for s in steps] + \
            [phase_record(p, self.info, to_wall) for p in phases]

    def _cpu_span(self, s: Step) -> CpuSpan | None:
        if self.cpu is None or s.seconds is None:
            return None
        return self.cpu.span(s.start_ns, s.start_ns + int(s.seconds * 1e9))

    def model_record(self, now_ns: int, to_wall: Callable[[int], int],
                     nic_bins=None) -> Record | None:
        """The traffic model over the last window ending now, or over the last
        MIN_MODEL_WINDOWS collectives where they span longer: a fit needs that many
        bursts however slow the steps are, so a job whose steps outlast the window's
        share of them is modelled too (None: fewer collectives than that so far).
        nic_bins: the nic probe's BinHistory (B), None where no nic probe runs."""
        start = now_ns - self.model_window_ns
        while len(self.windows) > MIN_MODEL_WINDOWS and self.windows[0][1] < start:
            self.windows.popleft()
        if len(self.windows) < MIN_MODEL_WINDOWS or self.last_end_ns <= self.modelled_to_ns:
            return None         # too few collectives, or none ended since the last model
        # the series spans the traffic seen: no leading or trailing silence of a
        # process that started or ended inside the window
        t0 = self.windows[0][0] if self.windows[0][1] < start else \
            max(start, self.windows[0][0])
        t1 = max(e for _, e, _ in self.windows)
        self.modelled_to_ns = max(self.modelled_to_ns, t1)
        kind, series = self._series(t0, t1)
        model = trafficmodel.fit(series, MODEL_BIN_S)
        fields: dict = {"acf_peak": model.acf_peak, "window_s": model.window_s}
        if model.period_s is not None:
            fields["period_s"] = model.period_s
        if kind is not ModelSeries.WINDOWS:
            fields["mean_bytes_per_s"] = model.mean_bytes_per_s
        duty = trafficmodel.duty_from_windows(((s, e) for s, e, _ in self.windows), t0, t1)
        fields.update(duty_cycle=duty, network_bound=duty > 0.5)
        fields.update(_burst_fields(nic_bins, [(s, e) for s, e, _ in self.windows]))
        return Record("traffic_model", to_wall(now_ns), {**_tags(self.info), "series": kind.value},
                      fields)

    def _series(self, t0: int, t1: int):
        """(what it is, bytes per MODEL_BIN_S bin over [t0, t1)): the collectives' bytes,
        or where no size is known their time in flight."""
        kind = ModelSeries.SENT if self.payload_known else ModelSeries.RING
        windows = [(s / 1e9, e / 1e9, b) for s, e, b in self.windows]
        if not any(b for _, _, b in windows):
            kind = ModelSeries.WINDOWS
            windows = [(s, e, e - s) for s, e, _ in windows]
        return kind, trafficmodel.series_from_windows(windows, t0 / 1e9, t1 / 1e9, MODEL_BIN_S)


def _burst_fields(nic_bins, windows: list[tuple[int, int]]) -> dict:
    """B: the median over the collective windows of the busiest NIC bin received inside
    each, on the interface that received the most inside them; none where no nic
    probe runs or its bins do not cover the windows."""
    peaks = nic_bins.peaks(windows) if nic_bins is not None else None
    if peaks is None:
        return {}
    out = {"burst_bytes_per_s": peaks.peak_bytes_per_s, "burst_interface": peaks.interface,
           "burst_windows": peaks.windows}
    if peaks.line_rate_bps:
        out["burst_util"] = peaks.peak_bytes_per_s * 8 / peaks.line_rate_bps
    return out
