"""Before and after a change: did it help? (`fabricscope compare`)

Per metric, the samples of two windows: per step (step time, grad sync, data
load, bus bandwidth; the job's reference rank, its lowest; steps from gloo_step,
else nccl_step, which has the step time only), per step of the loop its
collectives repeat where neither cuts any (a job that reduces no gradients, MoE
or pipeline: fabricscope.jobclass.LoopStep, its step time and the time inside its
exchanges, from the newest ROWS_PER_SERIES rows of each rank and op,
diagnosis/jobclass.py), per request of a served model (its latency,
fabricscope.requestmodel: a job with no steps is judged by it), per step of that
loop from all ranks' collectives in it (a MoE job's all-to-all imbalance: max / mean
of the ranks' AlltoAll bytes received, fabricscope.alltoallmodel.step_imbalance; a
pipeline's bubble: the ranks' mean share of the step in Send and Recv,
fabricscope.stagemodel.step_bubble) or per second
(the job's nodes' retransmit ratio, bursts, peak 100 us utilisation, the RTT tail
of its data flows). Per-step samples are autocorrelated
and not normal, so:
- the test is Mann-Whitney U (two-sided), a rank test that assumes no
  distribution, over batch means: each window is cut into blocks of n^(1/3)
  consecutive samples and the test ranks the blocks' means. Consecutive steps are
  correlated where something is wrong (a slow stretch lasts several steps: lag-1
  autocorrelation 0.3-0.8 in the lab's faulted windows), and taking them as
  independent samples makes the p-value too small. Block means are close to
  independent. With few blocks the p-value is
  exact (the U distribution counted), otherwise the normal approximation with the
  tie correction. Step time is the question a change answers (did the job get
  faster?), so it is tested alone at ALPHA; the other metrics explain it, and their
  p-values are Holm-corrected together (the family of those with a p-value), so
  that one of them changing by chance in a healthy run stays rare. Correcting step
  time with them would make the one question that matters pay for those it does not
  ask. A served model has no steps: its request latency is the question then, tested
  alone the same way (PRIMARY: the first of them with enough samples).
  ALPHA is 0.01, not 0.05: compare is asked after every tuning change, and a change
  that did nothing reported as `better` keeps a useless knob and stops the search for
  the real cause. The lab's healthy steps, resampled and compared with themselves,
  came out changed in 2-4 % of runs at 0.05 (`python -m fabricscope.bench.compare_calibration`);
- the 95 % interval of the change of the median is a moving-block bootstrap
  (blocks of n^(1/3) consecutive samples keep the autocorrelation);
- step time drifts inside a healthy run (checkpoints, caches, neighbours), so
  each window's drift (its Theil-Sen trend carried over half its length, with its
  sign: how far its level moves by itself) is shown, and a change counts only when
  it exceeds 1.5 x what a steady drift seen in both windows, running its way, makes
  two adjacent windows differ by: a verdict never rests on a p-value alone.
Verdicts: better, worse, no change, or insufficient (too few blocks for any p under
ALPHA: 5 a side at least, so about 10 steps; fewer can never show a change, and
saying `no change` would pass "cannot tell" off as an answer).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from functools import lru_cache

import numpy as np

from fabricscope.diagnosis.jobclass import read_window
from fabricscope.diagnosis.store import Store, quote, regex_of
from fabricscope.diagnosis.timespan import Span
from fabricscope.alltoallmodel import step_imbalance
from fabricscope.jobclass import classify
from fabricscope.stagemodel import step_bubble

DRIFT_MARGIN = 1.5
ALPHA = 0.01
BOOTSTRAP = 2000
#: up to this many values in all and without ties, Mann-Whitney's p is exact
EXACT_MAX = 40
#: how a verdict is reached, for the people who read one (CLI, report)
VERDICT_RULE = (f"A change counts when its Mann-Whitney p over block means of n^(1/3) "
                f"consecutive samples is < {ALPHA} (step time alone; the other "
                "metrics Holm-corrected together), its bootstrap interval excludes 0 and it "
                "exceeds 1.5 x twice the smaller of the two windows' drifts in its direction "
                "(each window's own trend over half its length, signed).")


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    lower_is_better: bool


#: the primary metric (PRIMARY) is tested alone; the others form one Holm family
METRICS = [Metric("step_time", "s", True), Metric("grad_sync_time", "s", True),
           Metric("data_load_time", "s", True), Metric("busbw", "GB/s", False),
           Metric("retransmit_ratio", "fraction", True), Metric("bursts", "/s", True),
           Metric("peak_utilization", "fraction", True), Metric("rtt_p99", "us", True),
           Metric("request_latency", "s", True), Metric("exchange_time", "s", True),
           Metric("alltoall_imbalance", "x", True), Metric("bubble_share", "fraction", True)]
#: the questions a change answers, in order: the first with enough samples is tested
#: alone, the others join the explaining family
PRIMARY = ("step_time", "request_latency")


@dataclass
class Result:
    metric: str
    unit: str
    n_before: int
    n_after: int
    before_median: float | None
    after_median: float | None
    change_pct: float | None
    ci95: list | None
    p_value: float | None
    p_holm: float | None
    drift_before: float | None
    drift_after: float | None
    verdict: str

    def to_json(self) -> dict:
        return asdict(self)


# -- statistics ----------------------------------------------------------------------------

def block_length(n: int) -> int:
    """Consecutive samples per block: n^(1/3), the length that grows with the window
    slowly enough to leave many blocks and fast enough to outlast the correlation."""
    return max(1, round(n ** (1 / 3)))


def block_means(x: list[float]) -> list[float]:
    """The means of consecutive blocks of block_length(len(x)) samples; the last block
    takes the remainder, so no sample is left out."""
    k = block_length(len(x))
    starts = list(range(0, len(x) - k + 1, k)) or [0]
    ends = starts[1:] + [len(x)]
    return [float(np.mean(x[s:e])) for s, e in zip(starts, ends)]


def mann_whitney(a: list[float], b: list[float]) -> float:
    """Two-sided p-value of Mann-Whitney U: exact where there are no ties and at most
    EXACT_MAX values, else the normal approximation, tie-corrected and with the
    continuity correction."""
    n1, n2 = len(a), len(b)
    values = np.concatenate([np.asarray(a, float), np.asarray(b, float)])
    order = values.argsort(kind="mergesort")
    ranks = np.empty(len(values))
    sorted_vals = values[order]
    i = 0
    ties = 0.0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t ** 3 - t
        i = j + 1
    u1 = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    n = n1 + n2
    if not ties and n <= EXACT_MAX:
        return _exact_p(round(u1), n1, n2)
    mu = n1 * n2 / 2
    sigma2 = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if sigma2 <= 0:
        return 1.0
    z = (abs(u1 - mu) - 0.5) / math.sqrt(sigma2)          # continuity correction
    return float(min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2))))


def attainable(n1: int, n2: int) -> bool:
    """Whether n1 and n2 samples make enough blocks for some p under ALPHA: the least
    p of the exact test, every block of one window below every block of the other, is
    2 / C(b1 + b2, b1)."""
    b1, b2 = (len(block_means([0.0] * n)) if n else 0 for n in (n1, n2))
    return b1 > 0 and b2 > 0 and 2 / math.comb(b1 + b2, b1) < ALPHA


@lru_cache(maxsize=None)
def _u_counts(n1: int, n2: int) -> tuple[int, ...]:
    """How many of the C(n1+n2, n1) orderings of two samples give each U (0..n1*n2):
    the largest value belongs to the first sample (adding n2 to U) or the second."""
    if n1 == 0 or n2 == 0:
        return (1,)
    first, second = _u_counts(n1 - 1, n2), _u_counts(n1, n2 - 1)
    counts = [0] * (n1 * n2 + 1)
    for u, c in enumerate(first):
        counts[u + n2] += c
    for u, c in enumerate(second):
        counts[u] += c
    return tuple(counts)


def _exact_p(u: int, n1: int, n2: int) -> float:
    counts = _u_counts(n1, n2)
    total = sum(counts)
    tail = min(sum(counts[:u + 1]), sum(counts[u:]))
    return min(1.0, 2 * tail / total)


def block_bootstrap_ci(a: list[float], b: list[float], rng: np.random.Generator
                       ) -> tuple[float, float]:
    """95 % interval of median(b) - median(a), moving-block bootstrap of each."""
    def resample(x: np.ndarray) -> np.ndarray:
        n = len(x)
        block = block_length(n)
        starts = rng.integers(0, n - block + 1, size=(BOOTSTRAP, -(-n // block)))
        idx = (starts[:, :, None] + np.arange(block)).reshape(BOOTSTRAP, -1)[:, :n]
        return np.median(x[idx], axis=1)
    x, y = np.asarray(a, float), np.asarray(b, float)
    diff = resample(y) - resample(x)
    return float(np.percentile(diff, 2.5)), float(np.percentile(diff, 97.5))


def drift(x: list[float]) -> float:
    """How far the window's own trend carries its level to its edge, with its sign: the
    Theil-Sen slope (the median of the pairwise slopes, robust to outliers such as
    checkpoint steps) x half the window's length. A steady drift shows here; noise
    without a trend does not."""
    n = len(x)
    if n < 4:
        return 0.0
    idx = range(n) if n <= 400 else range(0, n, n // 400 + 1)
    slopes = [(x[j] - x[i]) / (j - i) for i in idx for j in idx if j > i]
    return statistics.median(slopes) * n / 2


def drift_allowance(delta: float, drift_before: float, drift_after: float) -> float:
    """How much of a difference of medians the run's own drift could make. A steady
    drift carries both windows the same way, and two adjacent windows of it differ by
    about their two drifts together; a change must exceed that by half again
    (DRIFT_MARGIN). So the allowance is twice the smaller of the two drifts that run
    in the direction of the difference: a trend only one window shows is that
    window's own (a fault that worsens or wears off until it is cleared, a warm-up),
    not a drift that carries across the boundary, and it cannot explain why the other
    window differs."""
    direction = 1.0 if delta >= 0 else -1.0
    steady = min(max(0.0, d * direction) for d in (drift_before, drift_after))
    return DRIFT_MARGIN * 2 * steady


def holm(pvalues: list[float | None]) -> list[float | None]:
    idx = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    out: list[float | None] = [None] * len(pvalues)
    m, running = len(idx), 0.0
    for k, (p, i) in enumerate(idx):
        running = max(running, min(1.0, (m - k) * p))
        out[i] = running
    return out


def compare_samples(samples: dict[str, tuple[list[float], list[float]]],
                    seed: int = 0) -> list[Result]:
    rng = np.random.default_rng(seed)
    rows = []
    for m in METRICS:
        a, b = samples.get(m.name, ([], []))
        if not attainable(len(a), len(b)):
            rows.append(Result(m.name, m.unit, len(a), len(b),
                               statistics.median(a) if a else None,
                               statistics.median(b) if b else None, None, None, None, None,
                               None, None, "insufficient"))
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        lo, hi = block_bootstrap_ci(a, b, rng)
        rows.append(Result(m.name, m.unit, len(a), len(b), ma, mb,
                           (mb - ma) / ma * 100 if ma else None, [lo, hi],
                           mann_whitney(block_means(a), block_means(b)),
                           None, drift(a), drift(b), ""))
    first = next((i for name in PRIMARY for i, r in enumerate(rows)
                  if r.metric == name and r.p_value is not None), 0)
    rows[first].p_holm = rows[first].p_value
    family = [r for i, r in enumerate(rows) if i != first]
    for r, p in zip(family, holm([r.p_value for r in family])):
        r.p_holm = p
    for m, r in zip(METRICS, rows):
        if r.verdict:
            continue
        delta = r.after_median - r.before_median
        allowance = drift_allowance(delta, r.drift_before, r.drift_after)
        significant = r.p_holm is not None and r.p_holm < ALPHA and abs(delta) > allowance \
            and not (r.ci95[0] <= 0 <= r.ci95[1])
        if not significant:
            r.verdict = "no change"
        else:
            r.verdict = "better" if (delta < 0) == m.lower_is_better else "worse"
    return rows


# -- samples from the store --------------------------------------------------------------

def samples(store: Store, job: str, before: Span, after: Span) -> dict:
    windows = (JobWindow(store, job, before), JobWindow(store, job, after))
    return {name: tuple(values(store, job, name, w.span, w) for w in windows)
            for name in (m.name for m in METRICS)}


class JobWindow:
    """The job's records of one span that several metrics share, each read once: its
    collectives, classified as the collector's analyzer does (diagnosis/jobclass.py),
    and its nodes."""

    def __init__(self, store: Store, job: str, span: Span):
        self.store, self.job, self.span = store, job, span
        self._observations = self._classification = self._nodes = None
        self._stepped: tuple[str, str] | None | bool = False    # False: not asked yet

    def observations(self) -> list:
        if self._observations is None:
            read = read_window(self.store, self.job, self.span.start_ns, self.span.end_ns)
            self._observations = read.observations
        return self._observations

    def classification(self):
        if self._classification is None:
            self._classification = classify(self.observations())
        return self._classification

    def stepped(self) -> tuple[str, str] | None:
        """_stepped's answer for the span."""
        if self._stepped is False:
            self._stepped = _stepped(self.store, self.job, self.span)
        return self._stepped

    def nodes(self) -> list[str]:
        if self._nodes is None:
            self._nodes = _nodes(self.store, self.job, self.span)
        return self._nodes


