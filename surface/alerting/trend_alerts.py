"""Alerts that compare a job with itself: jitter against its own baseline, and what
its retransmits cost against what they resend. No static threshold on a raw metric:
step times differ by orders of magnitude between jobs."""

from __future__ import annotations

from fabricscope.diagnosis.causes import Cause
from fabricscope.surface.alerting.cases import OPEN, finding_cases
from fabricscope.surface.alerting.finding_alerts import DIAGNOSE, EXPLAIN, FOR
from fabricscope.surface.metrics import (FINDING_ACTIVE, JOB_GRAD_SYNC_SLOWDOWN, JOB_JITTER,
                             JOB_JITTER_BASELINE, JOB_RETRANSMIT_AMPLIFICATION, JOB_STEP)
from fabricscope.surface.alerting.model import FROM_FINDING, Alert, Case, Expect, Rule, Runbook, board
from fabricscope.surface.alerting.promql import FindingSeries, across_replicas, finding_open, selector

GROUP = "fabricscope-trends"
#: the gauges are over the last 10 steps (or 10 s) already; 30 s more is three fresh
#: windows of them, so one slow step or one burst of timeouts does not page
TREND_FOR = "30s"

JITTER_RATIO = 2          # jitter of the last 10 steps / the job's baseline jitter
#: A steady job's baseline MAD can be well under a millisecond, and a rank preempted
#: once by the scheduler adds about that much: against a tiny baseline any noise
#: "doubles". The baseline counts as at least 5 ms.
JITTER_FLOOR_S = 0.005
#: and the jitter must be worth a person's time: at least 5 % of the step
JITTER_SHARE_OF_STEP = 0.05

AMPLIFICATION = 10        # an order of magnitude more collective time than bytes resent
GRAD_SYNC_SLOWDOWN = 1.3  # ...while grad sync is clearly slower (a tiny ratio is noisy)

_JITTER_FINDING = FindingSeries(Cause.JITTER_ACCUMULATION, "warning", id="aab2c3d4e5f6")
_JITTER_TREND = f"""\
(
  {across_replicas(JOB_JITTER)}
    / clamp_min({across_replicas(JOB_JITTER_BASELINE)}, {JITTER_FLOOR_S})
  > {JITTER_RATIO}
)
and on(job)
(
  {across_replicas(JOB_JITTER)}
    > {JITTER_SHARE_OF_STEP} * {across_replicas(JOB_STEP)}
)
unless on(job)
{across_replicas(f'{FINDING_ACTIVE}{{cause="jitter_accumulation"}}')}
"""


def _job(metric: str, values: str, job: str = "train-a") -> tuple[str, str]:
    return selector(metric, {"job": job, "instance": "collector-0"}), values


def _jitter(jitter: str, baseline: str, step: str) -> dict[str, str]:
    return dict((_job(JOB_JITTER, jitter), _job(JOB_JITTER_BASELINE, baseline),
                 _job(JOB_STEP, step)))


_GROWING = _jitter("0.02+0.002x90", "0.02x90", "1x90")   # over 2x and 5 % from 16 s on

JITTER_ACCUMULATING = Alert(
    "FabricscopeJitterAccumulating", GROUP,
    "Step-time jitter accumulates in job {job}",
    "",
    rules=(
        Rule(finding_open(Cause.JITTER_ACCUMULATION), FOR, FROM_FINDING, signal="change_point",
             description="The engine's change-point test on the step times of job {job} "
             "found their spread growing over the run (finding {id}). "
             "Evidence: `fabricscope explain {id}`."),
        Rule(_JITTER_TREND, TREND_FOR, "warning", signal="baseline_ratio",
             description="The spread of the last 10 step times of job {job} is {value:.1f} "
             "times the job's own baseline (the spread of its first steps, counted as at "
             f"least {JITTER_FLOOR_S * 1000:.0f} ms) and over "
             f"{JITTER_SHARE_OF_STEP:.0%} of its step time. "
             "Where it comes from: `fabricscope diagnose --job {job}`."),
    ),
    runbook=Runbook(
        "Step times get less regular as the run goes on: a buffer that fills more often, "
        "a link that starts to flap, a rank that falls further behind. Each step is only "
        "a little slower, so a static threshold on step time misses it. The alert compares "
        "the job with itself: the engine's change-point test on per-step jitter (finding "
        "`jitter_accumulation`), or, while the engine has not opened one, the median "
        f"absolute deviation of the last 10 step times against that of the job's first "
        f"steps: over {JITTER_RATIO} times it for {TREND_FOR}. The baseline counts as at "
        f"least {JITTER_FLOOR_S * 1000:.0f} ms, because a steady job's baseline can be "
        "under a millisecond and a rank preempted once adds about that much; and the "
        f"jitter must exceed {JITTER_SHARE_OF_STEP:.0%} of the step time to matter.",
        (DIAGNOSE + " Jitter is a symptom; the finding that explains it is the one to act on.",
         EXPLAIN + " For the change-point finding: the step where the spread changed, and "
         "by how much.",
         f"{board('job')}: step time and its spread per step, against the "
         "baseline band; look for a period (checkpoints every N steps, another job)."),
        ("Follow the runbook of the finding that explains the growth (lossy link, buffer "
         "saturation, straggler).",
         "Periodic spikes: write checkpoints less often or asynchronously, or off the "
         "training network; keep other jobs off the job's links."),
    ),
    board="job",
    cases=finding_cases(_JITTER_FINDING, FOR) + (
        Case("jitter grows past twice its baseline for 30 s", _GROWING, at="60s",
             expect=(Expect({"job": "train-a", "severity": "warning"}, rule=1, value=7.0),)),
        Case("jitter grows, not yet for 30 s", _GROWING, at="40s"),
        Case("jitter steady at its baseline", _jitter("0.02x90", "0.02x90", "1x90"), at="60s"),
        Case("four times a tiny baseline stays under the 5 ms floor",
             _jitter("0.004x90", "0.001x90", "0.05x90"), at="60s"),
        Case("three times the baseline but under 5 % of a long step",
             _jitter("0.06x90", "0.02x90", "10x90"), at="60s"),
        Case("the engine's finding replaces the trend rule",
             {**_GROWING, _JITTER_FINDING.series(): OPEN}, at="60s",
             expect=(Expect(_JITTER_FINDING.labels()),)),
    ),
    causes=(Cause.JITTER_ACCUMULATION,))


