"""The nccl probe's data contract with bpf/nccl.h: API table, event layout, decoding.

The C struct (bpf/nccl.h), mirrored field for field by NcclEventC:

    struct fs_nccl_event {
        u64 ts_ns, ret_ts_ns, seq, count, comm, stream, aux, parent, id_hash;
        u32 pid, tid; u16 api, flags;
        s32 ret, datatype, redop, peer, nranks, rank, color, key; u32 pad;
    };   // 120 bytes

Tests check the sizes, the API ids against the header's #defines, and decode
golden event bytes. No BCC import here: decoding works without root.
"""

from __future__ import annotations

import ctypes
import re
import struct
from dataclasses import dataclass
from pathlib import Path

HEADER = Path(__file__).resolve().parents[3] / "bpf" / "nccl.h"

F_RETURNED, F_ID, F_OUT = 1, 2, 4
NONE = -1

#: index of the per-CPU `stats` array -> stats() key (order of FS_NCCL_STAT_*)
STAT_NAMES = ("hits", "emitted", "lost", "nested", "orphan_returns", "filtered",
              "id_unreadable")


@dataclass(frozen=True)
class Api:
    """One probed NCCL function."""

    id: int
    symbol: str
    op: str       # NCCL's operation name (ncclFuncToString) or the comm/group action
    kind: str     # "coll", "p2p", "group" or "comm"

    @property
    def entry_fn(self) -> str:
        """Name of the BPF entry function (ENTRY macro in bpf/nccl.bpf.c)."""
        return f"enter_{self.symbol}"


def _apis() -> tuple[Api, ...]:
    rows = [
        ("ncclAllReduce", "AllReduce", "coll"), ("ncclAllReduceConfig", "AllReduce", "coll"),
        ("ncclReduceScatter", "ReduceScatter", "coll"),
        ("ncclReduceScatterConfig", "ReduceScatter", "coll"),
        ("ncclAllGather", "AllGather", "coll"), ("ncclAllGatherConfig", "AllGather", "coll"),
        ("ncclAlltoAll", "AlltoAll", "coll"), ("ncclAlltoAllConfig", "AlltoAll", "coll"),
        ("ncclBroadcast", "Broadcast", "coll"), ("ncclBroadcastConfig", "Broadcast", "coll"),
        ("ncclBcast", "Broadcast", "coll"),
        ("ncclReduce", "Reduce", "coll"), ("ncclReduceConfig", "Reduce", "coll"),
        ("ncclGather", "Gather", "coll"), ("ncclGatherConfig", "Gather", "coll"),
        ("ncclScatter", "Scatter", "coll"), ("ncclScatterConfig", "Scatter", "coll"),
        ("ncclSend", "Send", "p2p"), ("ncclRecv", "Recv", "p2p"),
        ("ncclGroupStart", "GroupStart", "group"), ("ncclGroupEnd", "GroupEnd", "group"),
        ("ncclCommInitRank", "init", "comm"), ("ncclCommInitRankConfig", "init", "comm"),
        ("ncclCommInitRankScalable", "init", "comm"), ("ncclCommSplit", "split", "comm"),
        ("ncclCommShrink", "shrink", "comm"), ("ncclCommGrow", "grow", "comm"),
        ("ncclCommDestroy", "destroy", "comm"), ("ncclCommAbort", "abort", "comm"),
        ("ncclCommFinalize", "finalize", "comm"),
    ]
    return tuple(Api(i + 1, sym, op, kind) for i, (sym, op, kind) in enumerate(rows))


APIS: tuple[Api, ...] = _apis()
API_BY_ID: dict[int, Api] = {a.id: a for a in APIS}
#: ops whose `peer` field is a root rank (the others with a peer are Send/Recv)
ROOTED_OPS = frozenset({"Broadcast", "Reduce", "Gather", "Scatter"})