#: where a job's steps are cut, in order: gloo's gradient AllReduce windows, then the
#: repeating pattern of its NCCL calls (agent/probes/nccl/steps.py)
STEP_SOURCES = ("gloo_step", "nccl_step")


def _reference_rank(store: Store, job: str, span: Span,
                    source: str = "gloo_step") -> str | None:
    rows = store.query(f"SELECT count(seconds) FROM {source} WHERE job = {quote(job)} AND "
                       f"time >= {span.start_ns} AND time < {span.end_ns} GROUP BY rank")
    ranks = [r["_tags"].get("rank") for r in rows if r.get("count")]
    ranks = [r for r in ranks if r]
    return min(ranks, key=lambda r: (len(r), r)) if ranks else None


def _stepped(store: Store, job: str, span: Span) -> tuple[str, str] | None:
    """(step measurement, reference rank) of the first source that cut the job's steps
    in the span, None when none did."""
    for source in STEP_SOURCES:
        rank = _reference_rank(store, job, span, source)
        if rank is not None:
            return source, rank
    return None


#: measurements whose rows name a job's nodes, each with a field every row has
NODE_SOURCES = (("gloo_step", "seconds"), ("nccl_step", "seconds"),
                ("gloo_collective", "seconds"), ("ncclprof_collective", "enqueue_seconds"))


