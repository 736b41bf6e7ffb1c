"""Measurements of NCCL's own timing evidence: fabricscope's profiler plugin rings (probe
ncclprof, agent/probes/ncclprof/), NCCL Inspector's dumps (source nccl_inspector,
agent/sources/nccl_inspector.py) and the training steps inferred from NCCL calls (probe
nccl, agent/probes/nccl/steps.py).

Unlike nccl_call (enqueue times), the profiler's and Inspector's collective times are
EXECUTION times: the kernel's start and end on the GPU (GPU globaltimer) where NCCL
gives them.
"""

from fabricscope.measurements import JOB_TAGS as _JOB_TAGS
from fabricscope.measurements import POD_TAGS as _POD_TAGS
from fabricscope.schema import Field, Measurement

_PROF = "agent probe ncclprof (profiler/ plugin rings, agent/probes/ncclprof/)"
_INSPECTOR = "agent source nccl_inspector (NCCL Inspector JSON dumps, NCCL >= 2.28)"
_STEPS = "agent probe nccl (steps from the calls' repeating pattern, agent/probes/nccl/steps.py)"
_COMM = "NCCL communicator hash (hex, as NCCL logs it; the same on every rank)"

MEASUREMENTS = [
    Measurement(
        name="ncclprof_collective",
        doc="One collective or point-to-point task of a training process as the profiler "
            "plugin closed it (time = host enqueue start). Kernel times are the GPU's "
            "execution window over the task's channels.",
        source=_PROF,
        optional_tags=frozenset({*_POD_TAGS, "algo", "proto"}),
        tags={**_JOB_TAGS,
              "op": "AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, AlltoAll, "
                    "Gather, Scatter, Send, Recv, SendRecv or Unknown",
              "kind": "coll (a collective) or p2p (a send or receive task)",
              "algo": "algorithm NCCL chose (RING, TREE, NVLS, PAT, ...; collectives)",
              "proto": "protocol NCCL chose (LL, LL128, SIMPLE; collectives)",
              "comm": _COMM},
        fields={
            "seq": Field(int, "", "NCCL's sequence number of the operation on the "
                                  "communicator, per function"),
            "comm_rank": Field(int, "rank", "this process's rank in the communicator"),
            "peer": Field(int, "rank", "root (rooted collectives) or peer (p2p); -1 none"),
            "count": Field(int, "elements", "count argument"),
            "bytes": Field(int, "B", "count x element size"),
            "datatype": Field(str, "", "element type (ncclFloat32, ncclBfloat16, ...)"),
            "nchannels": Field(int, "", "channels NCCL used"),
            "enqueue_seconds": Field(float, "s", "host enqueue start to enqueue end"),
            "kernel_seconds": Field(float, "s", "kernel end - kernel start (either clock); "
                                    "absent without kernel events"),
            "kernel_start_ns": Field(int, "ns", "earliest channel start: UNIX epoch ns when "
                                     "kernel_clock is host; raw GPU globaltimer ns when it is "
                                     "gpu (the plugin records no GPU-to-host offset: compare "
                                     "only with other gpu values of the same GPU)"),
            "kernel_end_ns": Field(int, "ns", "latest channel end, same clock as "
                                   "kernel_start_ns"),
            "kernel_clock": Field(str, "", "gpu (GPU globaltimer, ABI v4+) or host (the "
                                  "proxy thread saw the kernel, ABI v3)"),
            "proxy_ops": Field(int, "", "network proxy operations folded in"),
            "net_sent_bytes": Field(int, "B", "bytes its proxy steps sent over the network"),
            "net_recv_bytes": Field(int, "B", "bytes its proxy steps received"),
            "incomplete": Field(bool, "", "closed by the plugin's stale sweep or finalize, "
                                "not by NCCL (times are partial)"),
            "pid": Field(int, "", "process id"),
        },
    ),
    Measurement(
        name="ncclprof_proxy",
        doc="A training process's network proxy operations toward one peer on one channel "
            "and direction, summed over one poll window (time = the window's first op "
            "start): where each step's time went, the split that tells a slow network or "
            "peer (send/recv waits) from a slow GPU (gpu waits).",
        source=_PROF,
        optional_tags=frozenset(_POD_TAGS),
        tags={**_JOB_TAGS,
              "direction": "send or recv",
              "comm": _COMM,
              "peer": "peer rank in the communicator",
              "channel": "NCCL channel"},
        fields={
            "ops": Field(int, "", "proxy operations in the window"),
            "steps": Field(int, "", "proxy steps in them"),
            "bytes": Field(int, "B", "bytes they moved"),
            "seconds": Field(float, "s", "sum of the operations' start-to-end times"),
            "gpu_wait_seconds": Field(float, "s", "send: SendGPUWait (GPU had not produced "
                                      "the data); recv: RecvGPUWait (GPU had not consumed it)"),
            "peer_wait_seconds": Field(float, "s", "send: SendPeerWait (waiting for the "
                                       "receiver's clear-to-send credit)"),
            "net_wait_seconds": Field(float, "s", "send: SendWait (posted to the network, "
                                      "not completed); recv: RecvWait (data not arrived)"),
            "flush_seconds": Field(float, "s", "recv: RecvFlushWait (flush to GPU memory)"),
            "net_events": Field(int, "", "network plugin events (IB work requests, socket "
                                "sends) under the steps"),
            "net_event_seconds": Field(float, "s", "their summed durations"),
            "incomplete": Field(int, "", "operations closed by the stale sweep or finalize"),
            "pid": Field(int, "", "process id"),
        },
    ),
    Measurement(
        name="nccl_inspector_collective",
        doc="One collective or point-to-point operation of one communicator as NCCL "
            "Inspector dumped it (one JSON line in <dir>/<host>-pid<pid>.log; time = the "
            "operation's start with verbose dumps, else the dump time).",
        source=_INSPECTOR,
        optional_tags=frozenset({*_POD_TAGS, "comm_name"}),
        tags={**_JOB_TAGS,
              "op": "AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, Send, Recv, ...",
              "kind": "coll or p2p",
              "comm": _COMM,
              "comm_name": "communicator name NCCL was given (`comm_name`); absent when "
                           "unknown",
              "host": "host name in the dump's metadata",
              "timing": "Inspector's timing source: kernel_gpu (GPU timer), kernel_cpu "
                        "(kernel seen by the host), collective_cpu (host enqueue to "
                        "completion) or unknown (older dumps)"},
        fields={
            "seq": Field(int, "", "Inspector's sequence number of the operation"),
            "comm_rank": Field(int, "rank", "the process's rank in the communicator"),
            "bytes": Field(int, "B", "message size (Inspector's msg_size_bytes)"),
            "exec_seconds": Field(float, "s", "execution time (exec_time_us)"),
            "algbw_gbs": Field(float, "GB/s", "Inspector's algorithm bandwidth (absent when "
                               "it wrote nan)"),
            "busbw_gbs": Field(float, "GB/s", "Inspector's bus bandwidth (idem)"),
            "nranks": Field(int, "ranks", "ranks in the communicator"),
            "nnodes": Field(int, "", "nodes the communicator spans"),
            "peer": Field(int, "rank", "p2p: the peer rank"),
            "pid": Field(int, "", "process id in the dump's metadata"),
        },
    ),
    Measurement(
        name="nccl_step",
        doc="One training step inferred from a process's NCCL calls: the shortest sequence "
            "of calls (op, communicator, size) that repeats, cut where the calls pause "
            "longest (DDP: the gradient AllReduce buckets; FSDP: the per-layer AllGather "
            "and ReduceScatter). Times are enqueue times (time = the step's first call).",
        source=_STEPS,
        optional_tags=frozenset(_POD_TAGS),
        tags=dict(_JOB_TAGS),
        fields={
            "step": Field(int, "", "index among the steps this agent inferred for the "
                                   "process (0 = first seen)"),
            "seconds": Field(float, "s", "from this step's first call to the next step's"),
            "collectives": Field(int, "", "NCCL calls in the step"),
            "bytes": Field(int, "B", "sum of their message sizes (size_bytes where known, "
                                     "else bytes)"),
            "calls_seconds": Field(float, "s", "first call to last call of the step: how "
                                   "long the host spent issuing them"),
            "pid": Field(int, "", "process id"),
        },
    ),
]
