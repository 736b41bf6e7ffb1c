"""Every number the engine decides by, in one place, each with the reason it has.

None of these is fitted to the lab's scenarios: each comes from the physics of
the fabric, from TCP, or from what a healthy run of the job itself shows (the
job's own baseline); docs/DIAGNOSIS.md renders this table (`python -m
fabricscope.diagnosis.thresholds`), and a test keeps it current.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field


def why(text: str, unit: str = ""):
    return {"why": text, "unit": unit}


@dataclass(frozen=True)
class Thresholds:
    # -- evaluation -------------------------------------------------------------------
    eval_seconds: int = field(default=3, metadata=why(
        "seconds of evidence each evaluation sums: the agents' windows are 1 s, and three "
        "of them hold hundreds of segments of every ring hop at training rates", "s"))
    close_clean_seconds: int = field(default=2, metadata=why(
        "a finding closes after this much evidence without it (its end is its last bad "
        "second): long enough to see that a hop carried data cleanly again", "s"))
    # -- network: cells are one node's flows to one peer ---------------------------------
    cell_min_bytes: int = field(default=1_000_000, metadata=why(
        "a cell carries data in the window (about 700 full segments): below it a few "
        "tail-loss probes of small messages swing any ratio", "bytes"))
    loss_ratio: float = field(default=0.002, metadata=why(
        "share of a cell's payload resent that marks it lossy: healthy fabrics lose well "
        "under 1e-5; TCP's own probes resend about 1e-4 of a busy ring's bytes in a "
        "healthy run; and loss of 1e-3 already costs a collective a visible share of its "
        "throughput (Mathis: throughput ~ 1/sqrt(p))", "fraction"))
    loss_min_segs: int = field(default=20, metadata=why(
        "segments resent in the window before a cell can be lossy: 20 +- 4.5 (Poisson) "
        "keeps chance from crossing the ratio", "segments"))
    spared_min_episodes: float = field(default=7.0, metadata=why(
        "loss episodes the clean hops through a lossy place would have met at the lossy "
        "hops' rate (episodes per byte) before their sparing counts. Frames die in runs "
        "(a burst of bit errors, a drop of a segmentation-offload frame of up to 44 "
        "segments), so the unit that falls independent of load is the episode, not the "
        "segment: counted as the seconds in which a hop resent anything (one per second "
        "at most, so the expectation is low if anything), a link that drops independent "
        "of load spares all of an expectation of 7 with a chance of e^-7 < 1e-3",
        "episodes"))
    spared_share: float = field(default=0.1, metadata=why(
        "the clean hops met at most this share of the loss episodes the lossy hops' rate "
        "predicts for them: the loss spares some traffic through the place and hits what arrives "
        "while it overflows (a checkpoint or the job's synchronized sends joining the "
        "ring's), which is a buffer, not a lossy link", "fraction"))
    rtt_inflation: float = field(default=4.0, metadata=why(
        "a data cell's median RTT this many times the job's RTT floor (the lowest median "
        "any of its data cells showed) means a standing queue on its path", "x"))
    rtt_excess_us: float = field(default=1000.0, metadata=why(
        "and at least this much above the floor: 1 ms of queue is 125 KB at 1 Gbit/s and "
        "1.25 MB at 10 Gbit/s, more than a shallow ToR buffer gives one port; below it a "
        "busy host's own scheduling moves a flow's median RTT (up to ~1 ms measured on "
        "the lab's loaded 4-node runs), which is no queue in the fabric", "us"))
    confirm_seconds: int = field(default=2, metadata=why(
        "a new network finding needs bad seconds at its place spanning at least this "
        "long, from the first one's start to the last one's end, besides two "
        "evaluations in a row: the evaluations' "
        "windows overlap by all but a second, so two of them can read one bad second "
        "twice; a fault persists, while one second is what a single event leaves (one "
        "retransmission timeout, a host's stall, the first hop of the ring to meet a "
        "fault showing before the others do)", "s"))
    place_explains: float = field(default=0.8, metadata=why(
        "a place (a node's port, a ToR's uplink) is named when it lies on the path of at "
        "least this share of the bad cells; else the finding says the network is impaired "
        "and lists the cells", "fraction"))
    narrowed_share: float = field(default=0.6, metadata=why(
        "a node whose NIC received at most this share of its usual peak (the median, "
        "over the fault's seconds in which data reached it through no other rack's "
        "uplink, of each second's busiest 100 us bin, against its median over the "
        "job's baseline; detect_network.port_rates) has a narrowed port: a link that paces every "
        "frame to the node (a degraded or policed link, a shaper) caps what it "
        "receives, while a queue upstream (a ToR's uplink) leaves the node's other "
        "traffic, its reads, arriving at line rate. The busiest bin of a second "
        "varies by about +-30 % in healthy lab runs (4.5-7.7 Gbit/s around 5.5); a "
        "port shaped to 100-200 Mbit/s peaks at the shaper's burst, 1.8-2.7 Gbit/s",
        "fraction"))
    kept_share: float = field(default=0.75, metadata=why(
        "a node whose NIC received at least this share of its usual peak (as for "
        "narrowed_share) in every second, two at least, of a queue's fault on the hop "
        "into it has a port, and its ToR a downlink, that pass traffic at full rate: "
        "a queue there needs senders converging on it, and the ring's one hop into "
        "the node is one sender, so the queue sits upstream. A healthy port's busiest "
        "bin, on the seconds its node received its reads, is at least 0.77 of its usual "
        "in 95 % of seconds (the lab's healthy runs, median 1.14), so a port at full "
        "rate shows this in two seconds nine times in ten; a port shaped to 100-200 "
        "Mbit/s showed at most 0.62 in the lesser of any two of its fault's seconds "
        "(150 evaluations of 24 runs); between narrowed_share and this a port is "
        "judged neither way", "fraction"))
    microburst_util: float = field(default=0.9, metadata=why(
        "a 100 us bin at this share of the link's speed is a burst at line rate", "fraction"))
    # -- steps: the job's own baseline --------------------------------------------------
    warmup_steps: int = field(default=2, metadata=why(
        "steps left out of the baseline at the start: DDP builds its buckets and the "
        "allocator warms up in them", "steps"))
    baseline_steps: int = field(default=8, metadata=why(
        "steps whose median is the job's baseline (step time, grad sync, data load, "
        "spread); taken from the first stretch with no finding open", "steps"))
    recent_steps: int = field(default=3, metadata=why(
        "a rank's recent behaviour is the median of its last steps: three make one slow "
        "checkpoint step an outlier, not the median", "steps"))
    slowdown: float = field(default=0.5, metadata=why(
        "steps this much slower than the baseline are a slowdown to explain: a healthy "
        "lab run drifts by up to +28 % over its run (checkpoints, page cache, "
        "neighbours), so a smaller share would be its own noise", "fraction"))
    explains: float = field(default=0.5, metadata=why(
        "a cause is named for a slowdown only when its evidence accounts for at least "
        "this share of the time the steps lost", "fraction"))
    critical_share: float = field(default=0.3, metadata=why(
        "a cause that costs at least this share of every step is critical", "fraction"))
    straggler_ratio: float = field(default=3.0, metadata=why(
        "a rank whose compute (step minus grad sync) is this many times the others' "
        "median is late to every collective: one slow rank holds a ring at its pace, so "
        "the factor must stand out of per-rank noise, which stays within 2x", "x"))
    straggler_steps: int = field(default=2, metadata=why(
        "the slow rank is late (twice the others' compute in the same step) in each of "
        "its last steps: two in a row rule out one descheduled step, and with the "
        "median over recent_steps a rank is named in the second step after it slowed "
        "(the step it is in counts once it is late so far)", "steps"))
    straggler_min_share: float = field(default=0.2, metadata=why(
        "and late by at least this share of the baseline step: smaller lateness matters "
        "little to the job, and a shared host's load bursts make a healthy rank that "
        "late for a step or two (up to ~15 % of a step in the lab's loaded runs)",
        "fraction"))
    starved_share: float = field(default=0.9, metadata=why(
        "a rank its CPU limit throttles through at least this share of each of its "
        "last straggler_steps steps (and as _throttled_rank singles it out) is a compute "
        "straggler though not late to the collectives: CFS throttles a cgroup only once "
        "its quota for the period is spent, so a rank throttled through nearly all of "
        "its time runs at the quota's pace everywhere, inside the collectives too. A "
        "quota that comes and goes leaves part of some step free: the alerting lab's "
        "quota on every other step, and CPU-bound ranks whose limit bites only in "
        "their compute, are throttled through less. Under one standing limit (the same "
        "quota from the start to the end of each of those steps, gloo_step "
        "cpu_limit_held: a Kubernetes CPU limit) a rank "
        "_throttled_rank singles out is named at any share: the lab's rank at 10 % of a "
        "CPU was throttled through 0.5-0.9 of each step and paced the ring", "fraction"))
    input_ratio: float = field(default=2.0, metadata=why(
        "data loading per step this many times its baseline marks the input as slow",
        "x"))
    input_min_share: float = field(default=0.1, metadata=why(
        "and adding at least this share of the baseline step", "fraction"))
    # -- trends ---------------------------------------------------------------------------
    jitter_window_steps: int = field(default=10, metadata=why(
        "steps over which the spread (median absolute deviation) of step time is taken",
        "steps"))
    jitter_floor: float = field(default=0.10, metadata=why(
        "the baseline spread is at least this share of the baseline step: steps that "
        "vary by less than a tenth of a step cost the job less than a tenth of its time, "
        "the bar below which no fault need be named; a quieter start would make a "
        "spread of a few per cent later look like a trend", "fraction"))
    jitter_allowance: float = field(default=2.0, metadata=why(
        "CUSUM allowance: spread up to this factor over the baseline adds nothing "
        "(log-ratio cusum, Page 1954): the MAD of ten steps varies by about +-40 % "
        "by chance alone, so up to twice the baseline is that sampling noise (the "
        "alert's trend rule uses the same factor)", "x"))
    jitter_alarm: float = field(default=2.0, metadata=why(
        "CUSUM threshold on the summed log-ratio excess, each step counting a window's "
        "share: a spread three times the baseline for five windows of steps, four times "
        "for three", ""))
    duty_cycle: float = field(default=0.5, metadata=why(
        "D = grad-sync time / step time above this: communication dominates the step "
        "(the seed model's network-bound criterion)", "fraction"))
    duty_rise: float = field(default=0.15, metadata=why(
        "D this much above the job's own baseline D, while the steps have been slow "
        "(slowdown) and unexplained as long as an unexplained slowdown must be, with no "
        "network, straggler or input finding, turns network_bound into a warning: a "
        "straggler's late entry raises the others' D before the straggler is named",
        "fraction"))
    # -- telemetry ------------------------------------------------------------------------
    silent_seconds: float = field(default=15.0, metadata=why(
        "a node of a running job without a window for this long, while the job's other "
        "nodes report: its agent writes one every second, and an agent on a node whose "
        "CPUs the training keeps busy (it runs at nice 10) ships seconds late at times, "
        "which is delay, not a gap", "s"))


DEFAULT = Thresholds()


def render_markdown(t: Thresholds = DEFAULT) -> str:
    out = ["| threshold | value | why |", "|---|---|---|"]
    for f in dataclasses.fields(t):
        unit = f.metadata.get("unit", "")
        out.append(f"| `{f.name}` | {getattr(t, f.name)} {unit} | {f.metadata['why']} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
