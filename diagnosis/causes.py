"""The closed vocabulary of causes, and of severities: every finding names one of each.

`unexplained_slowdown` is what the engine says when the job is slower than its own
baseline but no cause's evidence explains most of the lost time (the evidence is
kept). `rdma_misconfig` is reserved for the RDMA signals and not raised yet.
Members are strings (StrEnum), so they compare, hash, print and serialize as their
names do in the store, on the wire and in the alert rules.
"""

from __future__ import annotations

import enum


class Cause(enum.StrEnum):
    LOSSY_LINK = "lossy_link"
    BUFFER_SATURATION = "buffer_saturation"
    MICROBURST = "microburst"
    STRAGGLER_COMPUTE = "straggler_compute"
    STRAGGLER_NETWORK = "straggler_network"
    INPUT_STALL = "input_stall"
    JITTER_ACCUMULATION = "jitter_accumulation"
    NETWORK_BOUND = "network_bound"
    TELEMETRY_GAP = "telemetry_gap"
    UNEXPLAINED_SLOWDOWN = "unexplained_slowdown"
    RDMA_MISCONFIG = "rdma_misconfig"
    STAGE_IMBALANCE = "stage_imbalance"
    ALLTOALL_SKEW = "alltoall_skew"
    LATENCY_BOUND = "latency_bound"
    TAIL_LATENCY = "tail_latency"
    BISECTION_LIMIT = "bisection_limit"


#: what each cause means
MEANING = {
    Cause.LOSSY_LINK: "a port or cable drops frames independent of load",
    Cause.BUFFER_SATURATION: "a switch buffer overflows under the job's synchronized bursts",
    Cause.MICROBURST: "bursts at line rate without loss or queueing (normal for training)",
    Cause.STRAGGLER_COMPUTE: "one rank is late to its collectives, or its CPU limit starves it "
                             "inside them, while its network is healthy",
    Cause.STRAGGLER_NETWORK: "one rank's link slows the whole ring",
    Cause.INPUT_STALL: "data loading delays the steps",
    Cause.JITTER_ACCUMULATION: "step-time variance grows over the run",
    Cause.NETWORK_BOUND: "communication dominates the step (duty cycle D > 0.5)",
    Cause.TELEMETRY_GAP: "the engine lacks data for a node or a job",
    Cause.UNEXPLAINED_SLOWDOWN: "steps are slower than the job's baseline; no cause explains it",
    Cause.RDMA_MISCONFIG: "RDMA transport misconfigured (reserved: needs the RDMA signals)",
    Cause.STAGE_IMBALANCE: "one pipeline stage computes more than the others and paces them",
    Cause.ALLTOALL_SKEW: "a few ranks receive most of a MoE job's all-to-all bytes (hot "
                         "experts)",
    Cause.LATENCY_BOUND: "many small collectives per step each pay extra round-trip time",
    Cause.TAIL_LATENCY: "a served model's request latency (its median, P90 or P99) rose "
                        "against its own baseline",
    Cause.BISECTION_LIMIT: "a MoE job's all-to-all crosses a ToR's uplink with more than it "
                           "carries: the job's placement needs more bandwidth between racks",
}

#: when each cause is raised at which severity (docs/DIAGNOSIS.md renders the dicts
#: below with MEANING; a `name` in backquotes is a threshold (diagnosis/thresholds.py) or a module's
#: constant (`module.NAME`), and the rendered table shows its value)
SEVERITY_RULE = {
    Cause.LOSSY_LINK: "warning; critical when it costs `critical_share` of each step",
    Cause.BUFFER_SATURATION: "warning; critical when it costs `critical_share` of each step",
    Cause.MICROBURST: "info",
    Cause.STRAGGLER_COMPUTE: "warning; critical when it costs `critical_share` of each step",
    Cause.STRAGGLER_NETWORK: "warning; critical when it costs `critical_share` of each step",
    Cause.INPUT_STALL: "warning; critical when it costs `critical_share` of each step",
    Cause.JITTER_ACCUMULATION: "warning",
    Cause.NETWORK_BOUND: "info; warning when D rose and nothing else explains slow steps",
    Cause.TELEMETRY_GAP: "warning for a silent agent; info for records dropped",
    Cause.UNEXPLAINED_SLOWDOWN: "info; warning from twice the baseline step, or for hops "
                                "no place explains",
    Cause.RDMA_MISCONFIG: "not raised",
    Cause.STAGE_IMBALANCE: "warning; critical when it costs `critical_share` of each step",
    Cause.ALLTOALL_SKEW: "warning; critical when it costs `critical_share` of each step",
    Cause.LATENCY_BOUND: "warning; critical when it costs `critical_share` of each step",
    Cause.TAIL_LATENCY: "warning; critical when the quantile that rose did so by `critical_share` or more",
    Cause.BISECTION_LIMIT: "warning; critical when it costs `critical_share` of each step",
}

