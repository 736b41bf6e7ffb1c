"""A durable FIFO of byte blobs in one directory: the disk spool of agent and collector.

One file per entry, named `<key:020d>-<count>.spool` (key: the order, count: the
records it holds, so that even an unreadable entry's loss can be counted). A
file holds `FSP1`, CRC-32 and length of the payload (little-endian u32 each),
then the payload. An entry is written to a `.tmp` file, fsynced, renamed into
place and the directory fsynced: after `append` returns, the entry survives a
crash of the process or the machine, and a crash mid-write leaves only a
`.tmp` file, removed at the next open. Removing an acknowledged entry is a
plain unlink (not fsynced): after a power loss it may reappear and be sent
again, which the idempotent writes downstream make harmless.

The directory is locked (flock on `.lock`) for as long as the spool is open: two
processes sharing a spool would send each other's data twice and delete it
under each other's feet. The kernel drops the lock when the holder dies, so a
SIGKILLed process never blocks its successor.

`max_bytes` caps the payload bytes on disk: `append` raises SpoolFull and the
owner decides (the agent drops its oldest entries and counts them, the collector
tells its agents to slow down). Thread-safe: the collector appends from several
threads.
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

from fabricscope.errors import UserError

MAGIC = b"FSP1"
_HEADER = struct.Struct("<4sII")
SUFFIX = ".spool"


class SpoolFull(Exception):
    """Appending would exceed max_bytes."""


class SpoolCorrupt(Exception):
    """An entry that cannot be read back (the message says why)."""


@dataclass(frozen=True)
class Entry:
    key: int            # order; unique within the spool
    count: int          # records in the entry (as told to append)
    size: int           # payload bytes
    path: Path


def _parse_name(path: Path) -> tuple[int, int] | None:
    stem = path.name[:-len(SUFFIX)]
    key, _, count = stem.partition("-")
    if not (key.isdigit() and count.isdigit()):
        return None
    return int(key), int(count)


class DirSpool:
    """open() -> entries already there; append/read/remove; close()."""

    def __init__(self, directory: str | Path, max_bytes: int):
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: dict[int, Entry] = {}
        self._lock = threading.Lock()
        self._lock_fd: int | None = None
        self.unreadable: list[Path] = []      # files found at open that are not entries

    def open(self) -> list[Entry]:
        """Create and lock the directory; return the entries left by a previous run."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise UserError(f"cannot use spool directory {self.dir}: {exc.strerror}",
                            "point the spool_dir setting at a writable directory") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise UserError(f"spool directory {self.dir} is in use by another process",
                            "give each agent/collector its own spool_dir") from None
        self._lock_fd = fd
        for path in sorted(self.dir.iterdir()):
            if path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)        # a write that never completed
            elif path.name.endswith(SUFFIX):
                parsed = _parse_name(path)
                if parsed is None:
                    self.unreadable.append(path)
                    continue
                entry = Entry(parsed[0], parsed[1], max(0, path.stat().st_size - _HEADER.size),
                              path)
                self._entries[entry.key] = entry
                self.bytes += entry.size
        return self.entries()

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)          # releases the flock
            self._lock_fd = None

    def entries(self) -> list[Entry]:
        with self._lock:
            return sorted(self._entries.values(), key=lambda e: e.key)

    def __len__(self) -> int:
        return len(self._entries)

    def next_key(self) -> int:
        with self._lock:
            return max(self._entries, default=0) + 1

    def append(self, key: int, payload: bytes, count: int) -> Entry:
        """Durably store payload under key (must be new). Raise SpoolFull."""
        path = self.dir / f"{key:020d}-{count}{SUFFIX}"
        with self._lock:
            if key in self._entries:
                raise ValueError(f"spool key {key} exists")
            if self.bytes + len(payload) > self.max_bytes:
                raise SpoolFull(f"{self.bytes + len(payload)} bytes > {self.max_bytes}")
            entry = Entry(key, count, len(payload), path)
            self._entries[key] = entry         # reserved: bytes count against the cap now
            self.bytes += entry.size
        try:
            self._write(path, payload)
        except BaseException:
            with self._lock:
                self._entries.pop(key, None)
                self.bytes -= entry.size
            raise
        return entry

    def _write(self, path: Path, payload: bytes) -> None:
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(_HEADER.pack(MAGIC, zlib.crc32(payload), len(payload)))
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def read(self, entry: Entry) -> bytes:
        """The payload. Raise SpoolCorrupt (the entry stays until remove())."""
        try:
            data = entry.path.read_bytes()
        except OSError as exc:
            raise SpoolCorrupt(f"{entry.path.name}: {exc.strerror}") from None
        if len(data) < _HEADER.size:
            raise SpoolCorrupt(f"{entry.path.name}: truncated header")
        magic, crc, length = _HEADER.unpack_from(data)
        payload = data[_HEADER.size:]
        if magic != MAGIC or length != len(payload) or zlib.crc32(payload) != crc:
            raise SpoolCorrupt(f"{entry.path.name}: bad magic, length or checksum")
        return payload

    def remove(self, entry: Entry) -> bool:
        """Forget and delete the entry; False when it was already gone."""
        with self._lock:
            if self._entries.pop(entry.key, None) is None:
                return False
            self.bytes -= entry.size
        entry.path.unlink(missing_ok=True)
        return True