def _nodes(store: Store, job: str, span: Span) -> list[str]:
    nodes = set()
    for measurement, always in NODE_SOURCES:
        rows = store.query(f'SELECT count("{always}") FROM {measurement} WHERE '
                           f"job = {quote(job)} AND time >= {span.start_ns} AND "
                           f"time < {span.end_ns} GROUP BY node")
        nodes |= {r["_tags"].get("node") for r in rows if r["_tags"].get("node")}
    return sorted(nodes)


def load_spans(rows: list[dict]) -> list[float]:
    """Per step, its reads' span from the first one's start to the last one's end (a
    slow store's read comes in pieces; see diagnosis/snapshot.phase_seconds)."""
    spans: dict = {}
    for r in rows:
        start = r["time"] / 1e9
        end = start + float(r.get("seconds") or 0.0)
        key = (r.get("step"), r.get("peer"))
        lo, hi = spans.get(key, (start, end))
        spans[key] = (min(lo, start), max(hi, end))
    return [hi - lo for _, (lo, hi) in sorted(spans.items(), key=lambda kv: kv[1][0])]


def request_latencies(store: Store, job: str, span: Span,
                      window: JobWindow | None = None) -> list[float]:
    """Each request's latency in the span, in arrival order: the job's collectives
    classified as the collector's analyzer does (diagnosis/jobclass.py); [] unless
    they are a served model's (a training job's samples are its steps)."""
    c = (window or JobWindow(store, job, span)).classification()
    return [r.seconds for r in c.requests.requests] if c.requests is not None else []