#: the evidence each cause is named on, and why that evidence means this cause
EVIDENCE = {
    Cause.LOSSY_LINK:
        "the hops through one place resend at least `loss_ratio` of their payload "
        "(`loss_min_segs` segments at least) with their RTT at the job's floor in the "
        "seconds in which they resent, and no "
        "traffic through the place was spared where its clean hops carried enough to "
        "tell: frames die independent of load, with no queue in front of the drop",
    Cause.BUFFER_SATURATION:
        "the lossy hops through one place also queue: most of those whose delay can be "
        "judged show, in the seconds in which they resent, a median RTT `rtt_inflation` x "
        "the floor and `rtt_excess_us` above it (a buffer delays the frames of the "
        "seconds it drops in; seconds of no loss between them say nothing of it). Or, with no queue shown, the loss spares the place's clean hops (they meet "
        "at most `spared_share` of the loss episodes the lossy hops' rate predicts, an "
        "expectation of `spared_min_episodes` at least): a buffer drops only what arrives while it "
        "overflows under the synchronized bursts",
    Cause.MICROBURST:
        "100 us bins at `microburst_util` of line rate or more, with no hop lossy or "
        "delayed and no qdisc drops: the synchronized bursts of training, which cost "
        "nothing",
    Cause.STRAGGLER_COMPUTE:
        "one rank's compute outside storage I/O is `straggler_ratio` x the others' "
        "median and late by `straggler_min_share` of the baseline step, in each of its "
        "last `straggler_steps` steps, while the others wait inside the collectives "
        "(their grad sync grew by half its lateness at least); the step it is in counts "
        "while the others wait in theirs. A step of a rank that reads every step is "
        "judged once its read is in: a read slowed on its way in is no compute. A rank "
        "that is not late is named when its CPU "
        "limit sets its pace: the most throttled rank by far, under one standing limit "
        "through those steps or throttled through `starved_share` of each, runs the "
        "collectives at its quota's pace too",
    Cause.STRAGGLER_NETWORK:
        "hops through one node's port are delayed without loss anywhere in the job, on a "
        "row or column of the matrix that no clean hop through the port contradicts and "
        "that stands out of the rest (a timed hop between two other nodes on time: where "
        "every hop is as late, the job's whole fabric is), and grad sync grew by "
        "`slowdown` over the baseline: a slow link holds the ring at its pace",
    Cause.INPUT_STALL:
        "the ranks' data loading per step (the span of a step's reads, first byte to "
        "last, the read still streaming included) is `input_ratio` x its baseline, adds "
        "`input_min_share` of the baseline step, and grew more than grad sync: the "
        "steps wait on the store",
    Cause.JITTER_ACCUMULATION:
        "a one-sided CUSUM of log(step-time spread / the job's own spread), the spread "
        "being the MAD of `jitter_window_steps` steps without checkpoints, crosses "
        "`jitter_alarm` with an allowance of `jitter_allowance`: the spread stays above "
        "the job's own, the longer the smaller the excess; the hop whose RTT varies "
        "most is named where one stands out",
    Cause.NETWORK_BOUND:
        "the duty cycle D = grad sync / step time exceeds `duty_cycle`, shown with T "
        "(the step time) and B (the nodes' busiest 100 us bin received): the fabric, "
        "not compute, sets the step time. A warning when D rose `duty_rise` over the "
        "baseline while the steps have been slow and unexplained",
    Cause.TELEMETRY_GAP:
        "a node of a stepping job sends no window for `silent_seconds` while the job's "
        "other nodes report (an agent writes one every second, zero when idle); or its "
        "agent's count of dropped records (agent_loss) grows; or NCCL's RAS reports a rank "
        "dead or unresponsive at its latest poll of the rank's communicator",
    Cause.UNEXPLAINED_SLOWDOWN:
        "steps `slowdown` over the baseline for `evaluation.UNEXPLAINED_AFTER_S` s of steps "
        "that the causes named explain less than `explains` of; or bad hops that the "
        "places found explain less than `place_explains` of. The finding says where the time went "
        "and keeps the evidence",
    Cause.RDMA_MISCONFIG:
        "reserved for the RDMA counters (retries, sequence errors, PFC pauses, ECN and "
        "CNPs), which the engine does not read yet",
    Cause.STAGE_IMBALANCE:
        "a pipeline's stages (ranks exchanging by Send/Recv) run in lockstep, so a stage's "
        "compute is the span every stage runs less its time inside Send and Recv; the "
        "stage that computes the most is named when its excess over the stages' mean is "
        "`detect_class.SLOW_STAGE_COST` of the span: the step time a balanced split saves. "
        "The others' time in transfers (their wait for it) is the bubble",
    Cause.ALLTOALL_SKEW:
        "an AlltoAll's size is what its rank receives, so the ranks' sums over the window "
        "are the all-to-all byte matrix's columns. An exchange ends when its most loaded "
        "receiver has its bytes, and that rank's experts compute the most tokens: an even "
        "routing saves the ranks' share of time inside AlltoAll x (1 - mean / max) of "
        "their bytes; named from `detect_class.SKEW_COST` of the step",
    Cause.LATENCY_BOUND:
        "a sharded job (AllGather/ReduceScatter carry most bytes) runs n collectives per "
        "step of s ring steps each (p - 1 for AllGather and ReduceScatter, 2 (p - 1) for "
        "AllReduce, over p ranks), and each ring step waits for its neighbour's data: n x "
        "s x half the hops' median RTT above their own baseline RTT, over the period, "
        "reaches `detect_class.LATENCY_COST` of the step, whether or not the links are busy",
    Cause.TAIL_LATENCY:
        "a job classified as inference (no backward pass, no period; or, served before, "
        "now back to back: saturated): each request is one repeat of its op sequence, its "
        "latency from the first call to the last over all ranks. The baseline is its first "
        "`detect_class.REQUESTS_BASELINE` requests at least; named when, at one of "
        "`detect_class.TAIL_QUANTILES` (median, P90, P99), the window's quantile is "
        "`detect_class.TAIL_GROWTH` above the baseline's and more requests exceed the "
        "baseline's than chance allows at `detect_class.TAIL_P` over the "
        "quantiles tested (the exact Beta-Binomial count of exceedances of an order "
        "statistic of the baseline), in `detect_class.TAIL_CLASSIFICATIONS` "
        "classifications in a row. The rank that trails the others' first call in the slow "
        "requests (by `detect_class.TAIL_RANK_SHARE` of their excess) carries the tail; "
        "else the node whose hops' RTT rose above their baseline's 90th percentile while "
        "the other hops' rose by under `detect_network.STANDS_OUT_SHARE` of it (only "
        "hops that send `detect_class.ACK_AT_ONCE_BYTES` per RTT sample: less waits on "
        "the receiver's delayed ACK, not the network); else the "
        "hop that loses the most; with none of these, only a rise of `slowdown` is named",
    Cause.BISECTION_LIMIT:
        "buffer_saturation's evidence at a ToR's uplink (its lossy hops queue, or the loss "
        "spares the steady traffic through it), in a job whose AlltoAll carries the most "
        "bytes: every rank sends to every other at once, so an uplink carries n (N - n) / "
        "(N - 1) nodes' worth of each exchange (n of the job's N nodes in its rack) where "
        "a node's port carries one. The queue is the exchange's demand across the racks, "
        "which no buffer setting removes. Its cost is the step's growth over the baseline "
        "as far as the ranks' time inside AlltoAll reaches",
}

