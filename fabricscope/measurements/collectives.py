"""Measurements of NCCL collectives: uprobes on libnccl (agent/probes/nccl/probe.py,
bpf/nccl.bpf.c) and NCCL_DEBUG=INFO log ingestion (agent/probes/nccl/log_source.py).

Sizes follow fabricscope.busbw (nccl-tests conventions). Uprobe times are when a
call was made and returned: NCCL returns once the work is ENQUEUED on the CUDA
stream, so `duration_ns` is enqueue time, not completion (tag timing="enqueue").
Log records carry the line's own timestamp when NCCL printed one
(NCCL_DEBUG_TIMESTAMP_LEVELS; by default only WARN lines), else the time the
agent read the line.
"""

from fabricscope.schema import Field, Measurement

_UPROBE = "agent probe nccl (bpf/nccl.bpf.c, uprobes on libnccl.so)"
_LOG = "agent source nccl_log (NCCL_DEBUG=INFO output)"
_LOG_TAGS = {"host": "host name in the log line prefix (the process's view)",
             "pid": "process id in the log line prefix"}

MEASUREMENTS = [
    Measurement(
        name="nccl_call",
        doc="One NCCL API call (collective, send/recv, group start/end) seen by a uprobe, "
            "one record per call. Times are ENQUEUE times: NCCL returns once the work is "
            "queued on the CUDA stream.",
        source=_UPROBE,
        tags={
            "op": "AllReduce, AllGather, ReduceScatter, AlltoAll, Broadcast, Reduce, Gather, "
                  "Scatter, Send, Recv, GroupStart or GroupEnd",
            "pid": "process id (host pid namespace)",
            "timing": "what the times measure: always `enqueue`",
            "datatype": "element type (float32, bfloat16, ...; dtype<N> when unknown)",
            "redop": "reduction (sum, prod, max, min, avg, user<N>)",
            "comm": "communicator handle (ncclComm_t, hex); unique within a process",
            "comm_id": "NCCL commId hash of the communicator (hex, as in NCCL's Init log "
                       "lines; same on every rank); when its init was seen",
        },
        optional_tags=frozenset({"datatype", "redop", "comm", "comm_id"}),
        fields={
            "api": Field(str, "", "NCCL function called (ncclAllReduce, ncclBcast, ...Config)"),
            "count": Field(int, "elements", "count argument (per rank for AllGather, "
                                            "ReduceScatter, AlltoAll, Gather, Scatter)"),
            "bytes": Field(int, "B", "count x sizeof(datatype)"),
            "size_bytes": Field(int, "B", "message size S in the nccl-tests convention "
                                          "(x nranks where count is per rank); when known"),
            "duration_ns": Field(int, "ns", "entry to return: enqueue time, not completion"),
            "ret": Field(int, "", "ncclResult_t returned (0 success, 4 invalid argument, ...)"),
            "root": Field(int, "rank", "root rank (Broadcast, Reduce, Gather, Scatter)"),
            "peer": Field(int, "rank", "peer rank (Send, Recv)"),
            "nranks": Field(int, "ranks", "ranks in the communicator (when the probe saw its "
                                          "init, else from the NCCL_DEBUG log's Init line of "
                                          "the same pid and comm, when ingested)"),
            "rank": Field(int, "rank", "this process's rank in the communicator (idem)"),
            "stream": Field(str, "", "cudaStream_t (hex)"),
            "seq": Field(int, "", "order of calls seen by the probe (a gap: lost events)"),
            "tid": Field(int, "", "thread id"),
        },
    ),
    Measurement(
        name="nccl_comm",
        doc="A communicator created (init, split, shrink, grow) or ended (destroy, abort, "
            "finalize), seen by a uprobe on the NCCL API.",
        source=_UPROBE,
        tags={
            "event": "init, split, shrink, grow, destroy, abort or finalize",
            "pid": "process id (host pid namespace)",
            "comm": "communicator handle (hex; 0x0 when creation failed)",
            "comm_id": "NCCL commId hash of the unique id (init, grow; hex)",
        },
        optional_tags=frozenset({"comm_id"}),
        fields={
            "api": Field(str, "", "NCCL function called"),
            "nranks": Field(int, "ranks", "nranks argument (init, grow)"),
            "rank": Field(int, "rank", "rank argument (init, grow)"),
            "ret": Field(int, "", "ncclResult_t returned"),
            "duration_ns": Field(int, "ns", "entry to return"),
            "parent": Field(str, "", "parent communicator (split, shrink, grow; hex)"),
            "color": Field(int, "", "split color"),
            "key": Field(int, "", "split key"),
            "excluded": Field(int, "ranks", "shrink: excluded ranks"),
            "n_ids": Field(int, "", "init scalable: number of unique ids"),
            "seq": Field(int, "", "order of calls seen by the probe"),
            "tid": Field(int, "", "thread id"),
        },
    ),
    Measurement(
        name="nccl_log_coll",
        doc="One collective as logged by NCCL (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=COLL), "
            "one record per COLL line.",
        source=_LOG,
        tags={**_LOG_TAGS,
              "op": "NCCL operation name (AllReduce, ...)",
              "datatype": "element type",
              "redop": "reduction (for ops without one NCCL logs 0: sum)",
              "comm": "communicator handle (hex)"},
        fields={
            "op_count": Field(int, "", "NCCL's per-communicator operation counter"),
            "count": Field(int, "elements", "count argument"),
            "bytes": Field(int, "B", "count x sizeof(datatype)"),
            "size_bytes": Field(int, "B", "message size S (nccl-tests convention)"),
            "root": Field(int, "rank", "root argument (NCCL logs 0 when unused)"),
            "nranks": Field(int, "ranks", "ranks in the communicator"),
            "stream": Field(str, "", "cudaStream_t (hex)"),
            "tid": Field(int, "", "thread id in the line prefix"),
        },
    ),
    Measurement(
        name="nccl_log_comm",
        doc="A communicator's init as logged by NCCL (`... commId 0x... - Init START` / "
            "`- Init COMPLETE`, and split/grow COMPLETE lines with parent, color, key).",
        source=_LOG,
        tags={**_LOG_TAGS,
              "event": "init_start or init_complete",
              "comm": "communicator handle (hex)",
              "comm_id": "NCCL commId hash (hex; not logged for split children)"},
        optional_tags=frozenset({"comm_id"}),
        fields={
            "func": Field(str, "", "NCCL function that created it (ncclCommInitRank, ...)"),
            "rank": Field(int, "rank", "rank in the communicator"),
            "nranks": Field(int, "ranks", "ranks in the communicator"),
            "cuda_dev": Field(int, "", "CUDA device"),
            "nvml_dev": Field(int, "", "NVML device"),
            "bus_id": Field(str, "", "PCI bus id of the GPU (hex)"),
            "parent": Field(str, "", "parent communicator (split/grow)"),
            "color": Field(int, "", "split color"),
            "key": Field(int, "", "split key"),
        },
    ),
    Measurement(
        name="nccl_topology",
        doc="A ring or channel connection NCCL set up (`Ring 00 : p -> r -> n`, "
            "`Channel 00/02 :    0   1`, `Channel 00/0 : 0[0] -> 1[1] via NET/IB/0/GDRDMA`).",
        source=_LOG,
        tags={**_LOG_TAGS,
              "kind": "ring (this rank's neighbours), ring_order (rank 0's view of a "
                      "whole ring) or channel (one connection)",
              "transport": "channel transport: NET, P2P, SHM, ... (channel lines)",
              "direction": "send or receive for NET channel lines, else `-`"},
        optional_tags=frozenset({"transport", "direction"}),
        fields={
            "channel": Field(int, "", "channel (ring) number"),
            "conn": Field(int, "", "connection index (channel lines)"),
            "src_rank": Field(int, "rank", "sending rank (channel lines)"),
            "src_dev": Field(int, "", "sending rank's device"),
            "dst_rank": Field(int, "rank", "receiving rank"),
            "dst_dev": Field(int, "", "receiving rank's device"),
            "via": Field(str, "", "full transport path, e.g. NET/IB/0/GDRDMA"),
            "prev": Field(int, "rank", "previous rank in the ring (ring lines)"),
            "rank": Field(int, "rank", "this rank (ring lines)"),
            "next": Field(int, "rank", "next rank in the ring (ring lines)"),
            "order": Field(str, "", "ranks in ring order, space separated (ring_order)"),
        },
    ),
    Measurement(
        name="nccl_net",
        doc="Network settings NCCL reported: socket threads, the interfaces or IB devices "
            "it uses, the network plugin.",
        source=_LOG,
        tags={**_LOG_TAGS,
              "kind": "socket_threads, socket_devices, ib_devices or network"},
        fields={
            "threads": Field(int, "", "NET/Socket threads per connection"),
            "sockets_per_thread": Field(int, "", "NET/Socket sockets per thread"),
            "devices": Field(str, "", "devices as NCCL lists them ([0]eth0:10.0.0.1<0> ...)"),
            "oob": Field(str, "", "IB out-of-band interface and address"),
            "network": Field(str, "", "network plugin in use (IB, Socket, ...)"),
        },
    ),
    Measurement(
        name="nccl_warn",
        doc="An NCCL WARN line, or an INFO error-trace line (`file:line (func) -> code`, "
            "printed while an error propagates).",
        source=_LOG,
        tags={**_LOG_TAGS,
              "level": "WARN or INFO (error trace)",
              "file": "NCCL source file that printed it",
              "func": "NCCL function that printed it"},
        optional_tags=frozenset({"func"}),
        fields={
            "message": Field(str, "", "the message text"),
            "line": Field(int, "", "source line"),
            "code": Field(int, "", "ncclResult_t of an error trace, or the ibv_wc_status of "
                                   "an IB completion error (12: IBV_WC_RETRY_EXC_ERR)"),
            "status": Field(str, "", "name of that status (IBV_WC_RETRY_EXC_ERR, "
                                     "ncclInvalidArgument, ...)"),
            "tid": Field(int, "", "thread id in the line prefix"),
        },
    ),
]
