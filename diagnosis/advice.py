"""What to change, chosen by each finding's evidence (never a fixed list).

Each rule reads the candidate's cause, place and facts and returns the knobs
that address what the evidence shows: a lossy port is hardware (and RTO
stalls make TCP's minimum RTO worth lowering); a queue that overflows wants
marking before it drops, pacing, or smaller synchronized bursts; a slow rank
wants its host looked at or the rank moved; a slow input wants more reads in
flight ahead of the step. NCCL knobs are named for jobs on NCCL (their env
vars mean nothing to gloo), DDP's for every PyTorch job.
"""

from __future__ import annotations

import math

from fabricscope.diagnosis.candidate import Candidate
from fabricscope.diagnosis.causes import Cause
from fabricscope.diagnosis.finding import Advice


def advise(c: Candidate, backend: str = "gloo") -> list[Advice]:
    rule = _RULES.get(c.cause)
    return rule(c, backend) if rule else []


def _where(c: Candidate) -> str:
    p = c.place
    if p.get("tor"):
        return f"{p['tor']}'s uplinks"
    return f"the switch port of {p.get('node') or 'the node'}"


def _lossy(c: Candidate, backend: str) -> list[Advice]:
    f = c.facts
    out = [Advice(f"physical link at {_where(c)}",
                  "check the port's error counters (FCS/CRC, symbol errors) and reseat or "
                  "replace the optic or cable",
                  f"{f.get('loss_ratio', 0):.2%} of the payload resent with the RTT at its "
                  "floor: frames die independent of load, which congestion never does")]
    if f.get("timeouts"):
        out.append(Advice("TCP minimum RTO on the training fabric",
                          "ip route change <fabric subnet> dev <nic> rto_min 5ms (or sysctl "
                          "net.ipv4.tcp_rto_min_us=5000 on kernels that have it)",
                          f"{f['timeouts']} retransmission timeouts, each stalling its ring "
                          "hop for at least 200 ms (Linux's default minimum)"))
    if c.severity == "critical" and c.place.get("node"):
        out.append(Advice("scheduling", f"drain {c.place['node']} and restart the job without "
                          "it until the link is fixed",
                          f"the link costs {c.share_of_step:.0%} of every step"))
    if backend == "nccl":
        out.append(Advice("NCCL_IB_RETRY_CNT / NCCL_IB_TIMEOUT", "keep 7 / 20 (defaults); "
                          "do not raise them to hide loss",
                          "retries mask a bad link while the collectives keep paying for it"))
    return out


def _saturation(c: Candidate, backend: str) -> list[Advice]:
    f = c.facts
    rate = f.get("bytes_per_s", 0.0) * 8
    out = [Advice(f"ECN marking at {_where(c)}",
                  "mark CE at 20-30 % of the queue's buffer (before it drops), and "
                  "net.ipv4.tcp_ecn=1 on the nodes",
                  f"the RTT rose to {f.get('rtt_p50_us') or 0:.0f} us (floor "
                  f"{f.get('rtt_floor_us') or 0:.0f} us) before {f.get('loss_ratio', 0):.2%} "
                  "was dropped: a full queue, no early signal"),
               Advice("DDP bucket_cap_mb", "25 -> 10",
                      "smaller gradient buckets make the synchronized bursts that fill the "
                      "queue smaller and spread them over backward")]
    if rate > 0:
        out.append(Advice("sender pacing", f"tc qdisc replace dev <nic> root fq maxrate "
                          f"{max(1, int(rate / 1e6))}mbit on the senders through {_where(c)}",
                          "pace to what the bottleneck delivered rather than burst into its "
                          "buffer"))
    if f.get("place_kind") == "tor":
        out.append(Advice(f"capacity of {_where(c)}", "add uplink bandwidth or spread the "
                          "job's ranks so fewer ring hops cross the ToR",
                          "every hop crossing the uplink queues; the hops inside the rack "
                          "do not"))
    if backend == "nccl":
        out.append(Advice("NCCL_IB_TC / NCCL_IB_SL", "the lossless (PFC) traffic class",
                          "RoCE needs the queue to pause, not drop"))
    return out


def _slow_link(c: Candidate, backend: str) -> list[Advice]:
    node = c.place.get("node") or "the node"
    out = [Advice(f"link speed of {node}", "ethtool <nic>: check the negotiated speed and "
                  "duplex; check for a shaper on the port", "its hops' RTT is inflated "
                  "without loss while the ring waits for it")]
    if backend == "nccl":
        out.append(Advice("NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD", "4 x 4 (<= 64)",
                          "more connections per hop fill a long, slow pipe"))
    return out


