"""The agent's queue of serialized batches awaiting an Ack OK: in memory, backed by disk.

    spool = BatchSpool(directory, max_bytes, memory_max_records)   # directory "" = memory only
    restored = spool.open()          # batches a previous run left (resent first)
    dropped = spool.make_room(size)  # oldest batches given up for a new one, counted by caller
    entry = spool.store(seq, payload, count)   # durable when a directory is set (fsync)
    spool.add(seq, payload, count, entry)      # queued for sending
    payload = spool.payload(p)       # cached bytes, else read back from disk
    spool.take(seq)                  # acked OK or REJECTED: forget it (unlink)

Each entry is one serialized fabricscope.v1.Batch (agent_id, seq and
dropped_before already inside), stored with fabricscope.spool.DirSpool under its
seq. A restarted agent therefore resends exactly the bytes the previous run
would have sent, with the previous run's agent_id and seq, and continues seq
numbering above them (a new agent_id), so seq stays unique in the spool and an
Ack (which names only the seq) is never ambiguous.

Memory: payloads are kept in memory while the cached batches hold at most
`memory_max_records` records; the others live only on disk and are read back
when their turn comes (after a long outage: oldest first, from the page cache
or the disk). Without a directory the memory holds everything and is
the cap: `make_room` drops the oldest batches beyond `memory_max_records`.
With a directory the cap is `max_bytes` on disk. Batches written on the current
stream and awaiting their Ack (`sent`) are dropped last, because their Ack may
still arrive and they would then not be lost at all.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

from fabricscope.spool import DirSpool, Entry, SpoolCorrupt, SpoolFull

__all__ = ["BatchSpool", "Pending", "SpoolCorrupt", "SpoolFull"]


@dataclass
class Pending:
    seq: int
    count: int                      # records in the batch
    size: int                       # serialized bytes
    data: bytes | None = None       # None: on disk only
    entry: Entry | None = None      # its file when spooled to disk
    sent: bool = False              # written on the current stream, Ack outstanding
    created: float = field(default_factory=time.time)


class BatchSpool:
    def __init__(self, directory: str, max_bytes: int, memory_max_records: int):
        self.disk = DirSpool(directory, max_bytes) if directory else None
        self.max_bytes = max_bytes
        self.memory_max_records = memory_max_records
        self._items: collections.OrderedDict[int, Pending] = collections.OrderedDict()
        self.records = 0            # records in all pending batches
        self.bytes = 0              # serialized bytes of all pending batches
        self.cached_records = 0     # records whose payload is in memory

    @property
    def durable(self) -> bool:
        return self.disk is not None

    def open(self) -> list[Pending]:
        """Lock the directory and load what a previous run left; [] without a directory."""
        if self.disk is None:
            return []
        restored = [Pending(e.key, e.count, e.size, None, e, created=e.path.stat().st_mtime)
                    for e in self.disk.open()]
        for p in restored:
            self._add(p)
        return restored

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()

    def next_seq(self) -> int:
        return max(self._items, default=0) + 1

    def __len__(self) -> int:
        return len(self._items)

    def oldest_created(self) -> float | None:
        return next(iter(self._items.values())).created if self._items else None

    # --- admission -------------------------------------------------------------------
    def make_room(self, size: int, count: int) -> list[Pending]:
        """Drop the oldest batches (unsent first) so that one of `size` bytes / `count`
        records fits; return them (the caller counts them as lost)."""
        dropped = []
        while self._items and not self._fits(size, count):
            victim = next((p for p in self._items.values() if not p.sent), None) \
                or next(iter(self._items.values()))
            dropped.append(self._remove(victim))
        return dropped

    def _fits(self, size: int, count: int) -> bool:
        if self.disk is not None:
            return self.disk.bytes + size <= self.max_bytes
        return self.records + count <= self.memory_max_records

    def store(self, seq: int, payload: bytes, count: int) -> Entry | None:
        """Write the batch to disk (fsync; runs in a worker thread); None without a
        directory. Raise SpoolFull (no room after make_room) or OSError (disk error)."""
        return self.disk.append(seq, payload, count) if self.disk is not None else None

    def add(self, seq: int, payload: bytes, count: int, entry: Entry | None) -> Pending:
        """Queue a stored batch. Without an entry (memory mode, or the disk failed) the
        payload stays in memory whatever the cache holds: it exists nowhere else."""
        p = Pending(seq, count, len(payload), None, entry)
        if entry is None or self.cached_records + count <= self.memory_max_records:
            p.data = payload
            self.cached_records += count
        self._add(p)
        return p

    def _add(self, p: Pending) -> None:
        self._items[p.seq] = p
        self.records += p.count
        self.bytes += p.size

    # --- sending ---------------------------------------------------------------------
    def next_unsent(self) -> Pending | None:
        return next((p for p in self._items.values() if not p.sent), None)

    def in_flight(self) -> int:
        return sum(1 for p in self._items.values() if p.sent)

    def payload(self, p: Pending) -> bytes:
        """The batch bytes; read back from disk when not cached. Raise SpoolCorrupt."""
        if p.data is not None:
            return p.data
        return self.disk.read(p.entry)

    def take(self, seq: int) -> Pending | None:
        """Remove and return the batch with this seq (None when it is gone)."""
        p = self._items.get(seq)
        return self._remove(p) if p is not None else None

    def unsend(self, seq: int) -> Pending | None:
        p = self._items.get(seq)
        if p is not None:
            p.sent = False
        return p

    def unsend_all(self) -> None:
        for p in self._items.values():
            p.sent = False

    def _remove(self, p: Pending) -> Pending:
        del self._items[p.seq]
        self.records -= p.count
        self.bytes -= p.size
        if p.data is not None:
            self.cached_records -= p.count
            p.data = None
        if p.entry is not None:
            self.disk.remove(p.entry)
        return p
