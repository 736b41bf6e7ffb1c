"""Before/after statistics (diagnosis/compare.py): the tests against reference values, the
bootstrap interval, the drift, and the verdicts on whole comparisons."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from fabricscope.diagnosis.compare import (ALPHA, METRICS, attainable, block_bootstrap_ci, block_length,
                               block_means, compare_samples, drift, holm, mann_whitney)

#: (a, b, two-sided p) of scipy.stats.mannwhitneyu(a, b, method=...), scipy 1.17.1,
#: computed once in a scratch script: "exact" where there are no ties and at most
#: EXACT_MAX values, else "asymptotic" with use_continuity=True
MANN_WHITNEY = {
    "exact": ([1.1, 2.3, 3.0, 4.8, 5.2, 6.9, 7.4],
              [4.0, 5.5, 6.1, 8.2, 9.9, 10.4, 11.0, 12.5], 0.020512820512820513),
    "exact, separated": ([0.50, 0.52, 0.49, 0.51, 0.53, 0.48],
                         [0.61, 0.63, 0.60, 0.62, 0.64, 0.66], 0.0021645021645021645),
    "exact, 40 values": (
        [0.8792, 0.9996, 1.0656, 0.8712, 1.0395, 1.043, 1.0696, 0.8816, 0.9338, 0.9564, 0.883,
         1.1739, 0.9504, 1.0329, 0.9741, 1.1583, 1.132, 1.0633, 0.7796, 1.0052],
        [1.1684, 1.2004, 1.0382, 1.2822, 0.968, 1.0338, 1.1935, 1.1049, 1.3002, 1.1189, 1.0367,
         1.0622, 0.9909, 0.9722, 1.163, 1.1581, 1.2295, 1.0245, 1.2689, 1.0713],
        0.001766783843487427),
    "ties": ([1, 2, 2, 3, 3, 3, 4, 5], [3, 3, 4, 4, 5, 5, 6, 7, 7], 0.01630200829707017),
    "no ties, 51 values": (
        [1.0126, 0.9868, 1.064, 1.0105, 0.9464, 1.0362, 1.1304, 1.0947, 0.9296, 0.8735, 0.9377,
         1.0041, 0.7675, 0.9781, 0.8754, 0.9268, 0.9456, 0.9684, 1.0412, 1.1043, 0.9871, 1.1366,
         0.9335, 1.0352, 1.0903],
        [1.0894, 1.0057, 0.9878, 1.0342, 1.102, 0.979, 1.0591, 1.0641, 1.1341, 1.1015, 1.1155,
         1.0146, 1.067, 1.1584, 1.2293, 0.9541, 1.2314, 1.2146, 1.1581, 1.1064, 1.0486, 1.2258,
         1.276, 1.2602, 1.2115, 1.1157], 5.7506459357445644e-05),
    "identical": ([1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 4.0, 5.0], 1.0),
}


@pytest.mark.parametrize("case", sorted(MANN_WHITNEY))
def test_mann_whitney_matches_the_reference(case):
    a, b, p = MANN_WHITNEY[case]
    assert mann_whitney(a, b) == pytest.approx(p, rel=1e-9)
    assert mann_whitney(b, a) == pytest.approx(p, rel=1e-9)        # two-sided


def test_the_exact_p_counts_every_ordering():
    """Against enumeration: of the C(9, 4) ways to split 9 distinct values 4 + 5, the
    share whose U is at least as far from its mean as the observed one."""
    a, b = [1.0, 2.5, 3.0, 7.0], [4.0, 5.0, 6.0, 8.0, 9.0]
    values = a + b
    def u(first):
        return sum(x > y for x in first for y in values if y not in first)
    observed = abs(u(a) - 10)
    splits = list(itertools.combinations(values, 4))
    tail = sum(abs(u(list(s)) - 10) >= observed for s in splits)
    assert mann_whitney(a, b) == pytest.approx(tail / len(splits))


def test_mann_whitney_of_constant_samples_is_one():
    assert mann_whitney([2.0] * 6, [2.0] * 6) == 1.0


def test_block_means_cover_every_sample_in_blocks_of_the_cube_root():
    assert [block_length(n) for n in (1, 3, 4, 15, 16, 27, 64, 91, 92)] == \
        [1, 1, 2, 2, 3, 3, 4, 4, 5]
    x = [float(i) for i in range(11)]                    # blocks of 2, the last of 3
    assert block_means(x) == [0.5, 2.5, 4.5, 6.5, 9.0]
    assert block_means([3.0]) == [3.0]


def test_too_few_blocks_for_a_p_under_alpha_is_insufficient():
    """9 steps a side make 4 blocks: even every block of one window below every one of
    the other gives p = 2 / C(8, 4) = 0.029, so no verdict could say changed."""
    assert not attainable(9, 9) and attainable(10, 10) and not attainable(0, 30)
    results = compare_samples({"step_time": ([1.0 + 0.01 * i for i in range(9)],
                                             [0.5 + 0.01 * i for i in range(9)])})
    assert results[0].verdict == "insufficient" and results[0].after_median == 0.54
    assert compare_samples({"step_time": ([1.0 + 0.01 * i for i in range(10)],
                                          [0.5 + 0.01 * i for i in range(10)])}
                           )[0].verdict == "better"


def test_block_means_keep_an_autocorrelated_null_from_looking_changed():
    """Two adjacent windows of one AR(1) series (lag-1 0.5, as faulted steps are):
    Mann-Whitney over single steps calls them different at ALPHA far more often than
    ALPHA, block means much less, and the whole verdict (with the bootstrap interval
    and the drift) least."""
    rng = np.random.default_rng(31)
    single = blocks = changed = 0
    for i in range(400):
        x = ar1(rng, 60, 1.0, phi=0.5)
        a, b = x[:30], x[30:]
        single += mann_whitney(a, b) < ALPHA
        blocks += mann_whitney(block_means(a), block_means(b)) < ALPHA
        changed += compare_samples({"step_time": (a, b)}, seed=i)[0].verdict != "no change"
    assert single > 40                                   # > 10 % at a nominal 1 %
    assert blocks < single / 2.5
    assert changed <= blocks and changed < 20            # < 5 %


def test_holm_adjusts_in_order_and_keeps_gaps():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1, kept monotone
    assert holm([0.01, 0.04, 0.03, None, 0.005]) == pytest.approx([0.03, 0.06, 0.06, None, 0.02])
    assert holm([0.5, 0.6]) == [1.0, 1.0]                # capped at 1, monotone
    assert holm([None, None]) == [None, None]
    assert holm([]) == []


def ar1(rng: np.random.Generator, n: int, level: float, phi: float = 0.5,
        sd: float = 0.05) -> list[float]:
    """Autocorrelated noise around `level` (as consecutive step times are)."""
    e = rng.normal(0.0, sd, n)
    x = np.empty(n)
    x[0] = e[0]
    for i in range(1, n):
        x[i] = phi * x[i - 1] + e[i]
    return (level + x).tolist()


def test_block_bootstrap_interval_covers_the_true_difference():
    covered = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        a, b = ar1(rng, 60, 1.0), ar1(rng, 60, 1.2)
        lo, hi = block_bootstrap_ci(a, b, np.random.default_rng(1000 + seed))
        assert lo > 0                                    # 0.2 s is far outside the noise
        covered += lo <= 0.2 <= hi
    assert covered >= 32                                 # >= 80 % of 40 (nominal 95 %)


def test_block_bootstrap_interval_of_one_distribution_holds_zero():
    rng = np.random.default_rng(3)
    a, b = ar1(rng, 80, 1.0), ar1(rng, 80, 1.0)
    lo, hi = block_bootstrap_ci(a, b, np.random.default_rng(4))
    assert lo < 0 < hi and hi - lo < 0.1


def test_drift_is_the_trend_over_half_the_window():
    line = [1.0 + 0.01 * i for i in range(40)]
    assert drift(line) == pytest.approx(0.01 * 40 / 2)
    # robust: checkpoint spikes do not move it
    spiky = [x + (0.5 if i % 10 == 9 else 0.0) for i, x in enumerate(line)]
    assert drift(spiky) == pytest.approx(0.2, rel=0.05)
    assert drift([1.0 - 0.01 * i for i in range(40)]) == pytest.approx(-0.2)   # signed
    noise = np.random.default_rng(5).normal(1.0, 0.05, 40).tolist()
    assert drift(noise) < 0.05
    assert drift([1.0, 2.0, 3.0]) == 0.0                 # too few to say


def healthy(rng, n: int, level: float, per_step: float, start: int = 0) -> list[float]:
    """A healthy series that drifts by itself: level + per_step x index + AR noise, with
    a slower checkpoint step every 10."""
    noise = ar1(rng, n, 0.0, sd=0.02 * level)
    return [level * (1 + per_step * (start + i)) + noise[i]
            + (0.3 * level if (start + i) % 10 == 9 else 0.0) for i in range(n)]


def series(rng, level_of: dict, n: int = 60, start: int = 0) -> dict:
    return {name: healthy(rng, n, level, 0.002, start) for name, level in level_of.items()}


LEVELS = {"step_time": 1.0, "grad_sync_time": 0.3, "data_load_time": 0.05, "busbw": 2.0,
          "retransmit_ratio": 1e-4, "bursts": 40.0, "peak_utilization": 0.8, "rtt_p99": 900.0}


def test_an_aa_comparison_of_a_drifting_healthy_run_is_no_change():
    rng = np.random.default_rng(11)
    run = series(rng, LEVELS, n=120)
    samples = {name: (x[:60], x[60:]) for name, x in run.items()}
    results = compare_samples(samples)
    assert [r.metric for r in results] == [m.name for m in METRICS]
    # a training job serves no requests: it has no request latency to compare
    assert {r.metric: r.verdict for r in results} == {**{name: "no change" for name in LEVELS},
                                                      "request_latency": "insufficient",
                                                      "exchange_time": "insufficient",
                                                      "alltoall_imbalance": "insufficient",
                                                      "bubble_share": "insufficient"}
    # the windows do differ (the drift): the p-value alone would have called it
    step = results[0]
    assert step.after_median > step.before_median and step.p_holm < ALPHA
    assert step.drift_before > 0 and step.drift_after > 0


def test_a_clear_improvement_is_better_and_a_regression_worse():
    rng = np.random.default_rng(12)
    before = series(rng, LEVELS)
    improved = {**LEVELS, "step_time": 0.7, "grad_sync_time": 0.15, "busbw": 3.0}
    after = series(rng, improved, start=60)
    results = {r.metric: r for r in compare_samples(
        {name: (before[name], after[name]) for name in before})}
    for name in ("step_time", "grad_sync_time", "busbw"):
        assert results[name].verdict == "better", results[name]
        assert results[name].p_holm < 0.05
        lo, hi = results[name].ci95
        assert not lo <= 0 <= hi
    # 30 % faster, less what the run's own drift added between the windows' middles
    expected = 0.7 * (1 + 0.002 * 89.5) / (1 + 0.002 * 29.5) - 1
    assert results["step_time"].change_pct == pytest.approx(expected * 100, abs=3)
    assert results["rtt_p99"].verdict == "no change"
    worse = {r.metric: r.verdict for r in compare_samples(
        {name: (after[name], before[name]) for name in before})}
    assert worse["step_time"] == worse["busbw"] == "worse"


def test_a_fault_that_worsens_until_it_is_cleared_is_better_after():
    """The fault window's own rising trend (steps slower as the fault worsens) cannot
    explain why the steps after the clearing are faster: only drift in the direction of
    the change is allowed for (allowing for both windows' drifts regardless of their
    direction withheld this verdict)."""
    rng = np.random.default_rng(13)
    noise = ar1(rng, 80, 0.0, sd=0.03)
    worsening = [0.6 + 0.02 * i + noise[i] for i in range(40)]      # 0.6 -> 1.4 s
    after = [0.45 + noise[40 + i] for i in range(40)]
    step = compare_samples({"step_time": (worsening, after)})[0]
    delta = abs(step.after_median - step.before_median)
    assert step.drift_before == pytest.approx(0.4, rel=0.2)
    assert 1.5 * (abs(step.drift_before) + abs(step.drift_after)) > delta
    assert step.verdict == "better", step


def test_a_fault_that_wears_off_until_it_is_cleared_is_better_after():
    """A fault window whose steps grow faster (TCP settling around a lossy port) runs
    the change's way, but the window after it is flat: a trend one window alone shows
    is not a drift that carries across the boundary (allowing for it withheld this
    verdict at -40 %, p_holm 0.001)."""
    rng = np.random.default_rng(14)
    noise = ar1(rng, 80, 0.0, sd=0.03)
    easing = [1.2 - 0.012 * i + noise[i] for i in range(40)]         # 1.2 -> 0.73 s
    after = [0.7 + noise[40 + i] for i in range(40)]
    step = compare_samples({"step_time": (easing, after)})[0]
    delta = step.after_median - step.before_median
    assert step.drift_before < 0 and 1.5 * abs(step.drift_before) > abs(delta)
    assert step.verdict == "better", step


def test_a_drift_in_the_direction_of_the_change_withholds_the_verdict():
    """A run that slows steadily by itself: the later window is slower by what the drift
    carries between the windows, which is no change."""
    line = [1.0 + 0.005 * i + 0.01 * ((i * 7) % 5 - 2) for i in range(80)]
    step = compare_samples({"step_time": (line[:40], line[40:])})[0]
    assert step.p_holm < ALPHA and step.drift_before > 0 and step.drift_after > 0
    assert step.verdict == "no change", step


def test_step_time_is_tested_alone_and_the_other_metrics_as_one_holm_family():
    """A step-time change with p about 0.004 is a change even where none of the seven
    metrics that explain it changed (corrected with them, it would need p < ALPHA / 8);
    they share one Holm correction among themselves. 6 blocks a side, one pair of them
    out of order: exact p = 4 / C(12, 6)."""
    rng = np.random.default_rng(21)
    before = {m.name: list(rng.normal(1.0, 0.05, 12)) for m in METRICS}
    after = {m.name: list(rng.normal(1.0, 0.05, 12)) for m in METRICS}
    before["step_time"] = [1.0, 0.98, 1.02, 0.98, 0.97, 0.99, 0.96, 0.98, 0.74, 0.76, 1.0, 1.02]
    after["step_time"] = [0.71, 0.73, 0.69, 0.71, 0.7, 0.72, 0.72, 0.74, 0.79, 0.81, 0.68, 0.7]
    results = compare_samples({m.name: (before[m.name], after[m.name]) for m in METRICS})
    step, others = results[0], results[1:]
    assert step.metric == "step_time"
    assert step.p_value == pytest.approx(4 / 924)
    assert ALPHA / len(METRICS) < step.p_value < ALPHA
    assert step.p_holm == step.p_value and step.verdict == "better"
    assert [r.p_holm for r in others] == pytest.approx(holm([r.p_value for r in others]))


def test_a_served_models_request_latency_is_its_question_when_it_has_no_steps():
    """No steps in either window: the request latency is tested alone, at ALPHA, and
    the metrics that explain it share one Holm correction; a DDP job's request latency
    is insufficient and leaves its family as it was."""
    rng = np.random.default_rng(31)
    before = [0.005 + 0.0005 * x for x in rng.exponential(1.0, 40)]
    after = [0.008 + 0.0005 * x for x in rng.exponential(1.0, 40)]
    results = {r.metric: r for r in compare_samples({
        "request_latency": (before, after),
        "rtt_p99": (list(rng.normal(900, 20, 40)), list(rng.normal(900, 20, 40)))})}
    latency = results["request_latency"]
    assert latency.p_holm == latency.p_value < ALPHA and latency.verdict == "worse"
    assert results["step_time"].verdict == "insufficient"
    assert results["rtt_p99"].p_holm == pytest.approx(holm([results["rtt_p99"].p_value])[0])


def test_request_latencies_come_from_the_jobs_collectives_as_the_analyzer_classifies_them():
    """Three ranks serve requests at random (a MoE AlltoAll per request): each whole
    request's latency is its calls' span over all ranks (the first and the last, which
    the window's edges may cut, are not whole: fabricscope.requestmodel)."""
    from fabricscope.diagnosis.compare import request_latencies
    from fabricscope.diagnosis.timespan import Span
    rng = np.random.default_rng(5)
    columns = ["time", "bytes", "seconds", "peer"]
    series, t = {r: [] for r in range(3)}, 1_000_000_000
    for _ in range(30):
        t += int(rng.exponential(0.1) * 1e9) + 5_000_000
        for r in range(3):
            series[r].append([t + r * 1_000_000, 4096, 0.002, None])
    store = FakeStore([({"rank": str(r), "op": "AlltoAll"}, columns, rows)
                       for r, rows in series.items()])
    latencies = request_latencies(store, "j", Span(0, t + 10**9))
    assert latencies == pytest.approx([0.004] * 28)


class FakeStore:
    """Answers the analyzer's read of gloo_collective (diagnosis/jobclass.read_window)
    with fixed series, and its read of ncclprof_collective with none; no gloo_step."""

    def __init__(self, series):
        self._series = series

    def series(self, query):
        if "FROM gloo_collective " not in query:
            return []
        lo, hi = map(int, re.search(r"time >= (\d+) AND time < (\d+)", query).groups())
        return [(tags, columns, [row for row in rows if lo <= row[0] < hi])
                for tags, columns, rows in self._series]

    def query(self, _query):
        return []


def _training_loop(steps: int, step_s, exchange_s) -> list:
    """A MoE loop on three ranks as gloo_collective series: two AlltoAlls a step, no
    gradient AllReduce (so no gloo_step); step_s and exchange_s are functions of the
    step's index."""
    columns = ["time", "bytes", "seconds", "peer"]
    series, t = {r: [] for r in range(3)}, 1_000_000_000
    for i in range(steps):
        for r in range(3):
            series[r].append([t, 65536, exchange_s(i) / 2, None])
            series[r].append([t + 2_000_000, 32768, exchange_s(i) / 2, None])
        t += int(step_s(i) * 1e9)
    return [({"rank": str(r), "op": "AlltoAll"}, columns, rows) for r, rows in series.items()]


def test_a_loop_without_gloo_steps_is_compared_by_the_steps_of_its_collectives():
    """A MoE job reduces no gradients, so gloo_step cuts none of its steps: its step time
    and its time in exchanges come from the loop its collectives repeat."""
    from fabricscope.diagnosis.compare import samples
    from fabricscope.diagnosis.timespan import Span
    slow = FakeStore(_training_loop(60, lambda i: 0.05 if i < 30 else 0.03,
                                    lambda i: 0.004 if i < 30 else 0.002))
    got = samples(slow, "j", Span(0, int(2.5e9)), Span(int(2.5e9), int(10e9)))
    step_before, step_after = got["step_time"]
    assert step_before == pytest.approx([0.05] * len(step_before))
    assert step_after == pytest.approx([0.03] * len(step_after)) and len(step_after) >= 20
    exchange_before, exchange_after = got["exchange_time"]
    assert exchange_before == pytest.approx([0.004] * len(exchange_before), rel=1e-3)
    assert exchange_after == pytest.approx([0.002] * len(exchange_after), rel=1e-3)
    results = {r.metric: r.verdict for r in compare_samples(got)}
    assert results["step_time"] == "better" and results["exchange_time"] == "better"
    assert results["request_latency"] == "insufficient"


def _moe_loop(steps: int, hot_bytes) -> list:
    """A MoE loop on three ranks (two AlltoAlls a step, 50 ms apart): rank 0 receives
    hot_bytes(i) per AlltoAll of step i, the others 32 KiB."""
    columns = ["time", "bytes", "seconds", "peer"]
    series, t = {r: [] for r in range(3)}, 1_000_000_000
    for i in range(steps):
        for r in range(3):
            size = hot_bytes(i) if r == 0 else 32768
            series[r].append([t, size, 0.003, None])
            series[r].append([t + 20_000_000, size, 0.003, None])
        t += 50_000_000
    return [({"rank": str(r), "op": "AlltoAll"}, columns, rows) for r, rows in series.items()]


def test_a_moe_jobs_all_to_all_imbalance_is_compared_per_step():
    """Routing made even (rank 0's experts were hot: 4x the others' bytes, then the
    same): the imbalance per step falls from 2x the mean to 1x."""
    from fabricscope.diagnosis.compare import samples
    from fabricscope.diagnosis.timespan import Span
    store = FakeStore(_moe_loop(120, lambda i: 131072 if i < 60 else 32768))
    got = samples(store, "j", Span(0, int(4e9)), Span(int(4e9), int(8e9)))
    _assert_better_per_step(got, "alltoall_imbalance", 2.0, 1.0, unmeasured="bubble_share")


def _pipeline_loop(steps: int, wait_s) -> list:
    """Two stages: per 100 ms step, rank 0 sends to rank 1 and rank 1 receives from it,
    each for wait_s(i) seconds of the step."""
    columns = ["time", "bytes", "seconds", "peer"]
    sends, recvs, t = [], [], 1_000_000_000
    for i in range(steps):
        sends.append([t, 65536, wait_s(i), 1])
        recvs.append([t, 65536, wait_s(i), 0])
        t += 100_000_000
    return [({"rank": "0", "op": "Send"}, columns, sends),
            ({"rank": "1", "op": "Recv"}, columns, recvs)]


def test_a_pipelines_bubble_is_compared_per_step():
    """Stages rebalanced: the time each spends in Send/Recv falls from 40 to 10 ms of
    its 100 ms step, so the bubble per step falls from 0.4 to 0.1."""
    from fabricscope.diagnosis.compare import samples
    from fabricscope.diagnosis.timespan import Span
    store = FakeStore(_pipeline_loop(120, lambda i: 0.04 if i < 60 else 0.01))
    got = samples(store, "j", Span(0, int(7e9)), Span(int(7e9), int(14e9)))
    _assert_better_per_step(got, "bubble_share", 0.4, 0.1, unmeasured="alltoall_imbalance")


def _assert_better_per_step(got: dict, metric: str, was: float, now: float,
                            unmeasured: str) -> None:
    """metric took `was` in each of at least 20 steps before and `now` in as many
    after, compares as better, and the other class's metric had no step to measure."""
    before, after = got[metric]
    assert len(before) >= 20 and len(after) >= 20
    assert before == pytest.approx([was] * len(before))
    assert after == pytest.approx([now] * len(after))
    assert got[unmeasured] == ([], [])
    assert {r.metric: r.verdict for r in compare_samples(got)}[metric] == "better"
