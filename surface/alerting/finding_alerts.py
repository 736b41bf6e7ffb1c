"""Alerts on the diagnosis engine's findings: one per cause (stragglers share one).

The engine opens a finding only once its evidence has held (docs/DIAGNOSIS.md), so
these rules wait 10 s, not minutes: long enough to ride out a scrape missed while
the job's ownership moves between collector replicas, short enough that the page
follows the finding within one scrape and evaluation of it. Severity is the
finding's own, except for microburst and network_bound, which are context (info).
"""

from __future__ import annotations

from fabricscope.diagnosis.causes import Cause
from fabricscope.surface.alerting.cases import finding_cases
from fabricscope.surface.alerting.model import FROM_FINDING, Alert, Case, Expect, Rule, Runbook, board
from fabricscope.surface.alerting.promql import FindingSeries, finding_open

FOR = "10s"
GROUP = "fabricscope-findings"
EXPLAIN = ("`fabricscope explain ID` (ID: the alert's `id` label): the evidence, the causes "
           "it ruled out and the advice.")
DIAGNOSE = ("`fabricscope diagnose --job J` (J: the alert's `job` label): the job's other "
            "open findings; one at the same place or its ToR changes the reading.")


def _on_finding(name: str, cause: str, summary: str, description: str, runbook: Runbook,
                board: str, place: FindingSeries, band: str = FROM_FINDING,
                other_cause: Cause = Cause.INPUT_STALL, extra: tuple[Case, ...] = ()) -> Alert:
    fixed = None if band == FROM_FINDING else band
    return Alert(name, GROUP, summary, description,
                 rules=(Rule(finding_open(cause), FOR, band),), runbook=runbook, board=board,
                 cases=finding_cases(place, FOR, band=fixed, other_cause=other_cause) + extra,
                 causes=(cause,))


def _on_two_findings(name: str, summary: str, description: str, runbook: Runbook,
                     board: str, first: FindingSeries, second: FindingSeries) -> Alert:
    """One alert for two causes of one kind (a late rank, an uneven split): each finding's
    severity passes through; the first cause's four cases and the second's first."""
    causes = (Cause(first.cause), Cause(second.cause))
    return Alert(name, GROUP, summary, description,
                 rules=(Rule(finding_open(*causes), FOR, FROM_FINDING),), runbook=runbook,
                 board=board, cases=finding_cases(first, FOR) + finding_cases(second, FOR)[:1],
                 causes=causes)


_LOSSY = FindingSeries(Cause.LOSSY_LINK, "warning", node="node1", interface="eth0", tor="tor0",
                       id="a1b2c3d4e5f6")

LOSSY_LINK = _on_finding(
    "FabricscopeLossyLink", Cause.LOSSY_LINK,
    "Lossy link at {place} in job {job}",
    "The diagnosis engine found a link that drops frames independent of load at {place} "
    "(finding {id}); every collective of job {job} resends over it. "
    "Evidence: `fabricscope explain {id}`.",
    Runbook(
        "A port, optic or cable drops frames whatever the load. The engine tells it from "
        "congestion by the shape of the loss: retransmits spread evenly in time and across "
        "the flows through one endpoint, with RTT near its floor (congestion loss clusters "
        "in the bursts and inflates RTT). Every collective crosses the ring, so one bad "
        "link slows every rank; with Linux's 200 ms minimum RTO one tail loss can add "
        "200 ms to a step.",
        (EXPLAIN, DIAGNOSE,
         f"{board('topology')}: the node's port edge is red. {board('fabric')}: its "
         "retransmits go on between the bursts, not only inside them.",
         "On the node and its switch port: `ethtool -S IFACE` error counters (CRC, symbol, "
         "`rx_missed_errors`) grow while the job runs."),
        ("Reseat or replace the optic or cable of that port, or move the node to another "
         "port; drain the node if that cannot happen soon, since the whole ring waits.",
         "Until then, make each loss cheaper: `ip route change ROUTE rto_min 5ms` on the "
         "job's nodes (or the `tcp_rto_min_us` sysctl where the kernel has it)."),
    ),
    "fabric", _LOSSY,
    extra=(Case("the finding moves to another collector replica and keeps firing",
                {_LOSSY.series("collector-0"): "1x20 stale",
                 _LOSSY.series("collector-1"): "_x20 1x60"},
                at="25s", expect=(Expect(_LOSSY.labels()),)),))

