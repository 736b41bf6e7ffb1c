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


_RULES = {Cause.LOSSY_LINK: _lossy, Cause.BUFFER_SATURATION: _saturation,
          Cause.STRAGGLER_NETWORK: _slow_link, Cause.STRAGGLER_COMPUTE: _straggler,
          Cause.INPUT_STALL: _input, Cause.NETWORK_BOUND: _bound,
          Cause.JITTER_ACCUMULATION: _jitter, Cause.TELEMETRY_GAP: _gap}
