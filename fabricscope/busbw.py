"""Collective arithmetic shared by agent and collector: NCCL enums, sizes, algbw, busbw.

Definitions follow nccl-tests (doc/PERFORMANCE.md and src/<op>.cu, `*GetBw`):

- S, the message size of one call in bytes, from the call's `count` argument:
  count x sizeof(datatype) for AllReduce, Broadcast, Reduce, Send/Recv; and
  count x sizeof(datatype) x nranks for AllGather, ReduceScatter, AlltoAll,
  Gather and Scatter, whose `count` is per rank (AllGather's sendcount,
  ReduceScatter's recvcount, AlltoAll's per-peer count).
- algbw = S / t, in GB/s with GB = 1e9 bytes.
- busbw = algbw x factor(op, n): 2(n-1)/n for AllReduce; (n-1)/n for AllGather,
  ReduceScatter, AlltoAll, Gather, Scatter; 1 for Broadcast, Reduce, Send/Recv.
  busbw is the per-rank wire bandwidth of an optimal (ring) algorithm, so it can be
  compared to the link speed whatever n is.
- ring wire model: bytes each rank sends for one call = S x factor(op, n)
  (AllReduce 2S(n-1)/n: a reduce-scatter then an all-gather round of the ring).

Enum values are those of the wheel's include/nccl.h (NCCL 2.32.3).
"""

from __future__ import annotations

from dataclasses import dataclass

#: ncclDataType_t -> (name as in nccl.h without the prefix, size in bytes)
DATATYPES: dict[int, tuple[str, int]] = {
    0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4),
    4: ("int64", 8), 5: ("uint64", 8), 6: ("float16", 2), 7: ("float32", 4),
    8: ("float64", 8), 9: ("bfloat16", 2), 10: ("float8e4m3", 1), 11: ("float8e5m2", 1),
}

#: ncclRedOp_t built-in values; values >= 5 are user ops (ncclRedOpCreatePreMulSum).
REDOPS: dict[int, str] = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}

#: ncclResult_t
RESULTS: dict[int, str] = {
    0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError",
    3: "ncclInternalError", 4: "ncclInvalidArgument", 5: "ncclInvalidUsage",
    6: "ncclRemoteError", 7: "ncclInProgress", 8: "ncclTimeout",
}


@dataclass(frozen=True)
class OpModel:
    """How one collective's size and bus bandwidth are defined (nccl-tests)."""

    name: str                 # NCCL's name (ncclFuncToString): "AllReduce", ...
    per_rank_count: bool      # S = count x size x nranks (count is per rank)
    factor_kind: str          # "allreduce" 2(n-1)/n, "shard" (n-1)/n, "one" 1


OPS: dict[str, OpModel] = {m.name: m for m in (
    OpModel("AllReduce", False, "allreduce"),
    OpModel("AllGather", True, "shard"),
    OpModel("ReduceScatter", True, "shard"),
    OpModel("AlltoAll", True, "shard"),
    OpModel("Gather", True, "shard"),
    OpModel("Scatter", True, "shard"),
    OpModel("Broadcast", False, "one"),
    OpModel("Reduce", False, "one"),
    OpModel("Send", False, "one"),
    OpModel("Recv", False, "one"),
    OpModel("SendRecv", False, "one"),
)}


def datatype_name(code: int) -> str:
    """'float32' for 7; 'dtype<N>' for a value this table does not know."""
    entry = DATATYPES.get(code)
    return entry[0] if entry else f"dtype{code}"


def datatype_size(code: int) -> int | None:
    """Bytes per element, or None for an unknown datatype."""
    entry = DATATYPES.get(code)
    return entry[1] if entry else None


def redop_name(code: int) -> str:
    return REDOPS.get(code, f"user{code}" if code >= len(REDOPS) else f"redop{code}")


def result_name(code: int) -> str:
    return RESULTS.get(code, f"ncclResult{code}")


def _model(op: str) -> OpModel:
    model = OPS.get(op)
    if model is None:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")
    return model


def _check_ranks(nranks: int) -> None:
    if nranks < 1:
        raise ValueError(f"nranks must be at least 1, not {nranks}")


def message_bytes(op: str, count: int, elem_size: int, nranks: int | None) -> int | None:
    """S of one call (nccl-tests convention). None when S needs nranks and it is unknown."""
    model = _model(op)
    if count < 0 or elem_size < 0:
        raise ValueError("count and element size must not be negative")
    if not model.per_rank_count:
        return count * elem_size
    if nranks is None:
        return None
    _check_ranks(nranks)
    return count * elem_size * nranks


def bus_factor(op: str, nranks: int) -> float:
    """busbw / algbw for `op` on `nranks` ranks."""
    model = _model(op)
    _check_ranks(nranks)
    if model.factor_kind == "allreduce":
        return 2.0 * (nranks - 1) / nranks
    if model.factor_kind == "shard":
        return (nranks - 1) / nranks
    return 1.0


def algbw_gbs(size_bytes: int | float, seconds: float) -> float:
    """algbw = S / t in GB/s (1e9 bytes per GB)."""
    if seconds <= 0:
        raise ValueError(f"duration must be positive, not {seconds}")
    return size_bytes / seconds / 1e9


def busbw_gbs(op: str, size_bytes: int | float, seconds: float, nranks: int) -> float:
    """busbw = algbw x bus_factor(op, nranks), GB/s."""
    return algbw_gbs(size_bytes, seconds) * bus_factor(op, nranks)


def ring_bytes_per_rank(op: str, size_bytes: int | float, nranks: int) -> float:
    """Bytes each rank puts on the wire for one call in the ring model (S x factor)."""
    return size_bytes * bus_factor(op, nranks)
