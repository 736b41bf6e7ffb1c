"""What each request of a served model costs, from its collectives alone.

    model = request_model(exchange_observations, lag, reference_sequence)
    model.p50_s, model.p99_s, model.requests[i].lags

A server runs the same calls for every request (a MoE layer's count exchange and
all-to-alls, a pipeline's sends and receives), so one rank's op sequence repeats
once per request (fabricscope.jobclass finds that repeat, `lag` ops long). Inside
a request the calls follow each other after a little compute; between two
requests the ranks wait for the next arrival. The boundary in the repeat is where
the gap after a call is longest (the median over the repeats, position by
position); every rank's calls between two boundaries (the midpoints of those idle
gaps) belong to one request, and:

* its latency is from its first call's start to its last call's end, over all
  ranks: the time the request spends in the exchanges and the compute between
  them (the queueing before its first call and the compute after its last are not
  seen);
* each rank's lag is how far its first call trailed the request's first call: the
  rank that the others wait for arrives last.

The cut requests at the window's two ends are left out.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

REQUESTS_MIN = 3        # fewer is no distribution


@dataclass(frozen=True)
class Request:
    start_ns: int
    end_ns: int
    lags: dict[int, float]          # rank -> s its first call trailed the request's first

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass(frozen=True)
class RequestModel:
    requests: tuple[Request, ...]
    p50_s: float
    p99_s: float

    def to_dict(self) -> dict:
        return {"requests": len(self.requests), "p50_s": self.p50_s, "p99_s": self.p99_s}


def _boundary(seq, lag: int) -> int:
    """The position in the repeat after which the idle gap before the next request
    lies: the one with the longest median gap after it."""
    gaps: dict[int, list[int]] = {}
    for i in range(len(seq) - 1):
        gaps.setdefault(i % lag, []).append(seq[i + 1].start_ns - seq[i].end_ns)
    return max(gaps, key=lambda j: (statistics.median(gaps[j]), -j))


def request_model(exchange, lag: int, seq) -> RequestModel | None:
    """The requests of a window: `exchange`, every rank's exchange observations; `seq`,
    the reference rank's, sorted, repeating every `lag` calls. None with fewer than
    REQUESTS_MIN whole requests."""
    if lag < 1 or len(seq) < 2:
        return None
    j = _boundary(seq, lag)
    cuts = [(seq[i].end_ns + seq[i + 1].start_ns) // 2
            for i in range(len(seq) - 1) if i % lag == j]
    if len(cuts) < REQUESTS_MIN + 1:
        return None
    edges = np.array(cuts, dtype=np.int64)
    members: dict[int, list] = {}
    for o in exchange:
        k = int(np.searchsorted(edges, o.start_ns, side="right")) - 1
        if 0 <= k < len(cuts) - 1:          # between two cuts: a whole request
            members.setdefault(k, []).append(o)
    requests = []
    for k in sorted(members):
        obs = members[k]
        start = min(o.start_ns for o in obs)
        first: dict[int, int] = {}
        for o in obs:
            if o.rank is not None:
                first[o.rank] = min(first.get(o.rank, o.start_ns), o.start_ns)
        requests.append(Request(start, max(o.end_ns for o in obs),
                                {r: (t - start) / 1e9 for r, t in sorted(first.items())}))
    if len(requests) < REQUESTS_MIN:
        return None
    seconds = [r.seconds for r in requests]
    return RequestModel(tuple(requests), float(np.percentile(seconds, 50)),
                        float(np.percentile(seconds, 99)))
