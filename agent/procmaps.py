"""Which library files running processes map (/proc/PID/maps), and their environment.

Shared by the uprobe probes: nccl (libnccl.so) and gloo (libtorch_cpu.so) pass
their own basename pattern; nothing here knows a library. parse_environ() reads
/proc/PID/environ for the gloo probe and the TCP flow owners.

Uprobes are per file (inode), not per process: one attachment to a library
file covers every process that maps it, now or later. So discovery answers
"which library files are in use, by which pids", and a probe attaches once
per file. A process in a container maps a path of its own mount namespace; the
file is opened through /proc/PID/map_files/<range> (the very mapped file, even
when deleted or in another mount namespace; needs CAP_SYS_ADMIN) or, failing
that, /proc/PID/root/<path>. Files are identified by (st_dev, st_ino) of the
opened file, so the same library seen through different paths is one file.

parse_maps() is pure (unit-tested); scan() reads a /proc tree (a fake one in tests).
"""

from __future__ import annotations

import os
import time
import re
from dataclasses import dataclass, field
from pathlib import Path

_MAPS_LINE = re.compile(
    r"^(?P<start>[0-9a-f]+)-(?P<end>[0-9a-f]+)\s+\S+\s+[0-9a-f]+\s+"
    r"(?P<dev>[0-9a-f]+:[0-9a-f]+)\s+(?P<inode>\d+)\s+(?P<path>/.*?)(?P<deleted> \(deleted\))?$")


@dataclass(frozen=True)
class Mapping:
    """One file-backed mapping of a matching library in a process."""

    start: int
    end: int
    dev: str           # major:minor as /proc/PID/maps shows it
    inode: int
    path: str          # in the process's mount namespace
    deleted: bool

    @property
    def ident(self) -> tuple[str, int]:
        return (self.dev, self.inode)


def parse_maps(text: str, name: re.Pattern) -> list[Mapping]:
    """Mappings of files whose basename matches `name`, one per distinct inode."""
    seen: dict[tuple[str, int], Mapping] = {}
    for line in text.splitlines():
        m = _MAPS_LINE.match(line)
        if not m or m.group("inode") == "0":
            continue
        path = m.group("path")
        if not name.match(os.path.basename(path)):
            continue
        found = Mapping(int(m.group("start"), 16), int(m.group("end"), 16), m.group("dev"),
                        int(m.group("inode")), path, bool(m.group("deleted")))
        seen.setdefault(found.ident, found)
    return list(seen.values())


@dataclass
class Sighting:
    """A library file in use: an open descriptor on it and the pids that map it."""

    key: tuple[int, int]              # (st_dev, st_ino)
    fd: int
    shown_path: str                   # the path as the first process saw it
    pids: set[int] = field(default_factory=set)
    #: (dev, inode) as processes' maps show the file (may differ from st_dev, st_ino)
    idents: set[tuple[str, int]] = field(default_factory=set)


@dataclass
class ScanResult:
    files: dict[tuple[int, int], Sighting]
    scanned: int = 0                  # processes whose maps were read
    unreadable: int = 0               # processes that vanished or refused


def _open_mapping(proc: Path, pid: int, m: Mapping) -> int | None:
    candidates = [proc / str(pid) / "map_files" / f"{m.start:x}-{m.end:x}"]
    if not m.deleted:
        candidates.append(proc / str(pid) / "root" / m.path.lstrip("/"))
    for path in candidates:
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
    return None


def scan(proc: Path, name: re.Pattern,
         known: dict[tuple[int, int], Sighting] | None = None,
         skip_pids: frozenset[int] = frozenset(),
         needles: tuple[str, ...] | None = None,
         cache: "MapsCache | None" = None) -> ScanResult:
    """Read every process's maps; returns the library files in use, with fds open.

    `name`: the basenames of interest. `needles`: substrings one of which every
    matching path contains (e.g. "libnccl"); maps without any are skipped before the
    line parsing, which is most of the cost (about 100 -> 30 us per process here).
    None: parse every process's maps.

    Files already in `known` are not opened again: their pids are refreshed in place
    (in the returned objects, which are the `known` ones). The caller owns the new fds.
    `cache`: maps texts shared with other scans of the same moment (MapsCache).
    """
    known = known or {}
    for s in known.values():
        s.pids.clear()
    files: dict[tuple[int, int], Sighting] = dict(known)
    by_ident = {ident: s.key for s in known.values() for ident in s.idents}
    result = ScanResult(files)
    for entry in os.scandir(proc):
        if not entry.name.isdigit() or int(entry.name) in skip_pids:
            continue
        pid = int(entry.name)
        try:
            text = cache.read(entry.path) if cache is not None else \
                Path(entry.path, "maps").read_text(errors="replace")
        except OSError:
            result.unreadable += 1
            continue
        result.scanned += 1
        if needles is not None and not any(n in text for n in needles):
            continue
        for m in parse_maps(text, name):
            key = by_ident.get(m.ident)
            if key is not None:
                files[key].pids.add(pid)
                continue
            fd = _open_mapping(proc, pid, m)
            if fd is None:
                result.unreadable += 1
                continue
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            if key in files:
                os.close(fd)
            else:
                files[key] = Sighting(key, fd, m.path)
            files[key].idents.add(m.ident)
            by_ident[m.ident] = key
            files[key].pids.add(pid)
    return result


class MapsCache:
    """/proc/PID/maps texts, kept `ttl_s`: the gloo and NCCL probes rescan in the same
    poll, and the kernel builds a training process's maps (thousands of lines) anew on
    every read; one read serves both. Shared through ProbeContext."""

    def __init__(self, ttl_s: float = 1.0, clock=time.monotonic):
        self.ttl_s, self.clock = ttl_s, clock
        self._texts: dict[str, tuple[float, str]] = {}
        self.hits = 0

    def read(self, pid_dir: str) -> str:
        now = self.clock()
        hit = self._texts.get(pid_dir)
        if hit is not None and now - hit[0] < self.ttl_s:
            self.hits += 1
            return hit[1]
        if len(self._texts) > 4096 or (self._texts and hit is None and
                                       now - next(iter(self._texts.values()))[0] >= self.ttl_s):
            self._texts = {k: v for k, v in self._texts.items() if now - v[0] < self.ttl_s}
        text = Path(pid_dir, "maps").read_text(errors="replace")
        self._texts[pid_dir] = (now, text)
        return text


def open_path(path: str) -> Sighting:
    """A configured library path, opened (raises OSError when it cannot be)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    st = os.fstat(fd)
    return Sighting((st.st_dev, st.st_ino), fd, path)


def parse_environ(raw: bytes) -> dict[str, str]:
    """/proc/PID/environ content (NUL-separated KEY=VALUE) -> dict."""
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out