BUFFER_SATURATION = _on_finding(
    "FabricscopeBufferSaturation", Cause.BUFFER_SATURATION,
    "Switch buffer overflows under job {job}'s bursts at {place}",
    "Synchronised bursts of job {job} overflow a buffer at {place} (finding {id}): loss "
    "clusters inside the bursts and RTT grows with the queue. "
    "Evidence: `fabricscope explain {id}`.",
    Runbook(
        "Training traffic is a square wave: every rank sends its gradients at the same "
        "moment. Where those bursts at line rate exceed a port's buffer (incast at a ToR, "
        "an oversubscribed uplink) frames drop inside the bursts: retransmits cluster in "
        "the hot 100 us bins, RTT rises with the queue, a shaped port's backlog and drops "
        "grow. Unlike a lossy link it depends on load: smaller or paced bursts stop it.",
        (EXPLAIN,
         "In the evidence: the place's hops lose segments and their RTT is far above the "
         "job's floor (`tcp_flow`), in seconds of peak rates (`peak_bps` of `nic_window`) "
         "at or near line rate where the link has one (`hot_bins`, `peak_util`), with qdisc "
         "drops or backlog where the queue is visible (`nic_qdisc`).",
         DIAGNOSE,
         f"{board('topology')}: the ToR or uplink edge is red. {board('fabric')}: "
         "microbursts at line rate when the retransmits happen."),
        ("Mark before dropping: enable ECN (or lower its marking threshold) on the ToR "
         "queues the job uses, with `net.ipv4.tcp_ecn=1` on the hosts; on RoCE check PFC "
         "headroom and DCQCN.",
         "Pace the senders a little below the port rate: `tc qdisc replace dev IFACE root fq "
         "maxrate RATE`.",
         "Make the bursts smaller: a smaller DDP `bucket_cap_mb` (default 25) spreads the "
         "gradient sync over the backward pass.",
         "Place the job on racks whose uplinks have headroom."),
    ),
    "fabric", FindingSeries(Cause.BUFFER_SATURATION, "critical", interface="uplink", tor="tor0",
                            id="b1b2c3d4e5f6"))

MICROBURST = _on_finding(
    "FabricscopeMicroburst", Cause.MICROBURST,
    "Microbursts without loss at {place} in job {job}",
    "Job {job} sends at line rate in short bursts at {place} without loss or queueing "
    "(finding {id}). Normal for training; delivered only next to a warning or critical "
    "alert at the same place, as context.",
    Runbook(
        "Bursts at line rate that neither drop nor queue: the normal shape of gradient "
        "synchronisation. Alertmanager holds this info alert back (FabricscopeInfoInhibitor) "
        "unless a warning or critical alert fires for the same job at the same place; "
        "there it says that the place carries line-rate bursts.",
        (EXPLAIN, DIAGNOSE + " The warning or critical alert it came with is the one to "
         "act on.",
         f"{board('fabric')}: the node's 100 us bins reach line rate in the sync "
         "phase, with no retransmits inside them."),
        ("Nothing on its own.",
         "Next to FabricscopeBufferSaturation at the same place, follow that runbook: these "
         "bursts are what overflows."),
    ),
    "fabric", FindingSeries(Cause.MICROBURST, "info", node="node1", interface="eth0", tor="tor0",
                            id="c1b2c3d4e5f6"), band="info")

