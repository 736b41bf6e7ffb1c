"""The plugin's ring layout (profiler/fs_ncclprof.h), mirrored with ctypes.

    struct fsp_ring_header   512 bytes: magic "FSNCPROF", version, sizes, capacity, pid,
                             closed, clocks at open, write_index @64, read_index @128,
                             counters[16] @192
    struct fsp_record        192 bytes: commit (index + 1 once published), kind, codes,
                             comm hash, seq, rank, peer, sizes, host and kernel times,
                             per-state wait sums, bytes moved, NetPlugin sums

tests/unit/test_ncclprof_layout.py compiles a probe of the C header and checks every
offset against these classes.
"""

from __future__ import annotations

import ctypes
import enum

MAGIC = 0x464F5250434E5346          # b"FSNCPROF" little-endian
VERSION = 1
HEADER_SIZE = 512
RECORD_SIZE = 192
NWAITS = 6
NCOUNTERS = 16


class Kind(enum.IntEnum):
    COLL = 1
    P2P = 2
    PROXY = 3


class Flag(enum.IntFlag):
    GPU_TIMER = 1        # gpu_start/gpu_stop: GPU globaltimer ns (KernelCh pTimer)
    KERNEL_HOST = 2      # gpu_start/gpu_stop: host times the proxy saw the kernel
    INCOMPLETE = 4       # closed by the stale sweep or at finalize
    ORPHAN = 8           # proxy op whose collective was gone or in another process
    SEND = 16            # proxy op sends (else receives)


class Wait(enum.IntEnum):
    """Where a proxy step's time went (a state lasts until the next one or the stop)."""
    SEND_GPU = 0         # send data not yet produced by the GPU
    SEND_PEER = 1        # waiting for the receiver's clear-to-send credit
    SEND_NET = 2         # send posted to the network, not yet completed
    RECV_NET = 3         # receive posted, data not yet arrived
    RECV_FLUSH = 4       # data arrived, flush to GPU memory in progress
    RECV_GPU = 5         # data delivered, GPU not yet consumed it


class Counter(enum.IntEnum):
    EVENTS = 0
    POOL_EXHAUSTED = 1
    RING_FULL = 2
    ORPHANS = 3
    BAD_HANDLE = 4
    STALE_RECLAIMED = 5
    UNFINISHED_AT_FINALIZE = 6
    IGNORED = 7
    RECORDS = 8
    CONTEXTS = 9
    UNKNOWN_STATE = 10
    NET_UNKNOWN = 11
    CONTEXTS_EXHAUSTED = 12


#: byte codes, 0 = unknown (FSP_FUNCS, FSP_ALGOS, FSP_PROTOS, FSP_DTYPES in the C header)
FUNCS = ("Unknown", "Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce",
         "SendRecv", "Send", "Recv", "AlltoAll", "Gather", "Scatter")
ALGOS = ("Unknown", "TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE",
         "PAT")
PROTOS = ("Unknown", "LL", "LL128", "SIMPLE")
DTYPES = ("Unknown", "ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64",
          "ncclUint64", "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16",
          "ncclFloat8e4m3", "ncclFloat8e5m2")
DTYPE_SIZES = (0, 1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1)

u8, u16, u32, u64, i32 = (ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64,
                          ctypes.c_int32)


class RingHeader(ctypes.Structure):
    _fields_ = [("magic", u64), ("version", u32), ("header_size", u32), ("record_size", u32),
                ("capacity", u32), ("pid", u32), ("closed", u32), ("mono_ns_at_open", u64),
                ("real_ns_at_open", u64), ("_pad0", u8 * 16), ("write_index", u64),
                ("_pad1", u8 * 56), ("read_index", u64), ("_pad2", u8 * 56),
                ("counters", u64 * NCOUNTERS), ("_pad3", u8 * (HEADER_SIZE - 192 - 8 * NCOUNTERS))]


class RawRecord(ctypes.Structure):
    _fields_ = [("commit", u64), ("kind", u16), ("func", u8), ("algo", u8), ("proto", u8),
                ("dtype", u8), ("flags", u8), ("nchannels", u8), ("comm_hash", u64),
                ("seq", u64), ("rank", i32), ("peer", i32), ("count", u64), ("bytes", u64),
                ("start_ns", u64), ("stop_ns", u64), ("gpu_start", u64), ("gpu_stop", u64),
                ("wait_ns", u64 * NWAITS), ("sent_bytes", u64), ("recv_bytes", u64),
                ("net_ns", u64), ("net_bytes", u64), ("net_events", u32), ("net_qp", u32),
                ("proxy_ops", u32), ("steps", u32), ("kernel_chs", u16), ("channel", u8),
                ("nwarps", u8), ("nsteps", i32)]


assert ctypes.sizeof(RingHeader) == HEADER_SIZE and ctypes.sizeof(RawRecord) == RECORD_SIZE