class NcclEventC(ctypes.Structure):
    _fields_ = [
        ("ts_ns", ctypes.c_uint64), ("ret_ts_ns", ctypes.c_uint64), ("seq", ctypes.c_uint64),
        ("count", ctypes.c_uint64), ("comm", ctypes.c_uint64), ("stream", ctypes.c_uint64),
        ("aux", ctypes.c_uint64), ("parent", ctypes.c_uint64), ("id_hash", ctypes.c_uint64),
        ("pid", ctypes.c_uint32), ("tid", ctypes.c_uint32),
        ("api", ctypes.c_uint16), ("flags", ctypes.c_uint16),
        ("ret", ctypes.c_int32), ("datatype", ctypes.c_int32), ("redop", ctypes.c_int32),
        ("peer", ctypes.c_int32), ("nranks", ctypes.c_int32), ("rank", ctypes.c_int32),
        ("color", ctypes.c_int32), ("key", ctypes.c_int32), ("pad", ctypes.c_uint32),
    ]


EVENT_SIZE = ctypes.sizeof(NcclEventC)
#: the same layout for decoding: struct.unpack is several times faster than ctypes here
_EVENT = struct.Struct("<9Q 2I 2H 8i I")


@dataclass(slots=True)
class NcclEvent:
    """One decoded call. Times are kernel monotonic ns; ret_ts_ns 0 without a return."""

    api: Api
    ts_ns: int
    ret_ts_ns: int
    seq: int
    pid: int
    tid: int
    count: int
    comm: int
    stream: int
    parent: int
    id_hash: int | None
    ret: int | None
    datatype: int
    redop: int
    peer: int
    nranks: int
    rank: int
    color: int
    key: int

    @property
    def duration_ns(self) -> int | None:
        return self.ret_ts_ns - self.ts_ns if self.ret is not None else None


class DecodeError(ValueError):
    """Event bytes that do not match the layout (wrong size, unknown API id)."""


def decode(raw: bytes) -> NcclEvent:
    if len(raw) < EVENT_SIZE:
        raise DecodeError(f"nccl event of {len(raw)} bytes, expected {EVENT_SIZE}")
    (ts, ret_ts, seq, count, comm, stream, _aux, parent, id_hash, pid, tid, api_id, flags,
     ret, datatype, redop, peer, nranks, rank, color, key, _pad) = _EVENT.unpack_from(raw)
    api = API_BY_ID.get(api_id)
    if api is None:
        raise DecodeError(f"nccl event with unknown api id {api_id}")
    returned = flags & F_RETURNED
    return NcclEvent(api, ts, ret_ts if returned else 0, seq, pid, tid, count, comm, stream,
                     parent, id_hash if flags & F_ID else None, ret if returned else None,
                     datatype, redop, peer, nranks, rank, color, key)


def header_api_ids(text: str | None = None) -> dict[str, int]:
    """FS_NCCL_API_<NAME> -> id as #defined in bpf/nccl.h (for the consistency test)."""
    text = HEADER.read_text() if text is None else text
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"#define FS_NCCL_API_(\w+)\s+(\d+)", text)}


_M0, _M1 = 0x9DE62BBC8CEF3CE3, 0x485CD6311B599E79
_D0, _D1 = 0xBAC3BD562846DE6B, 0x995A187A14E7B445
_MASK = (1 << 64) - 1


def comm_id_hash(unique_id: bytes) -> int:
    """NCCL's getHash() of a 128-byte ncclUniqueId (src/include/bitops.h, NCCL >= 2.26).

    The same value NCCL logs as `commId 0x...` in "Init START/COMPLETE" lines, so the
    probe's `comm_id` joins with nccl_log_comm and across the ranks of a communicator.
    Mirrors nccl_id_hash() in bpf/nccl.bpf.c."""
    if len(unique_id) != 128:
        raise ValueError(f"an ncclUniqueId has 128 bytes, not {len(unique_id)}")
    a0, a1 = 1 ^ 128, 1
    for i in range(0, 128, 8):
        a0 = (a0 + a1) & _MASK
        a1 ^= a0
        a0 ^= a0 >> 31
        a0 = (a0 * _M0) & _MASK
        a1 ^= a1 >> 32
        a1 = (a1 * _M1) & _MASK
        a0 = (a0 + int.from_bytes(unique_id[i:i + 8], "little")) & _MASK
    h = a0 ^ (a0 >> 31)
    h = (h * _D0) & _MASK
    h = (h + a1) & _MASK
    h ^= h >> 32
    return (h * _D1) & _MASK