def _straggler(c: Candidate, backend: str) -> list[Advice]:
    node, rank = c.place.get("node") or "its node", c.place.get("rank") or "?"
    late, throttled = c.facts.get("late_s", 0.0), c.facts.get("throttled_s")
    limit = c.facts.get("limit_cpus")
    out = []
    if throttled is not None:
        now = f" ({limit:.2f} CPU now)" if limit is not None else ""
        out += [Advice(f"CPU limit of rank {rank}",
                       f"raise it{now}, or drop the limit and keep the request (Kubernetes "
                       "resources.limits.cpu; cgroup cpu.max / cpu.cfs_quota_us)",
                       f"its cgroup was throttled {throttled:.3f} s of each step: the quota "
                       "runs out early in each 100 ms period and the rank waits for the next")]
        if limit is not None:
            out.append(Advice("OMP_NUM_THREADS / torch.set_num_threads",
                              f"at most {max(1, math.floor(limit))} on rank {rank}",
                              "threads beyond the limit's CPUs use up the quota together "
                              "and then all wait"))
    else:
        out.append(Advice(f"host of rank {rank}",
                          f"on {node}: check CPU throttling (cgroup cpu.stat nr_throttled, "
                          "CPU quota), thermal or power capping, another job on its "
                          "GPUs/CPUs",
                          f"rank {rank} is {late:.3f} s late to each step with a clean "
                          "network"))
    return out + [
        Advice("CPU/GPU-NIC binding", "pin the rank to the cores and GPU local to its "
               "NIC (numactl --cpunodebind / CUDA_VISIBLE_DEVICES matching the NIC's NUMA "
               "node)", "a rank on the far socket computes and copies slower"),
        Advice("scheduling", f"move rank {rank} off {node} if it stays slow",
               "one slow rank sets the pace of the whole ring")]


def _input(c: Candidate, backend: str) -> list[Advice]:
    f = c.facts
    load, step = f.get("load_s", 0.0), f.get("step_s", 0.0) or 1.0
    ahead = max(2, int(load / step) + 2)
    return [Advice("DataLoader num_workers / prefetch_factor",
                   f"raise them so {ahead} batches are in flight ahead of the step",
                   f"a batch takes {load:.2f} s to load against a {step:.2f} s step: reads "
                   "must overlap compute"),
            Advice("storage path", f"read the dataset from a closer or faster store than "
                   f"{f.get('peer') or 'the current one'} (local NVMe cache, more shards "
                   "in parallel)", "the storage's throughput, not the fabric, limits the "
                   "steps")]


def _bound(c: Candidate, backend: str) -> list[Advice]:
    return [Advice("DDP bucket_cap_mb and overlap", "keep buckets small enough to overlap "
                   "backward (25 MB default); consider gradient compression or a larger "
                   "batch per step", f"communication takes {c.facts.get('duty', 0):.0%} of "
                   "every step: capacity planning should give this job more bandwidth per "
                   "GPU")]


def _jitter(c: Candidate, backend: str) -> list[Advice]:
    hop = c.facts.get("hop")
    return [Advice(f"hop {hop}" if hop else "the job's hops", "look at the hop's queueing "
                   "over time (Grafana Fabric board: RTT percentiles, drops); pin the ranks "
                   "to reduce noisy neighbours", "the step-time spread grows against the "
                   "job's own baseline")]


def _gap(c: Candidate, backend: str) -> list[Advice]:
    node = c.place.get("node") or "the node"
    return [Advice(f"agent on {node}", "check its pod/process and its connection to the "
                   "collector (fabricscope_agent_collector_connected, its log)",
                   "without its telemetry no finding can be placed on that node")]


def _stage(c: Candidate, backend: str) -> list[Advice]:
    f = c.facts
    rank, ratio = f.get("slow_rank"), f.get("compute_ratio")
    times = f" ({ratio:.1f}x the others)" if ratio else ""
    return [Advice("pipeline partition (layers per stage)",
                   f"move layers off stage rank {rank} to its neighbours until the stages' "
                   "compute is even (torch.distributed.pipelining split points, Megatron "
                   "--decoder-first/last-pipeline-num-layers)",
                   f"stage rank {rank} computes the most{times}; a balanced split saves "
                   f"{f.get('cost', 0):.0%} of its time"),
            Advice("micro-batches per step", "raise them (at least 4 x the stages) or use an "
                   "interleaved schedule (1F1B interleaved, virtual stages)",
                   f"the bubble is {f.get('bubble', 0):.0%} of the stages' time: more, "
                   "smaller micro-batches keep the stages busy while they wait")]


def _skew(c: Candidate, backend: str) -> list[Advice]:
    f = c.facts
    rank = f.get("hot_rank")
    return [Advice("MoE capacity factor and load-balancing loss",
                   "cap each expert's tokens (capacity_factor 1.0-1.25) and raise the "
                   "auxiliary load-balancing loss coefficient",
                   f"rank {rank} receives {f.get('hot_share', 0):.0%} of the all-to-all bytes, "
                   f"{f.get('imbalance', 0):.1f}x an even share: its experts are hot"),
            Advice("expert placement", f"spread the hot experts of rank {rank} over ranks (or "
                   "replicate them) so every rank receives a similar share",
                   "an exchange lasts as long as its most loaded receiver"),
            Advice("topology-aware expert grouping", "place experts that exchange most inside "
                   "one node or ToR (hierarchical all-to-all: NCCL's PXN, "
                   "NCCL_P2P_NET_CHUNKSIZE on NCCL)" if backend == "nccl" else
                   "place experts that exchange most inside one node or ToR",
                   "all-to-all bytes that stay under one switch do not cross the uplinks")]


