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


#: what each cause means (docs/DIAGNOSIS.md has the evidence and thresholds of each)
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
}

#: causes a fault of the fabric is named by, found by tomography over the hops
NETWORK_CAUSES = frozenset({Cause.LOSSY_LINK, Cause.BUFFER_SATURATION, Cause.STRAGGLER_NETWORK})
#: causes read from the ranks' steps
STEP_CAUSES = frozenset({Cause.STRAGGLER_COMPUTE, Cause.INPUT_STALL,
                         Cause.UNEXPLAINED_SLOWDOWN, Cause.NETWORK_BOUND,
                         Cause.JITTER_ACCUMULATION})
#: causes that explain where a slow job's time went
EXPLAINING_CAUSES = NETWORK_CAUSES | {Cause.STRAGGLER_COMPUTE, Cause.INPUT_STALL}


class Severity(enum.StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


SEVERITIES = tuple(s.value for s in Severity)


def severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity)
