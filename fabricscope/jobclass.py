"""What kind of job a window of collectives comes from, decided from the traffic alone.

    result = classify([Observation("AllReduce", 4 << 20, start_ns, end_ns, rank=0), ...])
    result.job_class      # JobClass.DATA_PARALLEL
    result.reason         # the rule that decided, with its numbers

The ops fall into four exchange families, each the signature of one way to split
a model over ranks, and the control ops that every kind issues now and then:

* AllReduce: data parallelism. Every rank holds the whole model and sums the
  gradients once per step.
* AllGather / ReduceScatter: sharding (ZeRO-3, FSDP). No rank holds the whole
  model: each layer's parameters are gathered before its forward and again before
  its backward (they are freed in between) and its gradients reduce-scattered, so
  these two carry all of its exchanged bytes. ProcessGroupGloo runs a
  ReduceScatter as an AllReduce of the whole buffer, so on gloo a sharded job
  shows AllGather with 2/3 of the bytes and AllReduce with 1/3: still a majority.
* AlltoAll: mixture of experts. Tokens go to their experts' ranks and come back,
  twice more for the gradients.
* Send / Recv: pipeline stages handing activations forward and gradients back.
* Broadcast, Barrier, Gather, Scatter, Reduce: set-up and control (the initial
  parameter broadcast, a checkpoint's gather); listed in the mix, never deciding.

Rules, in order:

1. No exchange op in the window: UNKNOWN.
2. No backward pass and no period (or no backward pass and served before:
   `served`): INFERENCE. A server has no backward pass, so nothing reduces
   gradients (AllReduce, ReduceScatter) or sends them back down a pipeline
   (_backward_pass), and its work follows requests that arrive at random, so its
   traffic does not repeat. Training repeats one step, so its traffic is
   periodic (fabricscope.trafficmodel finds the period in the activity series);
   where its backward pass shows, its repeat is a step however much a busy host
   makes the steps jitter.
3. A family with more than half of the exchanged bytes names the class: bytes, not
   calls, because the network carries bytes (a MoE job's few small router
   AllReduces do not make it data parallel).
4. Otherwise MIXED, with the families present in order of their bytes.

Alongside the class: the mix (share of each family by count and by bytes), the
message sizes (p50, p90), the period and collectives per step and rank where the
traffic is periodic, and for aperiodic traffic the arrival rate (of the repeats
of its op sequence; see _timing); for both, the spread of the gaps between those
repeats (IQR / median: 1.58 for Poisson arrivals, near 0 for a clock). And the
models that fit the class: per pipeline stage (fabricscope.stagemodel), per
all-to-all receiver (fabricscope.alltoallmodel), per served request
(fabricscope.requestmodel), with the ranks' share of time inside the exchanges.

Observations that cannot be used (an unknown op, negative bytes, an end before
the start) are dropped and counted by cause in `dropped`; one whose size is not
known (None) counts for the mix by count and the period, with no bytes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from fabricscope import trafficmodel
from fabricscope.alltoallmodel import AlltoallModel, alltoall_model, time_shares
from fabricscope.requestmodel import RequestModel, request_model
from fabricscope.stagemodel import StageModel, stage_model

BIN_S = 0.001            # activity series resolution: a gloo collective lasts ~1 ms or more
#: a loop repeats when this share of its calls match the call one repeat later: the
#: same calls every step, less the window's cut ends and one-off calls (DDP rebuilds
#: its buckets after step 0, set-up collectives)
REPEAT_MATCH = 0.9
REPEATS_MIN = 3          # a repeat seen fewer times than this is no evidence of a loop
#: standard errors by which a longer repeat must match better than the shortest to be
#: the loop's (_rank_repeat): one-sided, 3e-5 by chance for one L, some 1 % over the
#: few hundred L a window tries; a repeat inside a 16-layer FSDP step misses 4 % of
#: the calls, 4 standard errors at 400 calls
REPEAT_Z = 4.0
#: spread (IQR / median) of the gaps between repeats: a clocked loop ~0 (jitter),
#: Poisson arrivals 1.58; halfway between
SPREAD_PERIODIC = 0.8
#: share of the repeats' gap variance that their position within a longer cycle must
#: explain for the cycle to be the step (_step_multiple): gaps that only jitter
#: reach it in 4 of 10,000 windows at the fewest gaps allowed (4 per position;
#: Monte Carlo over uniform and exponential gaps, m = 2..8, all m tried together)
PHASE_EXPLAINED = 0.95


class JobClass(str, enum.Enum):
    DATA_PARALLEL = "data_parallel"
    SHARDED = "sharded"
    MOE_ALLTOALL = "moe_alltoall"
    PIPELINE = "pipeline"
    INFERENCE = "inference"
    MIXED = "mixed"
    UNKNOWN = "unknown"


class OpFamily(str, enum.Enum):
    ALLREDUCE = "allreduce"
    GATHER_SCATTER = "allgather_reducescatter"
    ALLTOALL = "alltoall"
    SEND_RECV = "send_recv"
    CONTROL = "control"


EXCHANGE = (OpFamily.ALLREDUCE, OpFamily.GATHER_SCATTER, OpFamily.ALLTOALL, OpFamily.SEND_RECV)
CLASS_OF = {OpFamily.ALLREDUCE: JobClass.DATA_PARALLEL, OpFamily.GATHER_SCATTER: JobClass.SHARDED,
            OpFamily.ALLTOALL: JobClass.MOE_ALLTOALL, OpFamily.SEND_RECV: JobClass.PIPELINE}
WHY = {OpFamily.ALLREDUCE: "every rank sums whole gradients: data parallel",
       OpFamily.GATHER_SCATTER: "parameters gathered and gradients scattered per layer: sharded",
       OpFamily.ALLTOALL: "tokens travel to their experts and back: mixture of experts",
       OpFamily.SEND_RECV: "activations and gradients pass stage to stage: pipeline"}

#: op names as gloo (agent/probes/gloo/layout.py) and NCCL spell them, lower-cased
FAMILY_OF_OP = {
    "allreduce": OpFamily.ALLREDUCE,
    "allgather": OpFamily.GATHER_SCATTER, "allgatherv": OpFamily.GATHER_SCATTER,
    "reducescatter": OpFamily.GATHER_SCATTER,
    "alltoall": OpFamily.ALLTOALL, "alltoallv": OpFamily.ALLTOALL,
    "send": OpFamily.SEND_RECV, "recv": OpFamily.SEND_RECV,
    "broadcast": OpFamily.CONTROL, "barrier": OpFamily.CONTROL, "gather": OpFamily.CONTROL,
    "scatter": OpFamily.CONTROL, "reduce": OpFamily.CONTROL,
}
GRADIENT_OPS = frozenset({"allreduce", "reducescatter"})
VARIABLE_SIZE_OPS = frozenset({"alltoallv", "allgatherv"})


@dataclass(frozen=True)
class Observation:
    """One collective (or point-to-point transfer) as one rank executed it."""

    op: str
    bytes: int | None          # message size S; None when not known
    start_ns: int
    end_ns: int
    rank: int | None = None
    peer: int | None = None    # for Send/Recv: the peer's training rank, when known
    #: the peer's rank in the communicator, as the row gave it (fabricscope.commpeers);
    #: None where that is `peer` itself
    comm_peer: int | None = None


@dataclass(frozen=True)
class Share:
    count: int
    bytes: int
    count_share: float
    bytes_share: float


@dataclass(frozen=True)
class LoopStep:
    """One step of a training loop as one rank ran it, from its collectives alone."""

    start_ns: int
    seconds: float                 # to the next step's start
    exchange_seconds: float        # the rank's time inside its exchange ops in it


@dataclass(frozen=True)
class Classification:
    job_class: JobClass
    reason: str
    components: tuple[JobClass, ...]        # exchange families present, most bytes first
    mix: dict[OpFamily, Share]
    p50_bytes: float | None
    p90_bytes: float | None
    period_s: float | None
    collectives_per_step: float | None      # exchange ops per period and rank
    arrival_rate_per_s: float | None        # bursts per second, when aperiodic
    gap_spread: float | None                # IQR / median of the gaps between repeats
    observations: int                       # used
    dropped: dict[str, int] = field(default_factory=dict)
    stages: StageModel | None = None        # where Send/Recv carry bytes: per stage
    alltoall: AlltoallModel | None = None   # where AlltoAll carries bytes: per rank
    requests: RequestModel | None = None    # inference: each request's latency
    from_ns: int = 0                        # start of the window's first observation
    until_ns: int = 0                       # end of the window's last observation
    ranks: int = 0                          # ranks seen in the window
    exchange_share: float | None = None     # ranks' mean share of time inside exchanges
    #: a loop's steps, as the rank whose repeat gave the period ran them
    steps: tuple[LoopStep, ...] = ()

    def to_dict(self) -> dict:
        return {"class": self.job_class.value, "reason": self.reason,
                "components": [c.value for c in self.components],
                "mix": {f.value: vars(s) for f, s in self.mix.items()},
                "p50_bytes": self.p50_bytes, "p90_bytes": self.p90_bytes,
                "period_s": self.period_s, "collectives_per_step": self.collectives_per_step,
                "arrival_rate_per_s": self.arrival_rate_per_s,
                "gap_spread": self.gap_spread,
                "observations": self.observations, "dropped": dict(self.dropped),
                "stages": self.stages.to_dict() if self.stages else None,
                "alltoall": self.alltoall.to_dict() if self.alltoall else None,
                "requests": self.requests.to_dict() if self.requests else None,
                "from_ns": self.from_ns, "until_ns": self.until_ns, "ranks": self.ranks,
                "exchange_share": self.exchange_share}


def observation_from_record(record) -> Observation:
    """A gloo_collective (or nccl collective) Record as an Observation."""
    start = int(record.time_ns)
    rank = record.tags.get("rank")
    return Observation(op=str(record.tags.get("op", "")), bytes=record.fields.get("bytes"),
                       start_ns=start,
                       end_ns=start + int(float(record.fields.get("seconds", 0.0)) * 1e9),
                       rank=int(rank) if rank is not None and str(rank).isdigit() else None,
                       peer=record.fields.get("peer"))


def _usable(obs: list[Observation]) -> tuple[list[tuple[Observation, OpFamily]], dict[str, int]]:
    kept, dropped = [], {}
    for o in obs:
        family = FAMILY_OF_OP.get(str(getattr(o, "op", "")).lower())
        cause = None
        if family is None:
            cause = "unknown_op"
        elif o.bytes is not None and (isinstance(o.bytes, bool) or not isinstance(o.bytes, int)
                                      or o.bytes < 0):
            cause = "bad_bytes"
        elif not isinstance(o.start_ns, int) or not isinstance(o.end_ns, int) \
                or o.end_ns < o.start_ns:
            cause = "bad_window"
        if cause:
            dropped[cause] = dropped.get(cause, 0) + 1
        else:
            kept.append((o, family))
    return kept, dropped


def _mix(kept: list[tuple[Observation, OpFamily]]) -> dict[OpFamily, Share]:
    total_n = len(kept)
    total_b = sum(o.bytes or 0 for o, _ in kept)
    out = {}
    for family in OpFamily:
        mine = [o for o, f in kept if f is family]
        if mine:
            b = sum(o.bytes or 0 for o in mine)
            out[family] = Share(len(mine), b, len(mine) / total_n,
                                b / total_b if total_b else 0.0)
    return out


def _symbols(seq: list[Observation]) -> list[tuple]:
    """What must match for two collectives to be the same call of a loop: the op, and
    its size unless the op is a v-variant (AlltoAllv, AllGatherv), whose sizes follow
    the data (an MoE router's choices), not the loop."""
    return [(o.op.lower(),) if o.op.lower() in VARIABLE_SIZE_OPS else (o.op.lower(), o.bytes)
            for o in seq]


def _rank_repeat(seq: list[Observation]) -> int | None:
    """The shortest L with which the sequence repeats (at least REPEATS_MIN times,
    REPEAT_MATCH of its calls matched), unless a longer L repeats it better beyond
    chance: a step's calls can repeat within it (an FSDP layer's AllGather and
    ReduceScatter, layer after layer), and such a repeat breaks where the step's
    phases meet (the forward pass's gathers end, the backward pass's begin), once a
    step, while the step itself repeats whole. The shortest repeat gives way to the
    shortest L whose share matched exceeds its own by REPEAT_Z standard errors of
    the difference (binomial, pooled): random arrivals (a served job's requests)
    match about as well at any L, by chance a little better at some."""
    codes: dict = {}
    sym = np.array([codes.setdefault(x, len(codes)) for x in _symbols(seq)])
    n = len(sym)
    lags = list(range(1, n // REPEATS_MIN + 1))
    match = [np.count_nonzero(sym[:-lag] == sym[lag:]) / (n - lag) for lag in lags]
    first = next((i for i, m in enumerate(match) if m >= REPEAT_MATCH), None)
    if first is None:
        return None
    for lag, m in zip(lags[first:], match[first:]):
        q = (m + match[first]) / 2
        se = np.sqrt(max(q * (1 - q), 1 / (n - lag)) * 2 / (n - lag))
        if m - match[first] > REPEAT_Z * se:
            return lag
    return lags[first]


def _repeat(exchange: list[Observation]) -> tuple[int, list[Observation]] | None:
    """(L, the rank's sequence) for the rank whose op sequence repeats with the longest
    period L (ties: the busiest rank), else None. Every rank runs the job's loop, but
    a rank's own calls can repeat inside it: a middle pipeline stage alternates
    receive and send every micro-batch, while the first stage sends all its
    micro-batches and then receives their gradients, once per step. The step is the
    loop every rank's sequence repeats with, so the longest of the ranks' repeats
    is it."""
    by_rank: dict = {}
    for o in exchange:
        by_rank.setdefault(o.rank, []).append(o)
    best = None
    for obs in by_rank.values():
        seq = sorted(obs, key=lambda o: o.start_ns)
        lag = _rank_repeat(seq)
        if lag is not None and (best is None or (lag, len(seq)) > (best[0], len(best[1]))):
            best = (lag, seq)
    return best


def _spread(gaps: np.ndarray) -> float:
    """Interquartile range over median of the gaps: exponential gaps (Poisson) give
    ln 3 / ln 2 = 1.58, a clock ~0; a slow first step or one outlier moves it little."""
    q1, med, q3 = np.percentile(gaps, [25, 50, 75])
    return float((q3 - q1) / med) if med > 0 else float("inf")


def _clocked(lag: int, seq: list[Observation]) -> bool:
    """Whether the repeats' gaps are clocked: a loop, not random arrivals. Only the
    repeat itself is tried: the gaps of m repeats together spread less the larger m
    is (a sum of m exponential gaps), so trying multiples would find a clock in any
    random arrivals. A step whose calls repeat within it (a layer's, a bucket's) may
    read either way; _step_multiple then finds the step in the repeats."""
    gaps = np.diff(np.array([o.start_ns for o in seq[::lag]], dtype=float)) / 1e9
    return len(gaps) >= REPEATS_MIN - 1 and gaps.mean() > 0 and \
        _spread(gaps) < SPREAD_PERIODIC


def _step_multiple(lag: int, seq: list[Observation], most: int = 8) -> int:
    """How many repeats of a training loop's op sequence make its step. Where a step's
    calls repeat within it (equal gradient buckets), the repeats' gaps alternate with
    the step: short between its calls, long over its compute. The step is the smallest
    m whose position within the cycle explains at least PHASE_EXPLAINED of the gaps'
    variance (each position seen in at least 4 gaps). Gaps that vary only by jitter
    have no such m: position explains (m-1)/(n-1) of n independent gaps' variance on
    average."""
    gaps = np.diff(np.array([o.start_ns for o in seq[::lag]], dtype=float))
    total = float(((gaps - gaps.mean()) ** 2).sum())
    if not total > 0:
        return 1
    for m in range(2, most + 1):
        if len(gaps) < 4 * m:
            break
        within = sum(float(((gaps[p::m] - gaps[p::m].mean()) ** 2).sum()) for p in range(m))
        if 1 - within / total >= PHASE_EXPLAINED:
            return m
    return 1


def _activity(exchange: list[Observation], bin_s: float):
    """(period_s, onsets per second) of the bytes-in-flight series (trafficmodel)."""
    t0 = min(o.start_ns for o in exchange)
    span = (max(o.end_ns for o in exchange) - t0) / 1e9 + bin_s
    # activity, not bytes, when sizes are unknown: each op counts one byte
    windows = [((o.start_ns - t0) / 1e9, (o.end_ns - t0) / 1e9, float(o.bytes or 1))
               for o in exchange]
    series = trafficmodel.series_from_windows(windows, 0.0, span, bin_s)
    found = trafficmodel.sync_period(series, bin_s) if len(series) >= 8 else None
    acf = trafficmodel.autocorrelation(series)
    below = np.nonzero(acf[1:] < 0)[0]
    lobe = float(below[0] + 1) if len(below) else 1.0       # one burst's own length
    return (found[0] if found else None), len(trafficmodel.burst_onsets(series, lobe)) / span


@dataclass(frozen=True)
class _Timing:
    period_s: float | None
    per_step: float | None
    rate: float | None
    cv: float | None
    repeat: tuple[int, list[Observation]] | None = None     # _repeat's answer


def _backward_pass(exchange: list[Observation]) -> bool:
    """Whether point-to-point transfers flow both ways on every link they use among at
    least three ranks: a pipeline in training sends each activation forward and its
    gradient back over the same link, while a served pipeline's requests go one way
    round (stage to stage, the answer back to the first). Each rank's own rows say it:
    it both sends to and receives from each of its peers. That needs only the rank's
    numbering of its peers, the same in all its rows of one communicator, so a
    sub-group whose peers have no training rank (fabricscope.commpeers) is judged
    too. Two ranks cannot tell the two apart: their one link carries the answer or
    the gradient back alike."""
    ways: dict[tuple[int, int], set[str]] = {}
    for o in exchange:
        peer = o.comm_peer if o.comm_peer is not None else o.peer
        op = o.op.lower()
        if o.rank is None or peer is None or op not in ("send", "recv"):
            continue
        ways.setdefault((o.rank, peer), set()).add(op)
    return len({rank for rank, _ in ways}) >= 3 and all(len(w) == 2 for w in ways.values())


def _timing(exchange: list[Observation], bin_s: float, trains: bool = False) -> _Timing:
    """Period and ops per step of a loop, or the arrival rate of random work.

    The op sequence says what repeats (a training step, a served request: the same
    calls in the same order); the gaps between its repeats say whether a clock
    drives them (a step loop: jitter only) or arrivals at random (Poisson), by their
    spread (_spread; SPREAD_PERIODIC lies halfway). Where the job's backward pass
    shows (`trains`: gradients reduced, or sent back down a pipeline), its repeat is
    a step whatever the spread: only training has one, and a loop of short steps on
    a busy host jitters by as much as its steps last. Random work's rate is that of
    the repeats: a request's when its calls repeat once per request, a multiple
    of it when a request repeats one layer's calls several times (an upper bound).
    With no repeating sequence, the activity series' autocorrelation is asked for a
    period, and the rate is that of its bursts (trafficmodel's onsets)."""
    ranks = max(1, len({o.rank for o in exchange}))
    period, onset_rate = _activity(exchange, bin_s)
    found = _repeat(exchange)
    if found is not None:
        lag, seq = found
        gaps = np.diff(np.array([o.start_ns for o in seq[::lag]], dtype=float)) / 1e9
        if _clocked(*found) or \
                (trains and len(gaps) >= REPEATS_MIN - 1 and gaps.mean() > 0):
            step = lag * _step_multiple(lag, seq)
            gaps = np.diff(np.array([o.start_ns for o in seq[::step]], dtype=float)) / 1e9
            return _Timing(float(gaps.mean()), float(step), None, _spread(gaps), found)
        if len(gaps) and gaps.mean() > 0:
            return _Timing(None, None, float(1 / gaps.mean()), _spread(gaps), found)
        return _Timing(None, None, onset_rate or None, None, found)
    if period is not None:
        span = (max(o.end_ns for o in exchange) - min(o.start_ns for o in exchange)) / 1e9
        return _Timing(period, len(exchange) / ranks / max(span / period, 1.0), None, None)
    return _Timing(None, None, onset_rate or None, None)


def classify(observations, bin_s: float = BIN_S, served: bool = False) -> Classification:
    """The job class of one window of observations, with the numbers that decided it.
    `served`: the job was last classified INFERENCE. A server whose requests come
    faster than it serves them (a load that rose, a fault that slowed each request)
    serves back to back, with no idle gap: its repeats then come at its service's pace,
    as a clock does. Training shows its backward pass, so without one the job is still
    the server, saturated (rule 2 reads "no period" as "or was serving")."""
    kept, dropped = _usable(list(observations))
    mix = _mix(kept)
    exchange = [o for o, f in kept if f in EXCHANGE]
    sizes = [o.bytes for o in exchange if o.bytes is not None]
    p50, p90 = (float(np.percentile(sizes, 50)), float(np.percentile(sizes, 90))) if sizes \
        else (None, None)
    if not exchange:
        return Classification(JobClass.UNKNOWN, "no AllReduce, AllGather/ReduceScatter, "
                              "AlltoAll or Send/Recv in the window", (), mix, p50, p90,
                              None, None, None, None, len(kept), dropped)
    # only training reduces gradients or sends them back down a pipeline
    trains = any(o.op.lower() in GRADIENT_OPS for o in exchange) or _backward_pass(exchange)
    timing = _timing(exchange, bin_s, trains=trains)
    period, per_step, rate, cv = timing.period_s, timing.per_step, timing.rate, timing.cv
    exchanged = sum(mix[f].bytes for f in EXCHANGE if f in mix)
    shares = {f: (mix[f].bytes / exchanged if exchanged else mix[f].count / len(exchange))
              for f in EXCHANGE if f in mix}
    components = tuple(CLASS_OF[f] for f in sorted(shares, key=lambda f: -shares[f]))
    top = max(shares, key=lambda f: shares[f])
    if not trains and period is not None and served:
        saturated, rate, cv = period, 1 / period, None
        period = per_step = None
    else:
        saturated = None
    if not trains and period is None:
        job_class = JobClass.INFERENCE
        reason = (("no backward pass and no period: requests at random, "
                   f"{rate or 0:.1f} arrivals/s" if saturated is None else
                   "no backward pass, served before, its requests now back to back every "
                   f"{saturated * 1e3:.1f} ms: a saturated server")
                  + (f" (gap spread {cv:.2f}; Poisson 1.58, a step loop ~0)" if cv is not None else "")
                  + f", carried by {top.value} ({shares[top]:.0%} of bytes)")
    elif shares[top] > 0.5:
        job_class = CLASS_OF[top]
        reason = f"{top.value} carries {shares[top]:.0%} of the exchanged bytes: {WHY[top]}"
    else:
        job_class = JobClass.MIXED
        reason = "no family carries most bytes: " + ", ".join(
            f"{f.value} {shares[f]:.0%}" for f in sorted(shares, key=lambda f: -shares[f]))
    if period is not None:
        reason += f"; period {period * 1e3:.1f} ms, {per_step:.1f} collectives per step"
        if cv is not None:
            reason += f" (gap spread {cv:.2f})"
    stages = stage_model(exchange) if OpFamily.SEND_RECV in mix else None
    if stages is not None:
        reason += f"; {stages.reason}"
    alltoall = alltoall_model(exchange) if OpFamily.ALLTOALL in mix else None
    if alltoall is not None and alltoall.named:
        reason += f"; {alltoall.reason}"
    requests = request_model(exchange, *timing.repeat) \
        if job_class is JobClass.INFERENCE and timing.repeat is not None else None
    if requests is not None:
        reason += (f"; {len(requests.requests)} requests, latency p50 "
                   f"{requests.p50_s * 1e3:.1f} ms, p99 {requests.p99_s * 1e3:.1f} ms")
    ranks = {o.rank for o in exchange if o.rank is not None}
    steps = _loop_steps(timing.repeat[1], int(per_step)) \
        if period is not None and per_step and timing.repeat is not None else ()
    return Classification(job_class, reason, components, mix, p50, p90, period, per_step,
                          rate, cv, len(kept), dropped, stages, alltoall, requests,
                          min(o.start_ns for o in exchange), max(o.end_ns for o in exchange),
                          len(ranks), _exchange_share(exchange), steps)


def _loop_steps(seq: list[Observation], ops: int) -> tuple[LoopStep, ...]:
    """The rank's sequence cut every `ops` calls (its repeat): each step lasts to the
    next one's start, so the last one, which has no next, is left out. Where a step
    begins within the loop does not matter to either number: a cut anywhere in it
    spans one step's compute and one step's calls. Calls that overlap (two threads)
    count their union."""
    out = []
    for i in range(0, len(seq) - ops, ops):
        chunk = seq[i:i + ops]
        busy, until = 0, chunk[0].start_ns
        for o in sorted(chunk, key=lambda o: o.start_ns):
            busy += max(0, o.end_ns - max(o.start_ns, until))
            until = max(until, o.end_ns)
        out.append(LoopStep(chunk[0].start_ns, (seq[i + ops].start_ns - chunk[0].start_ns) / 1e9,
                            busy / 1e9))
    return tuple(out)


def _exchange_share(exchange: list[Observation]) -> float | None:
    """The ranks' mean share of their span (first call's start to last call's end)
    spent inside exchange ops: the communication share of a step or a request."""
    shares = [min(1.0, s) for s in time_shares(exchange, lambda o: True).values()
              if s is not None]
    return float(np.mean(shares)) if shares else None


def classify_windows(observations, window_s: float, bin_s: float = BIN_S) \
        -> list[tuple[int, Classification]]:
    """classify() over consecutive windows of window_s seconds from the first start:
    (window start ns, classification) for each window that holds an observation. A job
    that changes kind is classified anew in each window."""
    obs = sorted(observations, key=lambda o: o.start_ns if isinstance(o.start_ns, int) else 0)
    if not obs:
        return []
    width = int(window_s * 1e9)
    t0 = obs[0].start_ns if isinstance(obs[0].start_ns, int) else 0
    buckets: dict[int, list[Observation]] = {}
    for o in obs:
        start = o.start_ns if isinstance(o.start_ns, int) else t0
        buckets.setdefault((start - t0) // width, []).append(o)
    return [(t0 + k * width, classify(v, bin_s)) for k, v in sorted(buckets.items())]