def _amplification(amplification: str, slowdown: str) -> dict[str, str]:
    return dict((_job(JOB_RETRANSMIT_AMPLIFICATION, amplification),
                 _job(JOB_GRAD_SYNC_SLOWDOWN, slowdown)))


RETRANSMIT_AMPLIFICATION = Alert(
    "FabricscopeRetransmitAmplification", GROUP,
    "Retransmits cost job {job} {value:.0f} times what they resend",
    "The gradient sync of job {job} is slower than its baseline while only a small share "
    "of its segments is resent: each unit resent costs {value:.1f} units of collective "
    f"time (over {AMPLIFICATION} with grad sync over {GRAD_SYNC_SLOWDOWN} times its "
    f"baseline, for {TREND_FOR}). Timeouts, not bandwidth, are the likely cost. "
    "Where: `fabricscope diagnose --job {job}`.",
    rules=(Rule(f"""\
{across_replicas(JOB_RETRANSMIT_AMPLIFICATION)} > {AMPLIFICATION}
and on(job)
{across_replicas(JOB_GRAD_SYNC_SLOWDOWN)} > {GRAD_SYNC_SLOWDOWN}
""", TREND_FOR, "warning"),),
    runbook=Runbook(
        "Amplification = (grad-sync slowdown - 1) / retransmit ratio. When retransmits "
        "cost only the bytes they resend it stays near 1 (1 % resent, about 1 % slower). "
        f"Over {AMPLIFICATION}, each loss stalls the collective far beyond its bytes: "
        "retransmission timeouts (Linux's minimum RTO is 200 ms) and tail losses in the "
        "ring, where one lost segment holds every rank up. The alert wants grad sync "
        f"clearly slower too (over {GRAD_SYNC_SLOWDOWN} times its baseline): with very "
        "few segments resent the ratio is large on noise alone. "
        f"{TREND_FOR} is three of the ratio's 10 s windows.",
        (DIAGNOSE + " The lossy link or buffer saturation finding says where the losses are.",
         f"{board('job')}: retransmits and RTOs inside the grad-sync phases, per "
         "rank; RTO counts (`timeouts` of `tcp_node`) near the retransmit counts mean "
         "timeouts."),
        ("Make each loss cheaper: `ip route change ROUTE rto_min 5ms` on the job's nodes "
         "(or `tcp_rto_min_us`); on IB, NCCL_IB_TIMEOUT (default 20, about 4.3 s a retry).",
         "Remove the losses: follow FabricscopeLossyLink or FabricscopeBufferSaturation for "
         "the place the job's findings name."),
    ),
    board="job",
    cases=(
        Case("amplification 25 with grad sync 1.5 times its baseline",
             _amplification("25x90", "1.5x90"), at="45s",
             expect=(Expect({"job": "train-a", "severity": "warning"}, value=25.0),)),
        Case("amplification high, not yet for 30 s", _amplification("25x90", "1.5x90"),
             at="20s"),
        Case("amplification high but grad sync barely slower",
             _amplification("25x90", "1.1x90"), at="45s"),
        Case("grad sync slower, retransmits explain it (bandwidth)",
             _amplification("3x90", "1.5x90"), at="45s"),
    ))

TREND_ALERTS = (JITTER_ACCUMULATING, RETRANSMIT_AMPLIFICATION)
