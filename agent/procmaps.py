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
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

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
    remembered: int = 0               # processes a ScanMemo answered for (maps not read)


@dataclass
class _Seen:
    start: str                        # start time (/proc/PID/stat field 22): which process
    keys: frozenset                   # tracked files it mapped when its maps were last read


def start_time(pid_dir: str) -> str | None:
    """/proc/PID/stat field 22, the process's start time: which process holds the pid
    (None when it cannot be read)."""
    try:
        with open(os.path.join(pid_dir, "stat"), "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[19].decode()
    except (OSError, IndexError):
        return None


def _boot_seconds() -> float:
    # the clock /proc/PID/stat start times count from (in the reader's time namespace)
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass
class ScanMemo:
    """What earlier scans learned of each process, so that most rescans read the maps
    of new processes only: the kernel builds a training process's maps (thousands of
    lines) anew on every read, and a rescan every 2 s of every process is most of
    what the uprobe probes cost when no collective runs. A process is told apart from
    a later one with its pid by its start time. Its maps are read again
    - while it is young: for `young_s` after it started (it may still be loading its
      libraries). Its own age, not the time since a scan first saw it: an agent that
      starts next to a training running for an hour must not reread every maps file
      for a minute (the first scan reads each process once, in any case);
    - at a full rescan, every `full_s` (a late dlopen, or an exec, shows within it);
    - otherwise not: once it mapped a tracked file it keeps it (nobody unloads
      libtorch or libnccl), and an older process that mapped none waits for the next
      full rescan.
    A process whose /proc/PID/stat cannot be read is read every scan."""

    young_s: float = 60.0
    full_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    #: seconds since boot, and the clock ticks per second of the start times
    uptime: Callable[[], float] = _boot_seconds
    ticks_per_s: int = field(default_factory=lambda: os.sysconf("SC_CLK_TCK"))
    procs: dict[int, _Seen] = field(default_factory=dict)
    last_full: float = float("-inf")

    def known(self, pid: int, start: str) -> _Seen | None:
        seen = self.procs.get(pid)
        return seen if seen is not None and seen.start == start else None

    def young(self, seen: _Seen) -> bool:
        try:
            return self.uptime() - int(seen.start) / self.ticks_per_s < self.young_s
        except ValueError:
            return True

    def record(self, pid: int, start: str, keys: set) -> None:
        self.procs[pid] = _Seen(start, frozenset(keys))

    def full_due(self) -> bool:
        return self.clock() - self.last_full >= self.full_s


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
         cache: "MapsCache | None" = None,
         memo: ScanMemo | None = None) -> ScanResult:
    """Read every process's maps; returns the library files in use, with fds open.

    `name`: the basenames of interest. `needles`: substrings one of which every
    matching path contains (e.g. "libnccl"); maps without any are skipped before the
    line parsing, which is most of the cost (about 100 -> 30 us per process here).
    None: parse every process's maps.

    Files already in `known` are not opened again: their pids are refreshed in place
    (in the returned objects, which are the `known` ones). The caller owns the new fds.
    `cache`: maps texts shared with other scans of the same moment (MapsCache).
    `memo`: what earlier scans with the same memo learned; it skips the maps of
    processes that cannot have changed what they map (ScanMemo).
    """
    known = known or {}
    for s in known.values():
        s.pids.clear()
    files: dict[tuple[int, int], Sighting] = dict(known)
    by_ident = {ident: s.key for s in known.values() for ident in s.idents}
    result = ScanResult(files)
    full = memo is None or memo.full_due()
    live: set[int] = set()
    for entry in os.scandir(proc):
        if not entry.name.isdigit() or int(entry.name) in skip_pids:
            continue
        pid = int(entry.name)
        start = start_time(entry.path) if memo is not None else None
        if start is not None:
            live.add(pid)
            seen = memo.known(pid, start)
            if seen is not None and not full and (
                    (seen.keys and seen.keys <= files.keys()) or
                    (not seen.keys and not memo.young(seen))):
                for key in seen.keys:
                    files[key].pids.add(pid)
                result.remembered += 1
                continue
        try:
            text = cache.read(entry.path) if cache is not None else \
                Path(entry.path, "maps").read_text(errors="replace")
        except OSError:
            result.unreadable += 1
            continue
        result.scanned += 1
        mapped: set = set()
        wanted = needles is None or any(n in text for n in needles)
        for m in parse_maps(text, name) if wanted else ():
            key = by_ident.get(m.ident)
            if key is not None:
                files[key].pids.add(pid)
                mapped.add(key)
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
            mapped.add(key)
        if start is not None:
            memo.record(pid, start, mapped)
    if memo is not None:
        memo.procs = {pid: seen for pid, seen in memo.procs.items() if pid in live}
        if full:
            memo.last_full = memo.clock()
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


