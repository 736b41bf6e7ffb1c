"""From decoded NCCL call events to records (nccl_call, nccl_comm).

A communicator handle means nothing across processes; what identifies a
communicator on every rank is NCCL's commId hash of its unique id. CommTable
remembers, per (pid, ncclComm_t), the hash, nranks and rank seen at init, so
each later call on that handle carries them. Communicators created before the
probe attached stay unknown (calls then have no nranks, rank or comm_id).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from fabricscope.agent.probes.base import Clock
from fabricscope.agent.probes.nccl.layout import NONE, ROOTED_OPS, NcclEvent
from fabricscope import busbw
from fabricscope.records import Record

TIMING = "enqueue"


@dataclass(frozen=True)
class CommInfo:
    nranks: int | None
    rank: int | None
    comm_id: int | None      # NCCL commHash (None for split/shrink children)


class CommTable:
    """(pid, comm handle) -> CommInfo, bounded: the oldest entry goes first (counted)."""

    def __init__(self, capacity: int = 65536):
        self.capacity = capacity
        self._table: OrderedDict[tuple[int, int], CommInfo] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._table)

    def get(self, pid: int, comm: int) -> CommInfo | None:
        return self._table.get((pid, comm))

    def put(self, pid: int, comm: int, info: CommInfo) -> None:
        self._table[(pid, comm)] = info
        self._table.move_to_end((pid, comm))
        while len(self._table) > self.capacity:
            self._table.popitem(last=False)
            self.evicted += 1

    def drop(self, pid: int, comm: int) -> None:
        self._table.pop((pid, comm), None)

    def drop_pids(self, alive: set[int]) -> int:
        """Forget the communicators of processes that have exited; returns how many."""
        gone = [key for key in self._table if key[0] not in alive]
        for key in gone:
            del self._table[key]
        return len(gone)


def _hex(value: int) -> str:
    return f"0x{value:x}"


def _int(value: int) -> int | None:
    return None if value == NONE else value


def observe(ev: NcclEvent, comms: CommTable) -> None:
    """Update the communicator table from a successful (or pending) create / end."""
    api = ev.api
    if api.kind != "comm":
        return
    if api.op in ("destroy", "abort"):
        comms.drop(ev.pid, ev.comm)
    elif api.op in ("init", "grow") and ev.comm and ev.ret in (0, 7):   # 7: ncclInProgress
        comms.put(ev.pid, ev.comm, CommInfo(_int(ev.nranks), _int(ev.rank), ev.id_hash))
    elif api.op in ("split", "shrink") and ev.comm and ev.ret in (0, 7):
        comms.put(ev.pid, ev.comm, CommInfo(None, None, None))


def to_record(ev: NcclEvent, comms: CommTable, clock: Clock) -> Record:
    """One record for one event; call observe() after it for comm events."""
    if ev.api.kind == "comm":
        return _comm_record(ev, clock)
    return _call_record(ev, comms, clock)


def _common_fields(ev: NcclEvent) -> dict:
    fields: dict = {"api": ev.api.symbol, "seq": ev.seq, "tid": ev.tid}
    if ev.ret is not None:
        fields["ret"] = ev.ret
        fields["duration_ns"] = ev.duration_ns
    return fields


def _call_record(ev: NcclEvent, comms: CommTable, clock: Clock) -> Record:
    op = ev.api.op
    tags = {"op": op, "pid": str(ev.pid), "timing": TIMING}
    fields = _common_fields(ev)
    if ev.api.kind == "group":
        return Record("nccl_call", clock.to_wall(ev.ts_ns), tags, fields)
    tags["datatype"] = busbw.datatype_name(ev.datatype)
    if ev.redop != NONE:
        tags["redop"] = busbw.redop_name(ev.redop)
    tags["comm"] = _hex(ev.comm)
    info = comms.get(ev.pid, ev.comm)
    if info is not None:
        if info.comm_id is not None:
            tags["comm_id"] = _hex(info.comm_id)
        if info.nranks is not None:
            fields["nranks"] = info.nranks
        if info.rank is not None:
            fields["rank"] = info.rank
    fields["count"] = ev.count
    fields["stream"] = _hex(ev.stream)
    size = busbw.datatype_size(ev.datatype)
    if size is not None:
        fields["bytes"] = ev.count * size
        nranks = info.nranks if info is not None and info.nranks and info.nranks > 0 else None
        total = busbw.message_bytes(op, ev.count, size, nranks)
        if total is not None:
            fields["size_bytes"] = total
    if op in ROOTED_OPS:
        fields["root"] = ev.peer
    elif op in ("Send", "Recv"):
        fields["peer"] = ev.peer
    return Record("nccl_call", clock.to_wall(ev.ts_ns), tags, fields)


def _comm_record(ev: NcclEvent, clock: Clock) -> Record:
    op = ev.api.op
    tags = {"event": op, "pid": str(ev.pid), "comm": _hex(ev.comm)}
    if ev.id_hash is not None:
        tags["comm_id"] = _hex(ev.id_hash)
    fields = _common_fields(ev)
    if op in ("init", "grow"):
        fields["nranks"] = ev.nranks
        fields["rank"] = ev.rank
    if op in ("split", "shrink", "grow"):
        fields["parent"] = _hex(ev.parent)
    if op == "split":
        fields["color"] = ev.color
        fields["key"] = ev.key
    elif op == "shrink":
        fields["excluded"] = ev.color
    elif op == "init" and ev.api.symbol == "ncclCommInitRankScalable":
        fields["n_ids"] = ev.color
    return Record("nccl_comm", clock.to_wall(ev.ts_ns), tags, fields)