NETWORK_BOUND = _on_finding(
    "FabricscopeNetworkBound", Cause.NETWORK_BOUND,
    "Job {job} is network bound",
    "Communication takes more than half of job {job}'s step (duty cycle above 0.5, "
    "finding {id}): the network, not compute, sets its pace. Delivered only next to a "
    "warning or critical alert of the job, as context.",
    Runbook(
        "The share of a step spent in collectives (duty cycle D = communication time / "
        "step time) is above 0.5: faster compute would not speed the job up, a faster or "
        "better used network would. An info alert: it is held back unless a warning or "
        "critical alert fires for the same job.",
        (EXPLAIN, DIAGNOSE,
         f"{board('job')}: grad-sync time against compute time per step."),
        ("Overlap more communication with compute: tune DDP `bucket_cap_mb` (default 25).",
         "Synchronise less often: gradient accumulation over more micro-batches.",
         "Use the links better: NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD (product <= 64) "
         "on socket transports; NCCL_IB_QPS_PER_CONNECTION and NCCL_CROSS_NIC on IB.",
         "Place the ranks closer (one ToR) so the ring avoids oversubscribed uplinks."),
    ),
    "job", FindingSeries(Cause.NETWORK_BOUND, "info", id="d1b2c3d4e5f6"), band="info")

_COMPUTE = FindingSeries(Cause.STRAGGLER_COMPUTE, "warning", node="node3", tor="tor1", rank="2",
                         id="e1b2c3d4e5f6")
_NETWORK = FindingSeries(Cause.STRAGGLER_NETWORK, "critical", node="node2", interface="eth0",
                         tor="tor0", rank="1", id="e2b2c3d4e5f6")

STRAGGLER_RANK = _on_two_findings(
    "FabricscopeStragglerRank",
    "Straggler at {place} holds back job {job} ({cause})",
    "Rank {rank} at {place} holds the whole ring of job {job} back ({cause}, finding {id}). "
    "Who waited, and how long: `fabricscope explain {id}`.",
    Runbook(
        "One rank is late and every other rank waits for it in the next collective. "
        "`straggler_compute`: the rank enters its collectives late while its network is "
        "healthy (the others' collective time grows, its own does not). "
        "`straggler_network`: the rank's link slows the ring for everyone and its own "
        "flows carry the loss or the delay.",
        (EXPLAIN + " `victims` lists the ranks that waited.",
         DIAGNOSE,
         f"{board('collectives')}: time inside AllReduce per rank; a compute "
         "straggler waits least (it arrives last), a network straggler's ring hop is the "
         "slow one."),
        ("Compute: where the finding shows the rank's CPU throttled, its CPU limit is "
         "too small for it: raise the limit (or drop it and keep the request) and keep "
         "OMP_NUM_THREADS within it. Otherwise look at the node (thermal throttling, a "
         "noisy neighbour, data loader workers on the training CPUs, another process on "
         "its GPU); pin the rank's CPUs; cordon the node and restart the job elsewhere if "
         "it stays slow.",
         "Network: follow FabricscopeLossyLink for its port; check NIC and GPU affinity "
         "(NCCL_IB_HCA) and NCCL_CROSS_NIC."),
    ),
    "collectives", _COMPUTE, _NETWORK)

INPUT_STALL = _on_finding(
    "FabricscopeInputStall", Cause.INPUT_STALL,
    "Input stall in job {job} at {place}",
    "Data loading delays the steps of job {job} at {place} (finding {id}): ranks wait for "
    "their input, not for the network of their collectives. "
    "Evidence: `fabricscope explain {id}`.",
    Runbook(
        "The data_load phases of the job's steps (the training processes' transfers "
        "outside their collectives, mostly received, e.g. from the dataset store) grew and "
        "delay the steps; the collectives did not.",
        (EXPLAIN + " The `peer` label names the store the rank reads from.",
         DIAGNOSE,
         f"{board('job')}: data-load time per step against its baseline, per "
         "rank."),
        ("More input in flight: DataLoader `num_workers` and `prefetch_factor`.",
         "Look at the store behind the peer (its load, its disks) and the path to it.",
         "Cache or stage the dataset on the nodes."),
    ),
    "job", FindingSeries(Cause.INPUT_STALL, "warning", node="node2", peer="198.18.0.254:9000",
                         rank="1", id="f1b2c3d4e5f6"), other_cause="lossy_link")