def keep_newest(kept: dict, key, value, limit: int) -> None:
    """Stores value under key as the newest entry of `kept` (dicts keep insertion
    order), evicting the oldest once `limit` entries are held: a bounded memory of
    processes, whose oldest reads are the likeliest to be of processes long gone."""
    kept.pop(key, None)
    if len(kept) >= limit:
        kept.pop(next(iter(kept)))
    kept[key] = value


class Environments:
    """Each process's environment as a probe read it while the process lived, shared
    by the probes that read /proc/PID/environ (ProbeContext.environments).

    A process that has exited keeps its pid, comm, stat and cgroup until its parent
    reaps it, but not its memory: reading its environ fails (ESRCH here; empty on
    older kernels). An agent that the training starves of CPU may drain a short
    run's events only then, and would take its rank for a process without RANK. Whichever probe read the process while it lived left
    its environment here, under its pid and start time (a later process with the
    same pid is another one). Once the parent has reaped it, nothing of it is left
    to compare: `recall` answers for a pid that no process holds for RECALL_S after
    the read (another process would take the pid only after the kernel handed out
    every other one: pid_max, 32768 here, within those seconds)."""

    RECALL_S = 30.0

    def __init__(self, limit: int = 4096, clock=time.monotonic):
        self.limit, self.clock = limit, clock
        self._kept: dict[str, tuple[str, dict[str, str], float]] = {}
        self._lock = threading.Lock()   # a probe's watcher thread reads too (ProcessTable.witness)
        self.recalled = 0        # environments of exited processes answered from here

    def read(self, pid_dir) -> dict[str, str]:
        """The process's environment; raises OSError as reading environ does, unless
        the environment was read while the process lived."""
        pid_dir = str(pid_dir)
        try:
            raw, failed = Path(pid_dir, "environ").read_bytes(), None
        except OSError as exc:
            raw, failed = b"", exc
        start = start_time(pid_dir)
        if raw:
            env = parse_environ(raw)
            if start is not None:
                with self._lock:
                    keep_newest(self._kept, pid_dir, (start, env, self.clock()), self.limit)
            return env
        kept = self._kept.get(pid_dir)
        if kept is not None and start is not None and kept[0] == start:
            self.recalled += 1
            return kept[1]
        if failed is not None:
            raise failed
        return {}

    def recall(self, pid_dir) -> dict[str, str] | None:
        """The environment of a process that is gone entirely (reaped: its pid directory
        no longer exists), read within RECALL_S; None otherwise."""
        pid_dir = str(pid_dir)
        kept = self._kept.get(pid_dir)
        if kept is None or os.path.exists(pid_dir) or \
                self.clock() - kept[2] > self.RECALL_S:
            return None
        self.recalled += 1
        return kept[1]


def shared_environments(ctx, proc: Path = Path("/proc")) -> Environments:
    """The agent's Environments for reads of the real /proc, else one of its own."""
    shared = getattr(ctx, "environments", None) if proc == Path("/proc") else None
    return shared if shared is not None else Environments()


def parse_environ(raw: bytes) -> dict[str, str]:
    """/proc/PID/environ content (NUL-separated KEY=VALUE) -> dict."""
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out
