"""A training step as a period of one process's call sequence, shared by the NCCL
step finder (agent/probes/nccl/steps.py) and gloo's where a step is more than one
gradient sync (agent/probes/gloo/steps.py).

Each training step issues the same sequence of calls: DDP its gradient AllReduce
buckets (and a buffer Broadcast per forward), FSDP an AllGather per layer forward,
an AllGather and a ReduceScatter per layer backward. A call is a token (its op and
size, and whatever else must match); a step is a period of the token sequence.

The search, over the recent calls of a process:
1. p0 = the shortest period of the calls' tail that repeats at least MIN_REPEATS times
   and explains as long a tail as any longer period (a run of equal calls inside a
   step, such as FSDP's forward AllGathers, repeats too but explains less);
2. each multiple Q of p0 that still repeats MIN_REPEATS times is a candidate, cut at
   the position whose preceding pauses are longest; Q is clean when every pause at a
   cut is SEPARATION times the longest pause inside a step (one call per step: when the
   pauses are even). The smallest clean Q wins: equal DDP buckets make p0 = 1, and the
   forward pass between steps makes Q = buckets clean;
3. no clean Q: p0 itself when p0 > 1 (the sequence is distinctive), or p0 = 1 after
   FALLBACK_CALLS calls;
4. before the first step, a repeat preceded by more than a step's worth of its own
   calls is a phase of a longer step, not yet repeated, and so may be a run of equal
   calls (FSDP's forward gathers, evenly paced): one call per step waits for
   FALLBACK_CALLS calls there (find_pattern's `fresh`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

#: boundary pauses against the pauses inside a step for a longer cut to win: a step's
#: forward pass and optimizer separate steps, backward compute separates its calls
SEPARATION = 2.0
MIN_REPEATS = 3          # repetitions of the sequence needed before it is trusted
FALLBACK_CALLS = 64      # one call per step with uneven pauses: accepted after this many
MAX_HISTORY = 4096       # calls kept per process while no sequence is known
MAX_PERIOD = 1024        # calls per step at most (an FSDP step: ~3 per layer)
MAX_MULTIPLE = 256       # multiples of the shortest period tried for a clean cut


class Timed(Protocol):
    """A call as the search sees it: when it started, and what must match."""

    @property
    def ts_ns(self) -> int: ...

    @property
    def token(self) -> Hashable: ...


@dataclass(frozen=True)
class Pattern:
    period: int
    anchor: int              # index (in the calls searched) of a step's first call


def _periodic_tail(tokens: list, period: int) -> int:
    """Length of the longest tail of `tokens` that repeats with this period."""
    n, i = len(tokens), len(tokens) - 1
    while i >= period and tokens[i] == tokens[i - period]:
        i -= 1
    return min(n, n - i - 1 + period)


def _cut(gaps: list[int], start: int, period: int) -> tuple[int, list[int], int]:
    """The position (from `start`, modulo period) whose preceding pauses are longest:
    (its first index, its pauses, the longest pause elsewhere). gaps[i] precedes call i."""
    sums = [sum(gaps[r::period]) for r in range(start, start + period)]
    best = start + max(range(period), key=sums.__getitem__)
    cut = gaps[best::period]
    inner = max((max(gaps[r::period], default=0) for r in range(start, start + period)
                 if r != best), default=None)
    return best, cut, inner


def _clean(cut: list[int], inner: int | None) -> bool:
    if not cut:
        return False
    if inner is None:        # one call per step: the pauses must be even
        return max(cut) < SEPARATION * max(min(cut), 1)
    return min(cut) >= SEPARATION * max(inner, 1)


def _shortest_period(tokens: list) -> tuple[int, int] | None:
    """(p0, its tail's length): the shortest period that repeats MIN_REPEATS times and
    explains as long a tail as any longer one does (a run of equal calls inside a
    step, e.g. FSDP's forward AllGathers, repeats too but explains less), or None."""
    n = len(tokens)
    covers: dict[int, int] = {}
    for p in range(1, min(MAX_PERIOD, n // 2) + 1):
        covers[p] = c = _periodic_tail(tokens, p)
        if c >= MIN_REPEATS * p and c >= n - p:
            break           # nothing longer can explain more than it does
    best = max(covers.values(), default=0)
    return next(((p, c) for p, c in covers.items()
                 if c >= MIN_REPEATS * p and c >= best - p), None)


def find_pattern(calls: Sequence[Timed], fresh: bool = False) -> Pattern | None:
    """The step sequence of these calls, in start order (see the module doc), or None
    when undecided.

    fresh: the calls begin with the process's first. A phase inside a longer step
    repeats too (an FSDP backward pass, layer after layer), and before the step has
    repeated MIN_REPEATS times nothing else does; but the rest of that step came
    first, made of the phase's own calls (the forward pass's gathers). So while more
    than one step's worth of the repeat's own calls precede it, it is undecided: a
    process's first step may begin mid-window, and its set-up calls (a parameter
    broadcast, a shape check) are other calls. After a change the calls before are
    the old layout's, and this does not apply."""
    tokens = [c.token for c in calls]
    n = len(tokens)
    found = _shortest_period(tokens)
    if found is None:
        return None
    p0, tail = found
    first = n - tail         # the periodic tail's first call
    gaps = [0] + [calls[i].ts_ns - calls[i - 1].ts_ns for i in range(1, n)]
    chosen = None
    for q in range(p0, min(MAX_PERIOD, tail // MIN_REPEATS, MAX_MULTIPLE * p0) + 1, p0):
        best, cut, inner = _cut(gaps, first + 1, q)
        if _clean(cut, inner):
            chosen = q, best
            break
    if chosen is None:
        if p0 == 1 and n < FALLBACK_CALLS:
            return None
        chosen = p0, _cut(gaps, first + 1, p0)[0]
    q, best = chosen
    if fresh and q == 1 and n < FALLBACK_CALLS:
        return None         # a run of equal calls: also a longer step's phase (rule 4)
    own = set(tokens[first:first + q])
    if fresh and sum(t in own for t in tokens[:first]) > q:
        return None
    return Pattern(q, first + (best - first) % q)   # the tail's first call at that cut