def _latency(c: Candidate, backend: str) -> list[Advice]:
    f = c.facts
    n, extra = f.get("per_step", 0), f.get("extra_rtt_us", 0)
    out = [Advice("FSDP/ZeRO prefetch and bucket sizes",
                  "forward_prefetch and backward_prefetch=BACKWARD_PRE (FSDP), or a larger "
                  "reduce_bucket_size / allgather_bucket_size (DeepSpeed)",
                  f"{n:.0f} collectives per step each pay {extra / 1e3:.2f} ms of extra RTT: "
                  "fewer, larger, overlapped collectives pay it fewer times"),
           Advice("ZeRO stage / sharding strategy", "ZeRO-2 or FSDP SHARD_GRAD_OP (or "
                  "HYBRID_SHARD across nodes) where the memory allows",
                  "ZeRO-3 gathers every layer's parameters twice per step: the calls that "
                  "pay the round trips")]
    if backend == "nccl":
        out.append(Advice("NCCL_ALGO / NCCL_PROTO", "Tree / LL128 (or LL) for small "
                          "messages", f"median message {f.get('p50_bytes') or 0:.0f} B: "
                          "latency, not bandwidth, sets each collective's time"))
    return out


def _tail(c: Candidate, backend: str) -> list[Advice]:
    f = c.facts
    rank = f.get("tail_rank")
    where = f"rank {rank}'s host (CPU limits, a noisy neighbour, its GPU)" if rank is not None \
        else "the hops the finding names (their loss and queueing)"
    return [Advice(where, "look at it first; move the rank if it stays slow",
                   f"{f.get('over', 0)} of {f.get('requests', 0)} requests exceed the "
                   f"baseline P99 ({f.get('base_p99_s', 0) * 1e3:.1f} ms)"),
            Advice("request batching and admission", "cap the batch wait and shed or queue "
                   "load above the rate the baseline served",
                   f"at {f.get('rate') or 0:.1f} requests/s a slower request delays the "
                   "ones that arrive behind it")]


def _bisection(c: Candidate, backend: str) -> list[Advice]:
    f = c.facts
    tor, n, total = c.place.get("tor") or "the ToR", f.get("rack_nodes", 0), f.get("nodes", 0)
    demand = f.get("demand_nodes", 0.0)
    why = (f"{f.get('cross_share', 0):.0%} of the job's bytes cross {tor}'s uplink: "
           f"{demand:.2g} nodes' worth of every exchange at once")
    return [Advice("expert-parallel group placement", "keep each expert-parallel group "
                   "inside one rack (expert parallel size at most the nodes per rack: "
                   "Megatron --expert-model-parallel-size, DeepSpeed ep_size) and replicate "
                   "the experts across racks by data parallelism", why),
            Advice("hierarchical all-to-all", "exchange inside the node and the rack first, "
                   "then one aggregated transfer per pair of racks (NCCL's PXN: keep "
                   "NCCL_PXN_DISABLE=0 and NCCL_P2P_PXN_LEVEL=2)" if backend == "nccl" else
                   "exchange inside the node and the rack first, then one aggregated "
                   "transfer per pair of racks",
                   "the bytes across racks then scale with the racks, not with every pair "
                   "of ranks"),
            Advice("MoE capacity factor", "cap the tokens per expert (capacity_factor "
                   "1.0-1.25)", "fewer tokens routed across the racks per exchange"),
            Advice("job placement", f"schedule the job on fewer racks (Kueue "
                   f"topology-aware scheduling, kueue.x-k8s.io/podset-required-topology), or "
                   f"give {tor} uplinks of {demand:.2g}x a node's link",
                   f"{n} of the job's {total} nodes sit behind {tor}")]


_RULES = {Cause.LOSSY_LINK: _lossy, Cause.BUFFER_SATURATION: _saturation,
          Cause.STRAGGLER_NETWORK: _slow_link, Cause.STRAGGLER_COMPUTE: _straggler,
          Cause.INPUT_STALL: _input, Cause.NETWORK_BOUND: _bound,
          Cause.JITTER_ACCUMULATION: _jitter, Cause.TELEMETRY_GAP: _gap,
          Cause.STAGE_IMBALANCE: _stage, Cause.ALLTOALL_SKEW: _skew,
          Cause.LATENCY_BOUND: _latency, Cause.TAIL_LATENCY: _tail,
          Cause.BISECTION_LIMIT: _bisection}