def loop_steps(store: Store, job: str, span: Span,
               window: JobWindow | None = None) -> list:
    """A training loop's steps in the span from its collectives alone
    (fabricscope.jobclass.LoopStep): for a job whose steps no step source cuts (one
    that reduces no gradients, MoE or pipeline, on gloo; NCCL's where only the
    profiler plugin's collectives are read)."""
    return list((window or JobWindow(store, job, span)).classification().steps)


#: per step of the loop, from all ranks' collectives in it: what a MoE job's routing
#: and a pipeline's stage split change
STEP_MEASURES = {"alltoall_imbalance": step_imbalance, "bubble_share": step_bubble}


def per_loop_step(store: Store, job: str, span: Span, measure,
                  window: JobWindow | None = None) -> list[float]:
    """measure(observations, lo_ns, hi_ns) over each step of the loop the job's
    collectives repeat (loop_steps), for the steps where it has a value."""
    window = window or JobWindow(store, job, span)
    out = []
    for step in loop_steps(store, job, span, window):
        value = measure(window.observations(), step.start_ns,
                        step.start_ns + int(step.seconds * 1e9))
        if value is not None:
            out.append(value)
    return out


def values(store: Store, job: str, metric: str, span: Span,
           window: JobWindow | None = None) -> list[float]:
    t = f"time >= {span.start_ns} AND time < {span.end_ns}"
    q = quote(job)
    window = window or JobWindow(store, job, span)
    if metric == "request_latency":
        return request_latencies(store, job, span, window)
    if metric in STEP_MEASURES:
        return per_loop_step(store, job, span, STEP_MEASURES[metric], window)
    if metric in ("step_time", "grad_sync_time", "busbw", "data_load_time", "exchange_time"):
        stepped = window.stepped()
        if stepped is None:          # the loop its collectives repeat, if any
            steps = loop_steps(store, job, span, window)
            if metric == "step_time":
                return [s.seconds for s in steps]
            if metric == "exchange_time":
                return [s.exchange_seconds for s in steps]
            return []
        source, rank = stepped
        if metric == "exchange_time" or (source != "gloo_step" and metric != "step_time"):
            return []                # grad_sync_time answers, or the source has no such field
        if metric == "data_load_time":
            rows = store.query(f"SELECT seconds, step, peer FROM gloo_phase WHERE job = {q} "
                               f"AND rank = {quote(rank)} AND phase = 'data_load' AND {t}")
            return load_spans(rows)
        field = {"step_time": "seconds", "grad_sync_time": "sync_seconds",
                 "busbw": "busbw_gbs"}[metric]
        rows = store.query(f"SELECT {field} FROM {source} WHERE job = {q} AND "
                           f"rank = {quote(rank)} AND {t}")
        return [float(r[field]) for r in rows if r.get(field) is not None]
    nodes = window.nodes()
    if not nodes:
        return []
    where = f"node =~ {regex_of(nodes)} AND {t}"
    if metric == "retransmit_ratio":
        rows = store.query(f"SELECT sum(retrans_segs) AS r, sum(segs_out) AS s FROM tcp_node "
                           f"WHERE {where} GROUP BY time(1s) fill(none)")
        return [r["r"] / r["s"] for r in rows if r.get("s")]
    if metric in ("bursts", "peak_utilization"):
        agg = "sum(bursts)" if metric == "bursts" else "max(peak_util)"
        rows = store.query(f"SELECT {agg} AS v FROM nic_window WHERE {where} "
                           "GROUP BY time(1s) fill(none)")
        return [float(r["v"]) for r in rows if r.get("v") is not None]
    rows = store.query(f"SELECT max(rtt_p99_us) AS v FROM tcp_flow WHERE job = {q} AND "
                       f"bytes_acked >= 1000000 AND {t} GROUP BY time(1s) fill(none)")
    return [float(r["v"]) for r in rows if r.get("v") is not None]
