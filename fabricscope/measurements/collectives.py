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
             "pid": "process id in the log line prefix (`-` when the line has none)"}
_LOG_FIELDS = {
    "dev": Field(int, "", "CUDA device in the line prefix ([dev]; -1 when none)"),
    "launcher": Field(str, "", "launcher whose prefix came before NCCL's: ray, torchrun "
                               "or mpirun"),
    "launcher_rank": Field(int, "rank", "rank the launcher's prefix names ([rank0]:, [1,0])"),
    "launcher_ip": Field(str, "", "worker address in Ray's prefix (ip=...)"),
}

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
            **_LOG_FIELDS,
        },
    ),
    Measurement(
        name="nccl_log_comm",
        doc="A communicator's init as logged by NCCL (`... commId 0x... - Init START` / "
            "`- Init COMPLETE`, split/grow lines with parent, color, key; `- Destroy "
            "COMPLETE`, `- Abort COMPLETE`), and its shape (`comm 0x.. rank 3 nRanks 8 "
            "nNodes 2 localRanks 4 localRank 3 MNNVL 0`).",
        source=_LOG,
        tags={**_LOG_TAGS,
              "event": "init_start, init_complete, destroy_complete, abort_complete or "
                       "shape",
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
            "nnodes": Field(int, "", "nodes the communicator spans (shape)"),
            "local_ranks": Field(int, "ranks", "ranks on this node (shape)"),
            "local_rank": Field(int, "rank", "this rank's index on its node (shape)"),
            "mnnvl": Field(int, "", "multi-node NVLink in use (shape; 1 yes, 0 no)"),
            **_LOG_FIELDS,
        },
    ),
    Measurement(
        name="nccl_topology",
        doc="A ring, tree or channel connection NCCL set up (`Ring 00 : p -> r -> n`, "
            "`Channel 00/02 :    0   1`, `Channel 00/0 : 0[0] -> 1[1] via NET/IB/0/GDRDMA`, "
            "`Trees [0] 1/-1/-1->0->-1` (one record per channel), `Tree 0 : -1 -> 0 -> 1/-1/-1`).",
        source=_LOG,
        tags={**_LOG_TAGS,
              "kind": "ring (this rank's neighbours), ring_order (rank 0's view of a "
                      "whole ring), channel (one connection), tree (this rank's parent and "
                      "children), tree_up or tree_down (NCCL 2.7's two trees)",
              "transport": "channel transport: NET, P2P, SHM, ... (channel lines)",
              "direction": "send or receive for NET channel lines, else `-`"},
        optional_tags=frozenset({"transport", "direction"}),
        fields={
            "channel": Field(int, "", "channel (ring) number"),
            "conn": Field(int, "", "connection index (channel lines)"),
            "src_rank": Field(int, "rank", "sending rank (channel lines)"),
            "src_dev": Field(int, "", "sending rank's device (NCCL >= 2.18)"),
            "src_bus_id": Field(str, "", "sending rank's GPU PCI bus id, hex (NCCL < 2.18 "
                                         "prints it in place of the device)"),
            "dst_bus_id": Field(str, "", "receiving rank's GPU PCI bus id, hex (idem)"),
            "dst_rank": Field(int, "rank", "receiving rank"),
            "dst_dev": Field(int, "", "receiving rank's device"),
            "via": Field(str, "", "full transport path, e.g. NET/IB/0/GDRDMA"),
            "prev": Field(int, "rank", "previous rank in the ring (ring lines)"),
            "rank": Field(int, "rank", "this rank (ring lines)"),
            "next": Field(int, "rank", "next rank in the ring (ring lines)"),
            "order": Field(str, "", "ranks in ring order, space separated (ring_order)"),
            "nchannels": Field(int, "", "channels (rings) in all (ring_order)"),
            "nranks": Field(int, "ranks", "ranks in the ring (ring_order, when NCCL printed "
                                          "it whole)"),
            "up": Field(int, "rank", "parent in the tree, -1 at the root (tree lines)"),
            "down": Field(str, "", "children in the tree, a/b/c, -1 for none (tree lines)"),
            "net": Field(str, "", "network of a NET channel (IB, Socket, AWS Libfabric, ...)"),
            "net_dev": Field(int, "", "network device index of a NET channel"),
            "proxy_rank": Field(int, "rank", "PXN proxy rank of a NET channel (NET/IB/1(5))"),
            "gdrdma": Field(bool, "", "NET channel uses GPUDirect RDMA"),
            "shared": Field(bool, "", "NET channel uses shared buffers"),
            **_LOG_FIELDS,
        },
    ),
    Measurement(
        name="nccl_net",
        doc="Network settings NCCL reported: socket threads, the interfaces or IB devices "
            "it uses (bootstrap, NET/Socket, NET/IB; `NET/IB : No device found.` is an empty "
            "list), the network plugin.",
        source=_LOG,
        tags={**_LOG_TAGS,
              "kind": "socket_threads, socket_devices, ib_devices, bootstrap_devices or "
                      "network"},
        fields={
            "threads": Field(int, "", "NET/Socket threads per connection"),
            "sockets_per_thread": Field(int, "", "NET/Socket sockets per thread"),
            "devices": Field(str, "", "devices as NCCL lists them ([0]eth0:10.0.0.1<0> ...)"),
            "oob": Field(str, "", "IB out-of-band interface and address"),
            "network": Field(str, "", "network plugin in use (IB, Socket, ...)"),
            "ndevices": Field(int, "", "devices listed"),
            "nics": Field(int, "", "NICs NCCL uses: devices, with fused ones ([0]={...}) "
                                   "counted once"),
            "relaxed_ordering": Field(bool, "", "IB relaxed ordering on ([RO])"),
            **_LOG_FIELDS,
        },
    ),
    Measurement(
        name="nccl_log_setting",
        doc="A setting NCCL reported: its version, an environment variable it read, a "
            "GPU's CPU affinity, thread thresholds, channel counts, NVLS support.",
        source=_LOG,
        tags={**_LOG_TAGS,
              "kind": "version, env, affinity, thresholds, channel_counts or nvls_support",
              "name": "environment variable (env)"},
        optional_tags=frozenset({"name"}),
        fields={
            "version": Field(str, "", "NCCL version (2.18.5)"),
            "cuda": Field(str, "", "CUDA version NCCL was built for (12.2)"),
            "value": Field(str, "", "environment variable's value as NCCL printed it"),
            "gpu": Field(int, "", "GPU (affinity, nvls_support)"),
            "mask": Field(str, "", "CPU affinity mask, hex words"),
            **{f"{algo}_{proto}": Field(int, "threads", f"thread threshold, {algo} {proto}")
               for algo in ("tree", "ring") for proto in ("ll", "ll128", "simple")},
            "collnet": Field(str, "", "CollNet thread thresholds, / separated"),
            "coll_channels": Field(int, "", "collective channels"),
            "collnet_channels": Field(int, "", "CollNet channels"),
            "nvls_channels": Field(int, "", "NVLS channels"),
            "p2p_channels": Field(int, "", "point-to-point channels"),
            "p2p_channels_per_peer": Field(int, "", "point-to-point channels per peer"),
            "nvls_available": Field(bool, "", "NVLS multicast available on the GPU"),
            **_LOG_FIELDS,
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
            "thread": Field(str, "", "NCCL thread of an error trace ([Proxy Thread], ...)"),
            "peer": Field(str, "", "IB completion error: peer address"),
            "peer_port": Field(int, "", "IB completion error: peer port"),
            "opcode": Field(int, "", "IB completion error: ibv_wc_opcode"),
            "len": Field(int, "B", "IB completion error: bytes completed"),
            "vendor_err": Field(int, "", "IB completion error: vendor error (129: mlx5 "
                                         "transport retry counter exceeded)"),
            "request": Field(str, "", "IB completion error: Send, Recv, Flush, IPut"),
            "local_gid": Field(str, "", "IB completion error: local GID"),
            "remote_gid": Field(str, "", "IB completion error: remote GID"),
            "hca": Field(str, "", "IB completion error: HCA"),
            **_LOG_FIELDS,
        },
    ),
]
