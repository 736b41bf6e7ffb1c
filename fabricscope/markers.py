"""Training markers: `step(n)` and `phase(name)`, picked up by the node's agent.

Dependency-free (standard library only) so any training script can import it:

    from fabricscope import markers
    for n, batch in enumerate(loader):
        markers.step(n)
        with markers.phase("data_load"):
            ...
    markers.done()

Each process writes into its own memory-mapped ring file
`$FABRICSCOPE_MARKERS_DIR/<pid>.ring` (default /run/fabricscope/markers); the
agent of the node polls the ring files there. No socket, no syscall per marker:
a call is a clock read and a struct write into shared memory. When the directory
cannot be created, markers are disabled for the process (one line on stderr).

Ring layout (little endian), the contract with agent/sources/markers.py:

    header, 512 bytes:
      0  char[4] magic "FSMK"     4  u32 version (1)   8  u32 capacity (entries)
      12 u32 pid                  16 u64 written (entries ever written)
      24 u16 meta_len             26 char[meta_len] JSON metadata (rank, job, ...)
    entry i at 512 + (i % capacity) * 64:
      0 u64 time_ns (CLOCK_REALTIME)  8 u32 kind  12 u32 reserved  16 i64 value
      24 char[40] name (UTF-8, NUL padded)

The writer fills the entry, then bumps `written`; a reader that sees `written`
move by more than `capacity` since its last read counts the overwritten entries
as lost.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
import sys
import time

MAGIC = b"FSMK"
VERSION = 1
HEADER_SIZE = 512
ENTRY_SIZE = 64
CAPACITY = 4096
KIND_STEP, KIND_PHASE_BEGIN, KIND_PHASE_END, KIND_DONE = 1, 2, 3, 4
KIND_NAMES = {KIND_STEP: "step", KIND_PHASE_BEGIN: "phase_begin", KIND_PHASE_END: "phase_end",
              KIND_DONE: "done"}
DEFAULT_DIR = "/run/fabricscope/markers"
META_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "FABRICSCOPE_JOB")

_HEADER = struct.Struct("<4sIII Q H")
_ENTRY = struct.Struct("<QII q 40s")
_WRITTEN = struct.Struct("<Q")


class _Ring:
    def __init__(self, path: str):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, HEADER_SIZE + CAPACITY * ENTRY_SIZE)
            self.map = mmap.mmap(fd, HEADER_SIZE + CAPACITY * ENTRY_SIZE)
        finally:
            os.close(fd)
        meta = {k.lower(): os.environ[k] for k in META_ENV if k in os.environ}
        meta_bytes = json.dumps(meta).encode()[: HEADER_SIZE - _HEADER.size]
        self.written = 0
        self.map[_HEADER.size:_HEADER.size + len(meta_bytes)] = meta_bytes
        _HEADER.pack_into(self.map, 0, MAGIC, VERSION, CAPACITY, os.getpid(), 0, len(meta_bytes))
        self.path = path

    def put(self, kind: int, value: int, name: bytes = b"") -> None:
        off = HEADER_SIZE + (self.written % CAPACITY) * ENTRY_SIZE
        _ENTRY.pack_into(self.map, off, time.time_ns(), kind, 0, value, name)
        self.written += 1
        _WRITTEN.pack_into(self.map, 16, self.written)


_ring: _Ring | None = None
_opened = False          # this process has tried to open its ring
_disabled = False


def _after_fork_in_child() -> None:
    # A forked child writes its own ring; checking the pid on every call instead
    # would cost ~120 ns of a ~500 ns marker.
    global _ring, _opened
    _ring, _opened = None, False


os.register_at_fork(after_in_child=_after_fork_in_child)


def _get() -> _Ring | None:
    global _ring, _opened, _disabled
    if _opened:
        return _ring
    if _disabled:
        return None
    directory = os.environ.get("FABRICSCOPE_MARKERS_DIR", DEFAULT_DIR)
    try:
        os.makedirs(directory, exist_ok=True)
        _ring = _Ring(os.path.join(directory, f"{os.getpid()}.ring"))
    except OSError as exc:
        print(f"fabricscope.markers: disabled, cannot write {directory}: {exc.strerror}; "
              "fix: set FABRICSCOPE_MARKERS_DIR to a writable directory", file=sys.stderr)
        _disabled = True
        _ring = None
    _opened = True
    return _ring


def step(n: int) -> None:
    """Mark the start of training step n (the previous step ends here)."""
    ring = _get()
    if ring is not None:
        ring.put(KIND_STEP, n)


@contextlib.contextmanager
def phase(name: str):
    """Mark a phase (e.g. "data_load", "forward", "checkpoint") as a `with` block."""
    ring = _get()
    raw = name.encode()[:40]
    if ring is not None:
        ring.put(KIND_PHASE_BEGIN, 0, raw)
    try:
        yield
    finally:
        if ring is not None:
            ring.put(KIND_PHASE_END, 0, raw)


def done() -> None:
    """Mark the end of the last step."""
    ring = _get()
    if ring is not None:
        ring.put(KIND_DONE, 0)