UNEXPLAINED_SLOWDOWN = _on_finding(
    "FabricscopeUnexplainedSlowdown", Cause.UNEXPLAINED_SLOWDOWN,
    "Job {job} is slower than its baseline, cause unclear",
    "The steps of job {job} are slower than the job's own baseline and no cause's evidence "
    "explains most of the lost time (finding {id}). What was seen and ruled out: "
    "`fabricscope explain {id}`.",
    Runbook(
        "The engine measures the job slower than its own first steps but no cause's "
        "evidence explains most of the lost time. It keeps the evidence it has and the "
        "causes it ruled out.",
        (EXPLAIN, DIAGNOSE,
         "`fabricscope compare --around` at the last annotation (a tuning change, a "
         "deploy; `fabricscope annotate`): what changed before and after.",
         f"{board('job')}: which phase of the step grew."),
        ("Undo the last change to the job or the fabric if the slowdown started with it.",
         "Look where fabricscope cannot: GPU kernels, the model code, the framework "
         "version."),
    ),
    "job", FindingSeries(Cause.UNEXPLAINED_SLOWDOWN, "warning", id="a9b2c3d4e5f6"))

_STAGE = FindingSeries(Cause.STAGE_IMBALANCE, "warning", node="node2", tor="tor0", rank="1",
                       id="b7b2c3d4e5f6")
_SKEW = FindingSeries(Cause.ALLTOALL_SKEW, "critical", node="node1", tor="tor0", rank="0",
                      id="b8b2c3d4e5f6")

WORKLOAD_IMBALANCE = _on_two_findings(
    "FabricscopeWorkloadImbalance",
    "Uneven split of job {job}'s work at {place} ({cause})",
    "Rank {rank} at {place} does more of job {job}'s work than the others and they wait "
    "for it ({cause}, finding {id}). What an even split saves: `fabricscope explain {id}`.",
    Runbook(
        "The job's model is split unevenly over its ranks. `stage_imbalance`: one pipeline "
        "stage computes more than the others, which wait for it inside their Send and Recv "
        "(the bubble). `alltoall_skew`: a mixture-of-experts job routes most tokens to the "
        "experts of a few ranks; each all-to-all lasts as long as its most loaded "
        "receiver takes.",
        (EXPLAIN + " `victims` lists the stages that waited; the evidence gives each "
         "rank's share of the all-to-all bytes.",
         DIAGNOSE + " The class line above the findings shows the job's stages or its "
         "all-to-all matrix.",
         f"{board('collectives')}: time inside Send/Recv or AlltoAll per rank."),
        ("Pipeline: move layers off the slow stage until the stages compute evenly; use "
         "more micro-batches or an interleaved schedule to shrink the bubble.",
         "MoE: cap expert capacity (capacity_factor), raise the load-balancing loss, spread "
         "or replicate the hot experts; group experts that exchange most under one ToR."),
    ),
    "collectives", _STAGE, _SKEW)

LATENCY_BOUND = _on_finding(
    "FabricscopeLatencyBound", Cause.LATENCY_BOUND,
    "Job {job}'s collectives are latency-bound",
    "Job {job} runs many small collectives per step and each pays extra round-trip time "
    "(finding {id}): the added RTT costs a tenth of the step or more, whether or not the "
    "links are busy. Evidence: `fabricscope explain {id}`.",
    Runbook(
        "A sharded job (ZeRO-3, FSDP) gathers each layer's parameters and scatters its "
        "gradients: hundreds of small collectives per step, each paying a round trip per "
        "ring step. The hops' RTT rose over their baseline, and n collectives x that "
        "extra RTT is a tenth of the step or more.",
        (EXPLAIN, DIAGNOSE + " A network finding at the same time is where the RTT rose.",
         f"{board('fabric')}: RTT percentiles of the job's hops."),
        ("Fewer, larger, overlapped collectives: FSDP forward/backward prefetch, larger "
         "DeepSpeed allgather/reduce bucket sizes.",
         "A lighter sharding: ZeRO-2, FSDP SHARD_GRAD_OP or HYBRID_SHARD across nodes.",
         "On NCCL: NCCL_ALGO=Tree and NCCL_PROTO=LL128 (or LL) for small messages."),
    ),
    "job", FindingSeries(Cause.LATENCY_BOUND, "warning", id="b9b2c3d4e5f6"))

