"""Reads the plugin's rings: one file per training process, records decoded in order.

The reader owns read_index (the producers never pass it, so a record stays put until it
is consumed). A record reserved but never published (its producer died, or stalled
mid-copy across two polls while later records were published) is skipped and counted
`torn`; records that do not decode are skipped and counted `decode_errors`.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

from fabricscope.agent.probes.ncclprof.layout import (
    ALGOS, DTYPES, FUNCS, HEADER_SIZE, MAGIC, PROTOS, RECORD_SIZE, VERSION, Counter, Flag, Kind,
    RawRecord, RingHeader, Wait)

RING_GLOB = "fabricscope-ncclprof-*.ring"


class RingError(Exception):
    """A ring file that cannot be read; the message names the cause and the fix."""


class DecodeError(ValueError):
    pass


@dataclass(frozen=True)
class NcclProfRecord:
    kind: Kind
    pid: int
    comm_hash: int
    seq: int
    func: str
    algo: str
    proto: str
    dtype: str
    rank: int
    peer: int                    # root (coll), peer (p2p, proxy op)
    count: int
    bytes: int                   # count x element size (coll, p2p); moved (proxy op)
    start_ns: int                # host CLOCK_MONOTONIC
    stop_ns: int
    kernel_start: int | None     # in kernel_clock's domain
    kernel_stop: int | None
    kernel_clock: str | None     # "gpu" (globaltimer) or "host"
    waits_ns: dict[Wait, int]
    sent_bytes: int
    recv_bytes: int
    net_ns: int
    net_bytes: int
    net_events: int
    net_qp: int
    proxy_ops: int
    steps: int
    kernel_chs: int
    channel: int
    nsteps: int
    nchannels: int
    flags: Flag

    @property
    def kernel_ns(self) -> int | None:
        """Execution time on the GPU (or as the proxy saw it); None without kernel events."""
        if self.kernel_start is None or self.kernel_stop is None:
            return None
        return self.kernel_stop - self.kernel_start


def _name(table: tuple[str, ...], code: int, what: str) -> str:
    if code >= len(table):
        raise DecodeError(f"unknown {what} code {code}")
    return table[code]


def decode(raw: RawRecord, pid: int) -> NcclProfRecord:
    try:
        kind = Kind(raw.kind)
    except ValueError:
        raise DecodeError(f"unknown record kind {raw.kind}") from None
    flags = Flag(raw.flags & 0x1F)
    clock = "gpu" if flags & Flag.GPU_TIMER else "host" if flags & Flag.KERNEL_HOST else None
    return NcclProfRecord(
        kind=kind, pid=pid, comm_hash=raw.comm_hash, seq=raw.seq,
        func=_name(FUNCS, raw.func, "function"), algo=_name(ALGOS, raw.algo, "algorithm"),
        proto=_name(PROTOS, raw.proto, "protocol"), dtype=_name(DTYPES, raw.dtype, "datatype"),
        rank=raw.rank, peer=raw.peer, count=raw.count, bytes=raw.bytes,
        start_ns=raw.start_ns, stop_ns=raw.stop_ns,
        kernel_start=raw.gpu_start if clock else None, kernel_stop=raw.gpu_stop if clock else None,
        kernel_clock=clock, waits_ns={w: raw.wait_ns[w] for w in Wait},
        sent_bytes=raw.sent_bytes, recv_bytes=raw.recv_bytes, net_ns=raw.net_ns,
        net_bytes=raw.net_bytes, net_events=raw.net_events, net_qp=raw.net_qp,
        proxy_ops=raw.proxy_ops, steps=raw.steps, kernel_chs=raw.kernel_chs,
        channel=raw.channel, nsteps=raw.nsteps, nchannels=raw.nchannels, flags=flags)


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


class RingReader:
    """One mapped ring. `poll()` returns the records published since the last poll."""

    def __init__(self, path: str | os.PathLike, pid_alive=_pid_alive):
        self.path = Path(path)
        self._pid_alive = pid_alive
        try:
            fd = os.open(self.path, os.O_RDWR)
        except OSError as e:
            raise RingError(f"{self.path}: cannot open ({e.strerror}); run the agent as the "
                            "training pods' user or root") from None
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE:
                raise RingError(f"{self.path}: {size} bytes, shorter than the ring header; "
                                "not a fabricscope profiler ring (remove the file)")
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.header = RingHeader.from_buffer(self._map)
        problem = self._problem(size)
        if problem:
            self.close()
            raise RingError(f"{self.path}: {problem}; build the plugin and the agent from the "
                            "same fabricscope release")
        self.torn = 0
        self.decode_errors = 0
        self._stuck_at: int | None = None

    def _problem(self, size: int) -> str | None:
        h = self.header
        if h.magic != MAGIC:
            return f"magic {h.magic:#x} is not the profiler's"
        if h.version != VERSION or h.record_size != RECORD_SIZE:
            return (f"ring version {h.version} with {h.record_size}-byte records, this agent "
                    f"reads version {VERSION} with {RECORD_SIZE}")
        if h.capacity == 0 or h.capacity & (h.capacity - 1) or \
                size < HEADER_SIZE + h.capacity * RECORD_SIZE:
            return f"capacity {h.capacity} does not fit the file's {size} bytes"
        return None

    @property
    def pid(self) -> int:
        return self.header.pid

    def producer_gone(self) -> bool:
        return bool(self.header.closed) or not self._pid_alive(self.header.pid)

    def _slot(self, index: int) -> RawRecord:
        offset = HEADER_SIZE + (index & (self.header.capacity - 1)) * RECORD_SIZE
        return RawRecord.from_buffer_copy(self._map, offset)

    def poll(self, limit: int | None = None) -> list[NcclProfRecord]:
        h = self.header
        read, write = h.read_index, h.write_index
        out: list[NcclProfRecord] = []
        while read < write and (limit is None or len(out) < limit):
            raw = self._slot(read)
            if raw.commit != read + 1:
                if not self._skip_unpublished(read, write):
                    break
                self.torn += 1
            else:
                try:
                    out.append(decode(raw, h.pid))
                except DecodeError:
                    self.decode_errors += 1
            read += 1
        h.read_index = read
        return out

    def _skip_unpublished(self, index: int, write: int) -> bool:
        if self.producer_gone():
            return True
        later_published = any(self._slot(i).commit == i + 1 for i in range(index + 1, write))
        if self._stuck_at == index and later_published:
            self._stuck_at = None
            return True
        self._stuck_at = index
        return False

    def counters(self) -> dict[str, int]:
        """The plugin's counters by name, and the reader's own (torn, decode_errors)."""
        c = {k.name.lower(): int(self.header.counters[k]) for k in Counter}
        return {**c, "torn": self.torn, "decode_errors": self.decode_errors}

    def close(self) -> None:
        self.header = None      # release the buffer export before closing the map
        if self._map is not None:
            self._map.close()
            self._map = None


def ring_paths(directory: str | os.PathLike) -> list[Path]:
    return sorted(Path(directory).glob(RING_GLOB))
