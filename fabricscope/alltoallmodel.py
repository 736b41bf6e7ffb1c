"""Where a mixture-of-experts job's all-to-all bytes go, rank by rank, from its
AlltoAll windows alone.

    model = alltoall_model(observations)      # fabricscope.jobclass.Observation
    model.hot_rank, model.imbalance, model.cost_share, model.reason

An AlltoAll's size S is what the rank receives (gloo's out buffer: the sum of its
receive splits for AlltoAllv; agent/probes/gloo/layout.py): the tokens routed to each
rank's experts, and their gradients on the way back. Every rank takes part in every
exchange, so each rank's mean per exchange is its column of the job's all-to-all
byte matrix, whatever share of the job's exchanges a window holds of each rank (a
window that ends while one rank's records are still on their way holds fewer of
that rank's exchanges, and sums would name another rank hot).

An exchange ends when its most loaded receiver has its bytes, and that rank's
experts then compute the most tokens while the others wait for it in the next
exchange: both scale with the tokens it receives. A split even across the ranks
would receive the mean where the hot rank receives the max, so the time inside the
all-to-alls shrinks by 1 - mean/max:

* imbalance = max / mean of the ranks' bytes received per exchange (1: even routing);
* time share = the ranks' mean share of their span inside AlltoAll;
* cost share = time share x (1 - mean / max): the step time an even routing would
  save. A hot destination is named when it costs SKEW_COST of the step (the
  diagnosis names any fault that costs a tenth of it).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

ALLTOALL_OPS = frozenset({"alltoall", "alltoallv"})
#: the share of the step an uneven routing must cost to be named: the diagnosis names
#: any fault that costs a tenth of the step
SKEW_COST = 0.10
RANKS_MIN = 2           # an exchange has two ranks at least
EXCHANGES_MIN = 4       # per rank: fewer is no evidence of where the bytes go


@dataclass(frozen=True)
class AlltoallModel:
    received: dict[int, float]      # rank -> AlltoAll bytes it received per exchange
    time_share: dict[int, float]    # rank -> share of its span inside AlltoAll
    hot_rank: int                   # receives the most
    hot_share: float                # its share of the bytes received per exchange
    imbalance: float                # max / mean of the ranks' bytes per exchange
    cost_share: float               # of the step: what an even routing would save
    named: bool                     # cost_share reaches SKEW_COST
    reason: str

    def to_dict(self) -> dict:
        return {"received": {str(r): b for r, b in self.received.items()},
                "time_share": {str(r): s for r, s in self.time_share.items()},
                "hot_rank": self.hot_rank, "hot_share": self.hot_share,
                "imbalance": self.imbalance, "cost_share": self.cost_share,
                "named": self.named, "reason": self.reason}


def time_shares(observations, inside) -> dict:
    """rank -> the share of its span (its first call's start to its last call's end)
    spent in its observations for which inside(o) holds; None for a rank whose span is
    empty. The ranks' time inside AlltoAll here, inside any exchange op for
    fabricscope.jobclass."""
    spans: dict = {}
    busy: dict = {}
    for o in observations:
        lo_hi = spans.setdefault(o.rank, [o.start_ns, o.end_ns])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], o.start_ns), max(lo_hi[1], o.end_ns)
        if inside(o):
            busy[o.rank] = busy.get(o.rank, 0) + o.end_ns - o.start_ns
    return {r: busy.get(r, 0) / (hi - lo) if hi > lo else None for r, (lo, hi) in spans.items()}


def _exchanged(o) -> bool:
    return str(o.op).lower() in ALLTOALL_OPS and o.bytes is not None


def step_imbalance(observations, lo_ns: int, hi_ns: int) -> float | None:
    """max / mean of the ranks' AlltoAll bytes received in the calls that start in
    [lo_ns, hi_ns) (one step of the loop: `fabricscope compare` samples it per step);
    None without RANKS_MIN ranks receiving there."""
    received: dict[int, int] = {}
    for o in observations:
        if o.rank is not None and _exchanged(o) and lo_ns <= o.start_ns < hi_ns:
            received[o.rank] = received.get(o.rank, 0) + o.bytes
    total = sum(received.values())
    if len(received) < RANKS_MIN or total <= 0:
        return None
    return max(received.values()) / (total / len(received))


def alltoall_model(observations) -> AlltoallModel | None:
    """The model of a window's observations; None without RANKS_MIN ranks that ran
    EXCHANGES_MIN AlltoAlls of known size each."""
    kept = [o for o in observations if o.rank is not None and o.end_ns >= o.start_ns]
    by_rank: dict[int, list] = {}
    for o in kept:
        if _exchanged(o):
            by_rank.setdefault(o.rank, []).append(o)
    ranks = {r: obs for r, obs in by_rank.items() if len(obs) >= EXCHANGES_MIN}
    if len(ranks) < RANKS_MIN:
        return None
    received = {r: statistics.fmean(o.bytes for o in obs) for r, obs in sorted(ranks.items())}
    shares = time_shares(kept, _exchanged)
    share = {r: shares[r] or 0.0 for r in sorted(ranks)}
    total = sum(received.values())
    if total <= 0:
        return None
    mean = total / len(received)
    hot = max(received, key=lambda r: (received[r], -r))
    imbalance = received[hot] / mean
    time_share = statistics.fmean(share.values())
    cost = time_share * (1 - mean / received[hot])
    named = cost >= SKEW_COST
    head = (f"rank {hot} receives {received[hot] / total:.0%} of the all-to-all bytes "
            f"({imbalance:.1f}x the mean of {len(received)} ranks)")
    tail = (f"; the ranks spend {time_share:.0%} of their time in AlltoAll, and an even "
            f"routing would save {cost:.0%} of it" if named else
            f"; AlltoAll takes {time_share:.0%} of the ranks' time, an even routing would "
            f"save {cost:.0%}")
    return AlltoallModel(received, share, hot, received[hot] / total, imbalance, cost, named,
                         ("hot destination: " if named else "all-to-all: ") + head + tail)
