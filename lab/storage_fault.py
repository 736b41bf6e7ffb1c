"""Slow storage: the lab data server's fault, and the pacing that makes it real.

A StorageFault is a rate (bit/s, as tc writes rates) and/or a delay per request.
The data server applies it to every request that starts after it is set:

    GET  delay, then the L payload bytes paced at the rate
    PUT  the L payload bytes read at the rate, then delay, then the ack

The rate holds each request on its own (a per-stream cap, as a throttled
volume or an object store's per-connection throughput; ranks reading at once
each get it). Pacing pays before it sends: a chunk goes out (or is read) only once the clock
allows every byte up to its end at the rate, so a request of L bytes lasts at
least L / rate plus the delay, however slow the machine; it can only last longer.
Chunks are 2 ms worth at the rate and at least one BLOCK (at most the server's I/O
chunk): a throttled store serves a slow read block by block, each block at the
wire's speed with the pause the rate needs after it. A block is larger than the
agent's smallest reported transfer (tcp_transfer_min_bytes, 64 KiB), so every
piece of a slow read is a transfer of its own and the read's span (first block
to last) is seen whole, however long the pauses.

The fault lives in the lab's state file (`Lab.storage_fault`, set by
fabricscope.lab.faults.storage); the data server of a lab (`--lab NAME`) re-reads it only
when the file changed (one stat() per request: Lab.save replaces the file, a new
inode), so a fault takes effect without restarting the server.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass

from fabricscope.lab.units import parse_rate, parse_time

PACE_STEP_S = 0.002
MIN_CHUNK = 80_000     # BLOCK: above the agent's 64 KiB transfer minimum


@dataclass(frozen=True)
class StorageFault:
    rate_bps: int | None = None      # bit/s the payload moves at; None: as fast as it can
    delay_s: float = 0.0             # added to every request before its reply

    def __bool__(self) -> bool:
        return self.rate_bps is not None or self.delay_s > 0

    @classmethod
    def parse(cls, rate=None, delay=None) -> "StorageFault":
        """From tc-style text ('20mbit', '50ms') or numbers (bit/s, s); UserError if bad."""
        return cls(rate_bps=parse_rate(rate) if rate is not None else None,
                   delay_s=parse_time(delay) if delay is not None else 0.0)

    def to_dict(self) -> dict:
        """What Lab.storage_fault records: {} for no fault."""
        return {"rate_bps": self.rate_bps, "delay_s": self.delay_s} if self else {}

    @classmethod
    def from_dict(cls, data) -> "StorageFault":
        if not isinstance(data, dict) or not data:
            return cls()
        rate = data.get("rate_bps")
        return cls(rate_bps=int(rate) if rate else None, delay_s=float(data.get("delay_s") or 0))

    def describe(self) -> str:
        from fabricscope.lab.units import format_rate
        parts = [f"rate {format_rate(self.rate_bps)}"] if self.rate_bps else []
        parts += [f"delay {self.delay_s * 1000:g}ms"] if self.delay_s else []
        return ", ".join(parts) or "none"


def chunk_bytes(rate_bps: int, max_chunk: int) -> int:
    """Bytes per pacing step: PACE_STEP_S at the rate, within [MIN_CHUNK, max_chunk]."""
    return max(1, min(max_chunk, max(MIN_CHUNK, int(rate_bps / 8 * PACE_STEP_S))))


def pace_wait(done_bytes: int, rate_bps: int, elapsed_s: float) -> float:
    """Seconds to wait before `done_bytes` may have moved since the start at the rate."""
    return max(0.0, done_bytes * 8 / rate_bps - elapsed_s)


class Pacer:
    """Holds one request's payload to its rate (started when made)."""

    def __init__(self, rate_bps: int, clock=time.monotonic, sleep=time.sleep):
        if not rate_bps or rate_bps <= 0:
            raise ValueError(f"rate {rate_bps!r} bit/s must be positive")
        self.rate_bps = rate_bps
        self._clock, self._sleep = clock, sleep
        self._start = clock()

    def chunk(self, max_chunk: int) -> int:
        return chunk_bytes(self.rate_bps, max_chunk)

    def wait(self, done_bytes: int) -> None:
        """Return once `done_bytes` in total may have moved (call before sending them,
        or after reading them)."""
        while True:
            left = pace_wait(done_bytes, self.rate_bps, self._clock() - self._start)
            if left <= 0:
                return
            self._sleep(left)


def pacer_for(fault: StorageFault) -> Pacer | None:
    return Pacer(fault.rate_bps) if fault.rate_bps else None


class Watcher:
    """The storage fault in a lab's state file, re-read when the file changes.

    current() costs one stat() when nothing changed. A missing or unreadable file
    means no fault (the lab is gone: nothing to slow). on_change(fault) is called
    whenever the fault read differs from the one before."""

    def __init__(self, path: str, on_change=None):
        self.path = path
        self._on_change = on_change
        self._lock = threading.Lock()
        self._seen: tuple | None = None
        self._fault = StorageFault()

    def current(self) -> StorageFault:
        try:
            st = os.stat(self.path)
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            key = None
        with self._lock:
            if key != self._seen:
                self._seen = key
                fault = self._read() if key else StorageFault()
                if fault != self._fault and self._on_change:
                    self._on_change(fault)
                self._fault = fault
            return self._fault

    def _read(self) -> StorageFault:
        try:
            with open(self.path) as fh:
                return StorageFault.from_dict(json.load(fh).get("storage_fault"))
        except (OSError, ValueError, AttributeError, TypeError):
            return StorageFault()