#: the causes each cause's evidence rules out, and why
RULES_OUT = {
    Cause.LOSSY_LINK:
        "buffer_saturation: an overflowing buffer queues before it drops and spares "
        "what arrives between bursts; straggler_compute: the ranks' compute is normal",
    Cause.BUFFER_SATURATION:
        "lossy_link: a link that drops independent of load neither queues nor spares "
        "any flow through it",
    Cause.MICROBURST:
        "buffer_saturation and lossy_link: the bursts lose nothing and leave no queue",
    Cause.STRAGGLER_COMPUTE:
        "the network causes: its hops resend nothing, and a rank whose own port is a "
        "network finding's place waits on its link; input_stall: its lateness is "
        "counted without its storage I/O",
    Cause.STRAGGLER_NETWORK:
        "straggler_compute: a rank late to compute answers late too, so delay on its "
        "hops proves nothing; input_stall: ranks that wait on reads reach the "
        "collectives apart, which stretches grad sync without a slow link",
    Cause.INPUT_STALL:
        "the network causes: grad sync grew less than data loading; straggler_compute: "
        "every rank reads slowly alike",
    Cause.JITTER_ACCUMULATION:
        "a named fault: the trend is not raised while one explains the job's state, and "
        "starts over after it; a job merely slow, whose spread stays its own",
    Cause.NETWORK_BOUND:
        "compute: most of the step is spent inside the collectives",
    Cause.TELEMETRY_GAP:
        "silence read as health: no finding must never mean no data",
    Cause.UNEXPLAINED_SLOWDOWN: "-",
    Cause.RDMA_MISCONFIG: "-",
    Cause.STAGE_IMBALANCE:
        "a slow link between two stages: it lengthens their transfers and leaves their "
        "compute equal (the stages read as balanced with a larger bubble, and the "
        "network causes place the link)",
    Cause.ALLTOALL_SKEW:
        "a slow link or rank: routing skew shows in the bytes each rank receives, which "
        "neither changes",
    Cause.LATENCY_BOUND:
        "network_bound: the cost is round trips per collective, not bytes; it holds with "
        "the links idle",
    Cause.TAIL_LATENCY:
        "the period-based causes: a server has no step, so none of them is judged on it",
    Cause.BISECTION_LIMIT:
        "buffer_saturation at the uplink: the bursts that overflow it are the all-to-all's "
        "cross-rack share, not a ring's; lossy_link: the lossy hops queue",
}

