"""Measurements of the gloo probe (agent/probes/gloo/probe.py, bpf/gloo.bpf.c): PyTorch's
CPU collectives, the training steps and phases inferred from them, and the job's
traffic model (fabricscope/trafficmodel.py).

Sizes and bandwidths follow fabricscope.busbw (nccl-tests conventions). Unlike
NCCL's, gloo's times are EXECUTION windows: gloo::<op>() runs the whole
collective on the calling (ProcessGroupGloo worker) thread and returns when done.
"""

from fabricscope.measurements import JOB_TAGS as _JOB_TAGS
from fabricscope.measurements import POD_TAGS as _POD_TAGS
from fabricscope.schema import Field, Measurement

_SOURCE = "agent probe gloo (bpf/gloo.bpf.c, uprobes on libtorch_cpu.so)"

MEASUREMENTS = [
    Measurement(
        name="gloo_collective",
        doc="One gloo collective executed by one thread of a training process, from entry "
            "to return of gloo::<op>() (time = entry); or one point-to-point Send or Recv, "
            "from ProcessGroupGloo::send/recv to the return of its work's wait() (a "
            "blocking recv: waiting for the peer, then the transfer).",
        source=_SOURCE,
        optional_tags=frozenset(_POD_TAGS),
        tags={**_JOB_TAGS,
              "op": "AllReduce, Broadcast, AllGather, AllGatherv, Reduce, Gather, Scatter, "
                    "AlltoAll, AlltoAllv, Barrier, Send or Recv"},
        fields={
            "seconds": Field(float, "s", "execution time, entry to return"),
            "bytes": Field(int, "B", "message size S (nccl-tests convention); when known"),
            "bytes_source": Field(str, "", "where S comes from: `options` (the options "
                                  "object, cross-checked), `transfers` (sent bytes / "
                                  "bus factor; with gloo_buffer_hooks), `buffer` (Send, "
                                  "Recv: the size of the buffer posted) or `unknown`"),
            "peer": Field(int, "rank", "Send, Recv: the peer's rank in the process group"),
            "nranks": Field(int, "ranks", "ranks in the communicator; when known"),
            "comm_rank": Field(int, "rank", "this process's rank in the communicator"),
            "sent_bytes": Field(int, "B", "payload handed to gloo's transport "
                                "(UnboundBuffer::send) by this collective; only with "
                                "gloo_buffer_hooks"),
            "recv_bytes": Field(int, "B", "payload posted for receipt (UnboundBuffer::recv); "
                                "only with gloo_buffer_hooks"),
            "sends": Field(int, "", "send calls (segments) of this collective; only with "
                           "gloo_buffer_hooks"),
            "algbw_gbs": Field(float, "GB/s", "S / seconds (1e9 bytes)"),
            "busbw_gbs": Field(float, "GB/s", "algbw x bus factor of the op"),
            "ring_bytes": Field(int, "B", "bytes a rank sends in the ring model (S x bus "
                                "factor; AllReduce 2S(n-1)/n)"),
            "wire_efficiency": Field(float, "", "ring_bytes / sent_bytes: 1 when the rank "
                                     "sent exactly the ring model, < 1 when it sent more; "
                                     "only with gloo_buffer_hooks"),
            "pid": Field(int, "", "process id"),
            "tid": Field(int, "", "thread id"),
            "retransmits": Field(int, "events", "TCP retransmits of this process stamped "
                                 "inside the window (agent/training_join.py; absent when no "
                                 "tcp probe runs; collectives on two gloo threads overlap, "
                                 "so sum gloo_step, not these)"),
            "retrans_segs": Field(int, "segments", "their segments"),
        },
    ),
    Measurement(
        name="gloo_step",
        doc="One training step inferred from the gradient AllReduce windows of a process "
            "(no markers needed; see agent/probes/gloo/steps.py): the AllReduce calls "
            "that together carry the gradient bytes once (time = first AllReduce entry).",
        source=_SOURCE,
        optional_tags=frozenset(_POD_TAGS),
        tags=dict(_JOB_TAGS),
        fields={
            "step": Field(int, "", "index among the steps this agent inferred (0 = first seen)"),
            "seconds": Field(float, "s", "to the next step's first AllReduce (absent for "
                             "the last step of a process)"),
            "sync_seconds": Field(float, "s", "time with a gradient AllReduce in flight"),
            "compute_seconds": Field(float, "s", "seconds - sync_seconds"),
            "comm_fraction": Field(float, "", "sync_seconds / seconds"),
            "buckets": Field(int, "", "AllReduce calls (DDP gradient buckets)"),
            "bytes": Field(int, "B", "sum of their S: the gradient bytes"),
            "sent_bytes": Field(int, "B", "payload this rank handed to the transport; only "
                                "with gloo_buffer_hooks"),
            "busbw_gbs": Field(float, "GB/s", "AllReduce bus bandwidth over sync_seconds"),
            "wire_efficiency": Field(float, "", "ring-model bytes / sent_bytes; only with "
                                     "gloo_buffer_hooks"),
            "retransmits": Field(int, "events", "TCP retransmits of this process stamped "
                                 "inside the step (agent/training_join.py; absent when no "
                                 "tcp probe runs, and on a process's last step, which has "
                                 "no length)"),
            "retrans_segs": Field(int, "segments", "their segments"),
            "sync_retrans_segs": Field(int, "segments", "of which inside the step's "
                                       "collective windows (gradient sync)"),
            "throttled_seconds": Field(float, "s", "time the process's CPU cgroup was "
                                       "throttled by its CFS quota during the step, summed "
                                       "over the CPUs it ran on (cpu.stat, sampled every "
                                       "poll and interpolated; absent where the cgroup "
                                       "cannot be read)"),
            "cpu_limit": Field(float, "CPUs", "that cgroup's quota at the step's end "
                               "(cpu.max or cpu.cfs_quota_us / period; absent when "
                               "unlimited)"),
            "cpu_limit_held": Field(bool, "", "that quota was the same at every sample "
                                    "of the cgroup from the step's start to its end "
                                    "(false: it changed during the step; absent with "
                                    "cpu_limit)"),
        },
    ),
    Measurement(
        name="gloo_progress",
        doc="The training step a process is in now, written at every poll of the agent "
            "until the step ends (time = the step's first AllReduce entry, as its gloo_step "
            "will have; each poll's point replaces the last, so the store keeps the "
            "latest): a rank that computes far longer than its peers is late to the next "
            "collective, and the diagnosis names it before that step ends. Every value is "
            "so far, a lower bound of the step's own.",
        source=_SOURCE,
        optional_tags=frozenset(_POD_TAGS),
        tags=dict(_JOB_TAGS),
        fields={
            "step": Field(int, "", "the index the step will have (gloo_step step)"),
            "seconds": Field(float, "s", "from the step's start to the poll"),
            "sync_seconds": Field(float, "s", "time with a gradient AllReduce in flight so "
                                  "far"),
            "compute_seconds": Field(float, "s", "seconds - sync_seconds: computing outside "
                                     "the collectives so far"),
            "waiting": Field(bool, "", "a gradient AllReduce is in flight at the poll (the "
                             "rank is inside a collective, waiting for its peers or moving "
                             "data)"),
            "throttled_seconds": Field(float, "s", "time the process's CPU cgroup was "
                                       "throttled since the step's start (as gloo_step's; "
                                       "absent where the cgroup cannot be read)"),
        },
    ),
    Measurement(
        name="gloo_phase",
        doc="A training phase. From collective windows: param_broadcast (the collectives "
            "before the first AllReduce: DDP's parameter broadcast and checks), grad_sync "
            "(AllReduce in flight, per step), compute (the rest of a step). From the "
            "process's TCP transfers outside its collective windows (agent/training_join.py): "
            "data_load (a transfer that mostly received: dataset reads) and checkpoint (one "
            "that mostly sent), one record per transfer.",
        source=_SOURCE + "; data_load and checkpoint: agent/training_join.py over tcp_transfer",
        optional_tags=frozenset(_POD_TAGS),
        tags={**_JOB_TAGS, "phase": "param_broadcast, grad_sync, compute, data_load or "
                                    "checkpoint"},
        fields={
            "seconds": Field(float, "s", "duration (grad_sync: union of the windows; "
                                         "data_load, checkpoint: the transfer's)"),
            "bytes": Field(int, "B", "message bytes of the phase's collectives; data_load, "
                                     "checkpoint: bytes_in + bytes_out"),
            "collectives": Field(int, "", "collectives in the phase"),
            "step": Field(int, "", "inferred step index; -1 before the first step (steps run "
                                   "from one first AllReduce to the next, so data loaded "
                                   "for step n is in step n - 1)"),
            "bytes_in": Field(int, "B", "data_load, checkpoint: payload received"),
            "bytes_out": Field(int, "B", "data_load, checkpoint: bytes the peer acknowledged"),
            "peer": Field(str, "", "data_load, checkpoint: the remote address:port"),
            "pid": Field(int, "", "data_load, checkpoint: the process that moved the bytes"),
        },
    ),
    Measurement(
        name="traffic_model",
        doc="The job's traffic as a square wave (fabricscope/trafficmodel.py), per training "
            "process every gloo_model_interval_s over its last gloo_model_window_s (time = "
            "end of the window); written by default, no buffer hooks needed. T from the "
            "autocorrelation and onsets of the process's collective bytes in 1 ms bins, D "
            "from its collective windows, B from the nic probe's busiest received bins "
            "inside those windows.",
        source=_SOURCE + "; B: agent probe nic (agent/probes/nic/history.py)",
        optional_tags=frozenset(_POD_TAGS),
        tags={**_JOB_TAGS,
              "series": "what T is fitted to: gloo_sent (payload sent, with gloo_buffer_hooks), "
                        "gloo_ring (the ring model's bytes per rank from the message sizes) "
                        "or gloo_windows (time in collectives: no size known)"},
        fields={
            "period_s": Field(float, "s", "sync period T: the mean time between burst "
                              "onsets (one per step) over the window, the mean step time; "
                              "absent when the autocorrelation finds no period"),
            "acf_peak": Field(float, "", "autocorrelation at T (0..1): regularity"),
            "burst_bytes_per_s": Field(float, "B/s",
                                       "burst bandwidth B: the median over the collective "
                                       "windows of each one's busiest received nic_bin_us bin "
                                       "(bytes / bin length), on burst_interface; absent "
                                       "where no nic probe runs or its bins miss the windows"),
            "burst_interface": Field(str, "", "the interface B was read on: the one that "
                                     "received the most bytes inside the windows"),
            "burst_windows": Field(int, "", "collective windows (merged where they overlap) "
                                   "with traffic that B is the median over"),
            "burst_util": Field(float, "fraction", "B / the interface's line rate; absent "
                                "where it has none (nic_window link_speed_source)"),
            "duty_cycle": Field(float, "", "D: time with a collective in flight / time "
                                "(comm time / T)"),
            "mean_bytes_per_s": Field(float, "B/s", "mean of the series over the window "
                                      "(absent for gloo_windows)"),
            "window_s": Field(float, "s", "length of the series"),
            "network_bound": Field(bool, "", "D > 0.5: communication dominates the step"),
        },
    ),
]
