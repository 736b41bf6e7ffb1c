"""From the plugin's decoded ring records to Records (fabricscope/measurements/ncclprof.py).

A collective or p2p task becomes one ncclprof_collective record: a training process
runs tens to thousands a second, as many as nccl_call records. Proxy operations are
far more (one per channel, peer and direction of every collective), so they are summed
per poll window and (communicator, peer, channel, direction) into ncclprof_proxy.

Clocks: the plugin stamps host times with its own CLOCK_MONOTONIC and writes, at ring
open, CLOCK_MONOTONIC and CLOCK_REALTIME read together; their difference shifts host
times to UNIX epoch ns (the writer's view, so a process in its own time namespace is
still right). GPU globaltimer stamps (flag GPU_TIMER) have no recorded offset to the
host clock: they are exported raw with kernel_clock=gpu, and only their difference
(kernel_seconds) is comparable with host times.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fabricscope.agent.probes.gloo.procs import ProcessInfo
from fabricscope.agent.probes.ncclprof.layout import Flag, Kind, Wait
from fabricscope.agent.probes.ncclprof.reader import NcclProfRecord
from fabricscope.jobs import tags_from_env
from fabricscope.records import Record

#: wait states by direction: (gpu, peer, net, flush) -> Wait
_SEND_WAITS = {"gpu_wait_seconds": Wait.SEND_GPU, "peer_wait_seconds": Wait.SEND_PEER,
               "net_wait_seconds": Wait.SEND_NET}
_RECV_WAITS = {"gpu_wait_seconds": Wait.RECV_GPU, "net_wait_seconds": Wait.RECV_NET,
               "flush_seconds": Wait.RECV_FLUSH}


def job_tags(info: ProcessInfo | None, pid: int) -> dict[str, str]:
    """job, rank (and namespace, pod in Kubernetes) of a process, as gloo's records carry
    them; a process gone or of another node gets the rule's fallback (job = pid)."""
    if info is None or not info.local:
        return tags_from_env({}, pid)
    tags = {"job": info.job, "rank": info.rank}
    tags.update({k: v for k, v in (("namespace", info.namespace), ("pod", info.pod)) if v})
    return tags


def comm_tag(comm_hash: int) -> str:
    return f"0x{comm_hash:x}"


def collective_record(rec: NcclProfRecord, tags: dict[str, str], offset_ns: int) -> Record:
    """One ncclprof_collective record; `tags` are the process's job/rank/pod tags."""
    t = {**tags, "op": rec.func, "kind": "coll" if rec.kind is Kind.COLL else "p2p",
         "comm": comm_tag(rec.comm_hash)}
    if rec.kind is Kind.COLL:
        t.update(algo=rec.algo, proto=rec.proto)
    fields: dict = {
        "seq": rec.seq, "comm_rank": rec.rank, "peer": rec.peer, "count": rec.count,
        "bytes": rec.bytes, "datatype": rec.dtype, "nchannels": rec.nchannels,
        "enqueue_seconds": max(0, rec.stop_ns - rec.start_ns) / 1e9,
        "proxy_ops": rec.proxy_ops, "net_sent_bytes": rec.sent_bytes,
        "net_recv_bytes": rec.recv_bytes,
        "incomplete": bool(rec.flags & Flag.INCOMPLETE), "pid": rec.pid,
    }
    if rec.kernel_ns is not None:
        shift = offset_ns if rec.kernel_clock == "host" else 0
        fields.update(kernel_seconds=max(0, rec.kernel_ns) / 1e9,
                      kernel_start_ns=rec.kernel_start + shift,
                      kernel_end_ns=rec.kernel_stop + shift, kernel_clock=rec.kernel_clock)
    return Record("ncclprof_collective", rec.start_ns + offset_ns, t, fields)


@dataclass
class _ProxySum:
    start_ns: int
    pid: int
    ops: int = 0
    steps: int = 0
    bytes: int = 0
    busy_ns: int = 0
    net_events: int = 0
    net_ns: int = 0
    incomplete: int = 0
    waits: dict[Wait, int] = field(default_factory=lambda: dict.fromkeys(Wait, 0))

    def add(self, rec: NcclProfRecord) -> None:
        self.start_ns = min(self.start_ns, rec.start_ns)
        self.ops += 1
        self.steps += rec.steps
        self.bytes += rec.bytes
        self.busy_ns += max(0, rec.stop_ns - rec.start_ns)
        self.net_events += rec.net_events
        self.net_ns += rec.net_ns
        self.incomplete += bool(rec.flags & Flag.INCOMPLETE)
        for w, ns in rec.waits_ns.items():
            self.waits[w] += ns


class ProxyWindow:
    """Proxy operation records of one poll, summed per (process, comm, peer, channel,
    direction)."""

    def __init__(self) -> None:
        self._sums: dict[tuple, tuple[dict[str, str], _ProxySum]] = {}

    def add(self, rec: NcclProfRecord, tags: dict[str, str]) -> None:
        direction = "send" if rec.flags & Flag.SEND else "recv"
        key = (rec.pid, rec.comm_hash, rec.peer, rec.channel, direction)
        entry = self._sums.get(key)
        if entry is None:
            t = {**tags, "direction": direction, "comm": comm_tag(rec.comm_hash),
                 "peer": str(rec.peer), "channel": str(rec.channel)}
            entry = self._sums[key] = (t, _ProxySum(rec.start_ns, rec.pid))
        entry[1].add(rec)

    def records(self, offsets: dict[int, int]) -> list[Record]:
        """The window's records (offsets: pid -> monotonic-to-epoch shift); empties it."""
        out = []
        for (pid, *_), (tags, s) in self._sums.items():
            waits = _SEND_WAITS if tags["direction"] == "send" else _RECV_WAITS
            fields: dict = {"ops": s.ops, "steps": s.steps, "bytes": s.bytes,
                            "seconds": s.busy_ns / 1e9, "net_events": s.net_events,
                            "net_event_seconds": s.net_ns / 1e9, "incomplete": s.incomplete,
                            "pid": s.pid}
            fields.update({name: s.waits[w] / 1e9 for name, w in waits.items()})
            out.append(Record("ncclprof_proxy", s.start_ns + offsets.get(pid, 0), tags, fields))
        self._sums.clear()
        return out
