"""Where a pipeline's time goes, stage by stage, from its Send and Recv windows alone.

    model = stage_model(observations)      # fabricscope.jobclass.Observation
    model.slow_stage, model.bubble_share, model.reason

A pipeline stage's time splits three ways: its own layers (compute), waiting in a
blocking Recv for a neighbour's activations or gradients, and in a blocking Send
until the neighbour posts its Recv (gloo's TCP transport moves an unbound buffer
only once the receiver has asked for it), each plus the transfer itself. The stages
run in lockstep, so the slowest one paces them all and every other stage spends the
difference inside transfers. Hence:

* compute of a stage = its span less its time in Recv and Send;
* bubble share = the stages' mean time inside transfers over their span: what
  balanced stages, more micro-batches or a faster link would win back;
* a **slow stage** computes the most: named when its compute exceeds the stages'
  mean by SLOW_STAGE_COST of its span, the step time a balanced split would save
  (the diagnosis names any fault that costs a tenth of the step).

A slow link between two stages leaves the stages' compute equal and lengthens the
transfers instead: the model then says the stages are balanced with a large bubble,
and the link itself is the network detectors' to place (diagnosis/detect_network.py,
from the TCP evidence of the hop). A stage is a rank, whatever the rank order.
Only blocking transfers tell waits apart: an irecv posted early and waited late
counts its overlap as transfer time.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

P2P_OPS = frozenset({"send", "recv"})
#: the share of a stage's span that an imbalance must cost to be named: the
#: diagnosis names any fault that costs a tenth of the step
SLOW_STAGE_COST = 0.10
STAGES_MIN = 2          # a pipeline has two stages at least
TRANSFERS_MIN = 4       # per stage: fewer is no evidence of where its time goes


@dataclass(frozen=True)
class Stage:
    rank: int
    span_s: float        # the span every stage runs (the same for all; see _stages)
    recv_s: float        # inside Recv: waiting for a neighbour, then the transfer
    send_s: float        # inside Send
    transfers: int       # inside that span
    peers: tuple[int, ...]

    @property
    def compute_s(self) -> float:
        return max(0.0, self.span_s - self.recv_s - self.send_s)

    @property
    def wait_share(self) -> float:
        """Share of the span inside transfers (Recv and Send)."""
        return (self.recv_s + self.send_s) / self.span_s if self.span_s > 0 else 0.0


@dataclass(frozen=True)
class StageModel:
    stages: tuple[Stage, ...]            # by rank
    bubble_share: float                  # mean share of the stages' span in transfers
    slow_stage: int | None               # its rank, when named
    cost_share: float                    # of the slow stage's span; 0: none named
    reason: str

    def to_dict(self) -> dict:
        return {"bubble_share": self.bubble_share, "slow_stage": self.slow_stage,
                "cost_share": self.cost_share, "reason": self.reason,
                "stages": [{"rank": s.rank, "compute_s": s.compute_s, "recv_s": s.recv_s,
                            "send_s": s.send_s, "span_s": s.span_s,
                            "wait_share": s.wait_share} for s in self.stages]}


def _stages(observations) -> list[Stage]:
    """Each rank's time in Recv and Send over the span every stage runs: from the
    latest first transfer's end to the earliest last transfer's end. A stage's first
    transfer waits for its neighbours to start (seconds, against milliseconds of a
    step), and the first and last stages run before and after the others: outside
    the common span none of that is the pipeline's steady state."""
    by_rank: dict[int, list] = {}
    for o in observations:
        if str(o.op).lower() in P2P_OPS and o.rank is not None and o.end_ns >= o.start_ns:
            by_rank.setdefault(o.rank, []).append(o)
    if not by_rank:
        return []
    lo = max(min(o.end_ns for o in obs) for obs in by_rank.values())
    hi = min(max(o.end_ns for o in obs) for obs in by_rank.values())
    if hi <= lo:
        return []

    def inside(obs, op: str) -> float:
        return sum(max(0, min(o.end_ns, hi) - max(o.start_ns, lo))
                   for o in obs if o.op.lower() == op) / 1e9

    out = []
    for rank, obs in sorted(by_rank.items()):
        count = sum(1 for o in obs if o.end_ns > lo and o.start_ns < hi)
        peers = tuple(sorted({o.peer for o in obs if o.peer is not None}))
        out.append(Stage(rank, (hi - lo) / 1e9, inside(obs, "recv"), inside(obs, "send"),
                         count, peers))
    return out


def step_bubble(observations, lo_ns: int, hi_ns: int) -> float | None:
    """The ranks' mean share of [lo_ns, hi_ns) (one step of the loop: `fabricscope
    compare` samples it per step) inside Send and Recv: the step's bubble; None
    without STAGES_MIN ranks transferring in it."""
    if hi_ns <= lo_ns:
        return None
    busy: dict[int, int] = {}
    for o in observations:
        if str(o.op).lower() in P2P_OPS and o.rank is not None:
            inside = min(o.end_ns, hi_ns) - max(o.start_ns, lo_ns)
            if inside > 0:
                busy[o.rank] = busy.get(o.rank, 0) + inside
    if len(busy) < STAGES_MIN:
        return None
    return statistics.fmean(min(1.0, b / (hi_ns - lo_ns)) for b in busy.values())


def stage_model(observations) -> StageModel | None:
    """The model of a window's Send/Recv observations; None without STAGES_MIN stages
    of TRANSFERS_MIN transfers each."""
    stages = [s for s in _stages(observations) if s.transfers >= TRANSFERS_MIN and s.span_s > 0]
    if len(stages) < STAGES_MIN:
        return None
    bubble = statistics.fmean(s.wait_share for s in stages)
    mean_compute = statistics.fmean(s.compute_s for s in stages)
    slow = max(stages, key=lambda s: s.compute_s)
    excess = (slow.compute_s - mean_compute) / slow.span_s
    shares = ", ".join(f"rank {s.rank} {s.wait_share:.0%}" for s in stages)
    base = f"bubble {bubble:.0%} (time in transfers: {shares})"
    if excess >= SLOW_STAGE_COST:
        others = statistics.median(s.compute_s for s in stages if s is not slow)
        ratio = f"{slow.compute_s / others:.1f}x the median of the others" if others > 0 \
            else "while the others wait"
        return StageModel(tuple(stages), bubble, slow.rank, excess,
                          f"slow stage rank {slow.rank}: computes {ratio}; a balanced split "
                          f"saves {excess:.0%} of its time; {base}")
    return StageModel(tuple(stages), bubble, None, 0.0, f"stages balanced; {base}")