TAIL_LATENCY = _on_finding(
    "FabricscopeTailLatency", Cause.TAIL_LATENCY,
    "Served model {job}'s P99 latency regressed; the tail is at {place}",
    "The P99 request latency of job {job} rose against its own first requests, beyond "
    "chance (finding {id}); {place} is the rank or hop that carries the tail. "
    "Evidence: `fabricscope explain {id}`.",
    Runbook(
        "An inference job (no backward pass, requests at random) serves each request "
        "with the same exchanges. Its requests' P99 latency rose a tenth or more over the "
        "job's baseline (its first requests), and more requests exceed the old P99 than "
        "chance allows. The rank whose first call trails the others in the slow requests "
        "carries the tail; with none late, the hop that loses or queues the most does.",
        (EXPLAIN, DIAGNOSE,
         f"{board('collectives')}: the ranks' time inside their exchanges."),
        ("A late rank: look at its host (CPU limit, noisy neighbour, its GPU); move it.",
         "A hop: follow the network finding at its place (FabricscopeLossyLink, "
         "FabricscopeBufferSaturation).",
         "Cap the batch wait and admit no more than the rate the baseline served."),
    ),
    "job", FindingSeries(Cause.TAIL_LATENCY, "warning", node="node2", rank="1",
                         id="c9b2c3d4e5f6"))

BISECTION_LIMIT = _on_finding(
    "FabricscopeBisectionLimit", Cause.BISECTION_LIMIT,
    "Job {job}'s all-to-all needs more than {place} carries",
    "The all-to-all of MoE job {job} sends more across {place} than it carries, and its "
    "queue overflows at every exchange (finding {id}): the job's placement needs more "
    "bandwidth between its racks. Evidence: `fabricscope explain {id}`.",
    Runbook(
        "In an all-to-all every rank sends to every other at once, so the n of a job's N "
        "nodes behind one ToR send n (N - n) / (N - 1) nodes' worth of each exchange "
        "through its uplink, where a node's port carries one. An uplink with less than "
        "that queues and drops at every exchange (the evidence of buffer_saturation), "
        "and the job's AlltoAll carries most of its bytes: the demand across the racks, "
        "not the buffer, is the cause.",
        (EXPLAIN + " The evidence gives the share of the job's bytes across the uplink "
         "and the nodes' worth of each exchange it must carry.",
         DIAGNOSE + " The class line shows the job as moe_alltoall.",
         f"{board('topology')}: the uplink edge is red. {board('collectives')}: the "
         "ranks' time inside AlltoAll."),
        ("Keep each expert-parallel group inside one rack (expert parallel size at most "
         "the nodes per rack) and replicate the experts across racks.",
         "Use a hierarchical all-to-all: inside the node and the rack first, one "
         "aggregated transfer per pair of racks (NCCL's PXN on NCCL jobs).",
         "Schedule the job on fewer racks (Kueue topology-aware scheduling), or give the "
         "rack uplinks of n (N - n) / (N - 1) times a node's link.",
         "Cap the tokens per expert (capacity_factor 1.0-1.25)."),
    ),
    "topology", FindingSeries(Cause.BISECTION_LIMIT, "critical", interface="uplink", tor="tor1",
                              id="d2b2c3d4e5f6"))

FINDING_ALERTS = (LOSSY_LINK, BUFFER_SATURATION, MICROBURST, NETWORK_BOUND, STRAGGLER_RANK,
                  INPUT_STALL, UNEXPLAINED_SLOWDOWN, WORKLOAD_IMBALANCE, LATENCY_BOUND,
                  TAIL_LATENCY, BISECTION_LIMIT)