#: causes a fault of the fabric is named by, found by tomography over the hops
NETWORK_CAUSES = frozenset({Cause.LOSSY_LINK, Cause.BUFFER_SATURATION, Cause.STRAGGLER_NETWORK,
                            Cause.BISECTION_LIMIT})
#: causes read from the ranks' steps
STEP_CAUSES = frozenset({Cause.STRAGGLER_COMPUTE, Cause.INPUT_STALL,
                         Cause.UNEXPLAINED_SLOWDOWN, Cause.NETWORK_BOUND,
                         Cause.JITTER_ACCUMULATION})
#: causes read from the job's class and its model (diagnosis/detect_class.py)
CLASS_CAUSES = frozenset({Cause.STAGE_IMBALANCE, Cause.ALLTOALL_SKEW, Cause.LATENCY_BOUND,
                          Cause.TAIL_LATENCY, Cause.BISECTION_LIMIT})
#: causes that explain where a slow job's time went: each prices the time it adds to a
#: step against the job's own baseline (latency_bound: the hops' RTT above theirs)
EXPLAINING_CAUSES = NETWORK_CAUSES | {Cause.STRAGGLER_COMPUTE, Cause.INPUT_STALL,
                                      Cause.LATENCY_BOUND}


class Severity(enum.StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


SEVERITIES = tuple(s.value for s in Severity)


def severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity)
