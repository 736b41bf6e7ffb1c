"""Follow a log file that is being written (like `tail -F`) or a stream, in whole lines.

FileTail survives rotation (the path now names another file: the rest of the old
one is read first, then the new one from its start) and truncation (the file got
shorter than what was read: start again from 0). StreamTail reads what a pipe
(stdin) has, without blocking. Both return complete lines only, keep a partial
last line for the next read, and count lines dropped for being over `max_line`
bytes. Reads are bounded per call so one busy file cannot stall the agent.
"""

from __future__ import annotations

import os
import select
from dataclasses import dataclass, field


@dataclass
class TailStats:
    rotations: int = 0
    truncations: int = 0
    overlong: int = 0
    bytes: int = 0


@dataclass
class _Splitter:
    max_line: int
    stats: TailStats
    partial: bytes = b""
    skipping: bool = False     # inside an overlong line: drop until its newline

    def feed(self, data: bytes) -> list[str]:
        self.stats.bytes += len(data)
        buf = self.partial + data
        parts = buf.split(b"\n")
        self.partial = parts.pop()
        lines = []
        for part in parts:
            if self.skipping:
                self.skipping = False
                continue
            if len(part) > self.max_line:
                self.stats.overlong += 1
                continue
            lines.append(part.decode("utf-8", "replace"))
        if len(self.partial) > self.max_line:
            if not self.skipping:
                self.stats.overlong += 1
            self.skipping, self.partial = True, b""
        return lines

    def flush(self) -> list[str]:
        """The unterminated last line (at rotation or end of stream)."""
        rest, self.partial = self.partial, b""
        if self.skipping or not rest:
            self.skipping = False
            return []
        return [rest.decode("utf-8", "replace")]


@dataclass
class FileTail:
    path: str
    max_line: int = 65536
    chunk: int = 1 << 20
    stats: TailStats = field(default_factory=TailStats)
    _fd: int | None = None
    _ino: tuple[int, int] | None = None
    _offset: int = 0
    _split: _Splitter | None = None

    def __post_init__(self) -> None:
        self._split = _Splitter(self.max_line, self.stats)

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def _open(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return False
        st = os.fstat(fd)
        self._fd, self._ino, self._offset = fd, (st.st_dev, st.st_ino), 0
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None

    def _drain(self, budget: int) -> list[str]:
        lines: list[str] = []
        while budget > 0:
            data = os.pread(self._fd, min(self.chunk, budget), self._offset)
            if not data:
                break
            self._offset += len(data)
            budget -= len(data)
            lines += self._split.feed(data)
        return lines

    def read_lines(self, max_bytes: int = 4 << 20) -> list[str]:
        if self._fd is None and not self._open():
            return []
        if os.fstat(self._fd).st_size < self._offset:
            self.stats.truncations += 1
            self._offset = 0
            self._split.partial, self._split.skipping = b"", False
        lines = self._drain(max_bytes)
        if os.fstat(self._fd).st_size <= self._offset and self._rotated():
            # The old file is read to its end: switch to the new one.
            lines += self._split.flush()
            self.close()
            self.stats.rotations += 1
            if self._open():
                lines += self._drain(max_bytes)
        return lines

    def finished(self) -> bool:
        """The path is gone and the open file is read to its end: nothing more will come."""
        if os.path.exists(self.path):
            return False
        return self._fd is None or os.fstat(self._fd).st_size <= self._offset

    def _rotated(self) -> bool:
        try:
            st = os.stat(self.path)
        except OSError:
            return False          # removed, not yet recreated: keep the old one
        return (st.st_dev, st.st_ino) != self._ino


@dataclass
class StreamTail:
    """A pipe or terminal (e.g. stdin): non-blocking reads of what is there."""

    fd: int
    max_line: int = 65536
    stats: TailStats = field(default_factory=TailStats)
    eof: bool = False
    _split: _Splitter | None = None

    def __post_init__(self) -> None:
        self._split = _Splitter(self.max_line, self.stats)

    def read_lines(self, max_bytes: int = 4 << 20) -> list[str]:
        lines: list[str] = []
        # select() before each read instead of O_NONBLOCK: that flag would also
        # change the stream for the other processes sharing it (a terminal).
        while not self.eof and max_bytes > 0 and select.select([self.fd], [], [], 0)[0]:
            data = os.read(self.fd, min(1 << 16, max_bytes))
            if not data:
                self.eof = True
                lines += self._split.flush()
                break
            max_bytes -= len(data)
            lines += self._split.feed(data)
        return lines

    def close(self) -> None:
        pass   # the stream is not ours to close
