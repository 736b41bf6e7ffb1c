"""What the gloo probe knows about gloo's binary interface, and how it decodes events.

One table (OPS) says, per collective: its name (NCCL's spelling, so fabricscope.busbw
applies), the mangled symbol of `gloo::<op>(<Op>Options&)` in libtorch_cpu.so, and
where its options object keeps the fields the BPF side reads. The same table
becomes the BPF program's `-DFS_LAYOUT_<OP>` flags (cflags()), so C and Python
cannot disagree.

The offsets are those of gloo's option classes since 2019 (gloo/allreduce.h,
broadcast.h, ...; x86-64, libstdc++: shared_ptr and unique_ptr lead with the raw
pointer, a vector with its begin pointer). They are not an ABI, so decode() never
trusts them blindly: an event's message size is taken from the options only when
independent facts agree (elements x elementSize equals the size the output
UnboundBuffer reports about itself, 0 <= rank < size); otherwise it is derived
from the bytes the thread handed to gloo's transport, and the event says so in
`bytes_source`.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from fabricscope import busbw

OUT_NONE, OUT_PTR, OUT_VEC = 0, 1, 2
F_NO_CONTEXT, F_NO_COUNT, F_NO_OUT, F_NO_IN = 1, 2, 4, 8

#: Names of the BPF `stats` array entries, in FS_GS_* order (bpf/gloo.h).
STATS = ("entries", "emitted", "lost", "filtered", "unfinished", "orphan_returns",
         "active_full", "sends_outside", "recvs_outside", "p2p_unpaired", "p2p_unwaited",
         "notices_lost")

# gloo's base classes (gloo/context.h, gloo/transport/unbound_buffer.h):
#   class Context { const int rank; const int size; int base; ... }  (no vtable)
#   class UnboundBuffer { vptr; void* const ptr; const size_t size; ... }
CTX_RANK_OFF, CTX_SIZE_OFF, UB_SIZE_OFF = 0, 4, 16

SEND_SYM = "_ZN4gloo9transport3tcp13UnboundBuffer4sendEimmm"
RECV_SYMS = ("_ZN4gloo9transport3tcp13UnboundBuffer4recvEimmm",
             "_ZN4gloo9transport3tcp13UnboundBuffer4recvESt6vectorIiSaIiEEmmm")


@dataclass(frozen=True)
class OpLayout:
    """One collective: how to find it and where its options keep what we read.

    size_rule says how S (nccl-tests' message size) follows from what was read:
    'count' elements x elementSize (checked against the output buffer's size),
    'out' the output buffer's size, 'out_n' / 'in_n' that buffer's size x nranks,
    'none' no payload (barrier)."""

    id: int
    name: str            # NCCL's spelling, as fabricscope.busbw knows it
    symbol: str          # mangled gloo::<op>(...) in libtorch_cpu.so
    bpf_fn: str          # entry function in bpf/gloo.bpf.c
    elements_off: int    # size_t elements; -1: none
    elemsize_off: int    # size_t elementSize; -1: none
    out_kind: int        # OUT_*
    out_off: int         # output buffer (unique_ptr or vector of them); -1: none
    in_off: int          # input buffer (unique_ptr); -1: none
    size_rule: str
    model: str | None    # busbw model name; None: no bandwidth figures (barrier)


OPS: tuple[OpLayout, ...] = (
    # AllreduceOptionsImpl: context 0, timeout 16, algorithm 24, in 32, out 56,
    # elements 80, elementSize 88, reduce 96, tag 128, maxSegmentSize 136
    OpLayout(0, "AllReduce", "_ZN4gloo9allreduceERKNS_16AllreduceOptionsE", "allreduce",
             80, 88, OUT_VEC, 56, -1, "count", "AllReduce"),
    # BroadcastOptions: context 0, in 16, out 24, elements 32, elementSize 40, root 48
    OpLayout(1, "Broadcast", "_ZN4gloo9broadcastERNS_16BroadcastOptionsE", "broadcast",
             32, 40, OUT_PTR, 24, 16, "count", "Broadcast"),
    # AllgatherOptions: context 0, in 16, out 24, elementSize 32
    OpLayout(2, "AllGather", "_ZN4gloo9allgatherERNS_16AllgatherOptionsE", "allgather",
             -1, 32, OUT_PTR, 24, 16, "out", "AllGather"),
    # AllgathervOptions: context 0, in 16, out 24, elements (vector) 32, elementSize 56
    OpLayout(3, "AllGatherv", "_ZN4gloo10allgathervERNS_17AllgathervOptionsE", "allgatherv",
             -1, 56, OUT_PTR, 24, 16, "out", "AllGather"),
    # ReduceOptions: context 0, in 16, out 24, elements 32, elementSize 40, root 48
    OpLayout(4, "Reduce", "_ZN4gloo6reduceERNS_13ReduceOptionsE", "reduce",
             32, 40, OUT_PTR, 24, 16, "count", "Reduce"),
    # GatherOptions: context 0, in 16, out 24 (root only), elementSize 32
    OpLayout(5, "Gather", "_ZN4gloo6gatherERNS_13GatherOptionsE", "gather",
             -1, 32, OUT_PTR, 24, 16, "in_n", "Gather"),
    # ScatterOptions: context 0, in (vector, root only) 16, out 40, elementSize 48
    OpLayout(6, "Scatter", "_ZN4gloo7scatterERNS_14ScatterOptionsE", "scatter",
             -1, 48, OUT_PTR, 40, -1, "out_n", "Scatter"),
    # AlltoallOptions: context 0, in 16, out 24, elementSize 32
    OpLayout(7, "AlltoAll", "_ZN4gloo8alltoallERNS_15AlltoallOptionsE", "alltoall",
             -1, 32, OUT_PTR, 24, 16, "out", "AlltoAll"),
    # AlltoallvOptions: context 0, in 16, out 24, 4 vectors 32..128, elementSize 128
    OpLayout(8, "AlltoAllv", "_ZN4gloo9alltoallvERNS_16AlltoallvOptionsE", "alltoallv",
             -1, 128, OUT_PTR, 24, 16, "out", "AlltoAll"),
    # BarrierOptions: context 0, buffer 16 (a one-byte scratch buffer)
    OpLayout(9, "Barrier", "_ZN4gloo7barrierERNS_14BarrierOptionsE", "barrier",
             -1, -1, OUT_NONE, -1, -1, "none", None),
)
OPS_BY_ID = {op.id: op for op in OPS}


@dataclass(frozen=True)
class P2PLayout:
    """A point-to-point transfer (bpf/gloo.bpf.c: p2p_*): the process group's call,
    its work's constructor and the work's wait(), all exported by libtorch_cpu.so.
    S is the size of the UnboundBuffer the work holds (the tensor's bytes)."""

    id: int
    name: str            # NCCL's spelling (fabricscope.busbw: bus factor 1)
    call: str            # c10d::ProcessGroupGloo::send/recv(std::vector<at::Tensor>&, int, int)
    work: str            # the SendWork / RecvWork constructor (complete-object, C1)
    wait: str            # SendWork / RecvWork::wait(std::chrono::milliseconds)
    bpf_tag: str         # p2p_<tag>_call, p2p_<tag>_work in bpf/gloo.bpf.c


P2P: tuple[P2PLayout, ...] = (
    P2PLayout(10, "Send", "_ZN4c10d16ProcessGroupGloo4sendERSt6vectorIN2at6TensorESaIS3_EEii",
              "_ZN4c10d16ProcessGroupGloo8SendWorkC1ERN2at6TensorESt10unique_ptrIN4gloo9"
              "transport13UnboundBufferESt14default_deleteIS8_EEm",
              "_ZN4c10d16ProcessGroupGloo8SendWork4waitENSt6chrono8durationIlSt5ratioILl1E"
              "Ll1000EEEE", "send"),
    P2PLayout(11, "Recv", "_ZN4c10d16ProcessGroupGloo4recvERSt6vectorIN2at6TensorESaIS3_EEii",
              "_ZN4c10d16ProcessGroupGloo8RecvWorkC1ERN2at6TensorESt10unique_ptrIN4gloo9"
              "transport13UnboundBufferESt14default_deleteIS8_EENS_6OpTypeEmPKc",
              "_ZN4c10d16ProcessGroupGloo8RecvWork4waitENSt6chrono8durationIlSt5ratioILl1E"
              "Ll1000EEEE", "recv"),
)
P2P_BY_ID = {op.id: op for op in P2P}
#: payloads above this are misreads (a point-to-point tensor is a layer's activations)
P2P_MAX_BYTES = 1 << 40
MAX_RANKS = 1 << 20
ELEMENT_SIZES = (1, 2, 4, 8, 16)


def cflags() -> list[str]:
    """The -D flags that give bpf/gloo.bpf.c the layout of this table."""
    flags = [f"-DFS_UB_SIZE_OFF={UB_SIZE_OFF}", f"-DFS_CTX_RANK_OFF={CTX_RANK_OFF}",
             f"-DFS_CTX_SIZE_OFF={CTX_SIZE_OFF}"]
    for op in OPS:
        flags.append(f"-DFS_LAYOUT_{op.bpf_fn.upper()}={op.elements_off},{op.elemsize_off},"
                     f"{op.out_kind},{op.out_off},{op.in_off}")
    return flags


class GlooEvent(ctypes.Structure):
    """Mirror of struct fs_gloo_event (bpf/gloo.h)."""

    _fields_ = [("start_ns", ctypes.c_uint64), ("end_ns", ctypes.c_uint64),
                ("elements", ctypes.c_uint64), ("elem_size", ctypes.c_uint64),
                ("out_size", ctypes.c_uint64), ("in_size", ctypes.c_uint64),
                ("sent_bytes", ctypes.c_uint64), ("recv_bytes", ctypes.c_uint64),
                ("pid", ctypes.c_uint32), ("tid", ctypes.c_uint32),
                ("op", ctypes.c_uint32), ("sends", ctypes.c_uint32),
                ("recvs", ctypes.c_uint32), ("ctx_rank", ctypes.c_int32),
                ("ctx_size", ctypes.c_int32), ("flags", ctypes.c_uint32),
                ("peer", ctypes.c_int32), ("pad", ctypes.c_uint32)]


@dataclass(frozen=True)
class Collective:
    """One collective as one thread of one process executed it (monotonic ns)."""

    pid: int
    tid: int
    op: str
    model: str | None      # busbw model name, None for barrier
    start_ns: int
    end_ns: int
    nranks: int | None     # communicator size; None when unknown
    rank: int | None       # rank in that communicator
    bytes: int | None      # S (nccl-tests message size); None when unknown
    bytes_source: str      # "options" (verified), "transfers" (from sends), "unknown"
    sent_bytes: int        # handed to the transport with UnboundBuffer::send
    recv_bytes: int        # posted with UnboundBuffer::recv
    sends: int
    recvs: int
    peer: int | None = None    # Send/Recv: the peer's rank in the process group

    @property
    def seconds(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9


def _context(ev: GlooEvent, world_size: int | None) -> tuple[int | None, int | None]:
    size, rank = ev.ctx_size, ev.ctx_rank
    ok = not ev.flags & F_NO_CONTEXT and 1 <= size <= MAX_RANKS and 0 <= rank < size
    if ok and world_size and size > world_size:
        ok = False                       # a communicator larger than the job: misread
    if ok:
        return size, rank
    return world_size, None


def options_bytes(layout: OpLayout, ev: GlooEvent, nranks: int | None) -> int | None:
    """S from the options when the independent checks agree, else None."""
    rule = layout.size_rule
    if rule == "none":
        return 0
    if ev.flags & (F_NO_COUNT | F_NO_OUT | F_NO_IN):
        return None
    if layout.elemsize_off >= 0 and ev.elem_size not in ELEMENT_SIZES:
        return None
    if rule == "count":
        size = ev.elements * ev.elem_size
        # the output buffer states its own size: both reads must agree
        return size if size > 0 and size == ev.out_size else None
    if nranks is None and rule in ("out_n", "in_n"):
        return None
    size = {"out": ev.out_size, "out_n": ev.out_size * (nranks or 0),
            "in_n": ev.in_size * (nranks or 0)}[rule]
    unit = ev.elem_size * (nranks if rule == "out" and layout.name == "AllGather" else 1)
    return size if size > 0 and size % max(1, unit) == 0 else None


def transfer_bytes(layout: OpLayout, ev: GlooEvent, nranks: int | None) -> int | None:
    """S estimated from what this rank sent, inverting the ring model (S x factor)."""
    if layout.model is None or not nranks or nranks < 2 or ev.sent_bytes == 0:
        return None
    return round(ev.sent_bytes / busbw.bus_factor(layout.model, nranks))


def decode(raw: bytes, world_size: int | None = None) -> Collective:
    """One ring buffer event -> Collective. ValueError when it cannot be an event."""
    if len(raw) < ctypes.sizeof(GlooEvent):
        raise ValueError(f"event of {len(raw)} bytes, expected {ctypes.sizeof(GlooEvent)}")
    ev = GlooEvent.from_buffer_copy(raw[:ctypes.sizeof(GlooEvent)])
    p2p = P2P_BY_ID.get(ev.op)
    if p2p is not None:
        return _p2p(p2p, ev, world_size)
    layout = OPS_BY_ID.get(ev.op)
    if layout is None:
        raise ValueError(f"unknown collective id {ev.op}")
    nranks, rank = _context(ev, world_size)
    size, source = options_bytes(layout, ev, nranks), "options"
    if size is None:
        size, source = transfer_bytes(layout, ev, nranks), "transfers"
        if size is None:
            source = "unknown"
    return Collective(pid=ev.pid, tid=ev.tid, op=layout.name, model=layout.model,
                      start_ns=ev.start_ns, end_ns=ev.end_ns, nranks=nranks, rank=rank,
                      bytes=size, bytes_source=source, sent_bytes=ev.sent_bytes,
                      recv_bytes=ev.recv_bytes, sends=ev.sends, recvs=ev.recvs)


def _p2p(layout: P2PLayout, ev: GlooEvent, world_size: int | None) -> Collective:
    """A Send or Recv: S is the work's buffer size when read and plausible; the peer
    is kept only when it is a rank of the job (0 <= peer < WORLD_SIZE, when known)."""
    size = ev.out_size if not ev.flags & F_NO_OUT and 0 < ev.out_size <= P2P_MAX_BYTES \
        else None
    peer = ev.peer if ev.peer >= 0 and (not world_size or ev.peer < world_size) else None
    return Collective(pid=ev.pid, tid=ev.tid, op=layout.name, model=layout.name,
                      start_ns=ev.start_ns, end_ns=ev.end_ns, nranks=world_size, rank=None,
                      bytes=size, bytes_source="buffer" if size is not None else "unknown",
                      sent_bytes=ev.sent_bytes, recv_bytes=ev.recv_bytes, sends=ev.sends,
                      recvs=ev.recvs, peer=peer)
