"""Source `markers`: training step markers read from the rings of fabricscope.markers.

Each training process writes `<markers_dir>/<pid>.ring` (layout: the docstring of
fabricscope/markers.py, the contract). Every poll this source:
  - opens rings that appeared (a ring whose header is still zero is retried; a
    ring with a wrong magic, version or size is counted as bad and skipped);
  - reads the entries written since its last read; when the writer lapped the
    reader by more than the capacity, the overwritten entries are counted lost;
  - turns step markers into `train_step` records: a step lasts from its marker to
    the next step or done marker of the same process;
  - drains the ring of a process that exited, then deletes the file (a last step
    that never got a closing marker is counted as unterminated).

Liveness is `kill(pid, 0)` on the pid in the ring header, so the agent must share
the training processes' pid namespace (`ip netns exec` does; a Kubernetes
DaemonSet needs hostPID).
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from fabricscope.agent.kube.resolver import Resolution
from fabricscope.agent.procmaps import parse_maps
from fabricscope.agent.probes.base import Probe, ProbeUnavailable
from fabricscope import markers as fmt
from fabricscope.services import pid_alive
from fabricscope.jobs import tags_from_meta
from fabricscope.records import Record

log = logging.getLogger("fabricscope.agent.markers")

_HEADER = struct.Struct("<4sIII Q H")
_ENTRY = struct.Struct("<QII q 40s")
_WRITTEN = struct.Struct("<Q")


class BadRing(ValueError):
    """A ring file that does not follow the layout."""


@dataclass(frozen=True)
class Entry:
    time_ns: int
    kind: int
    value: int
    name: str


class RingReader:
    """One ring file, read incrementally. Raises BadRing from open/read."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < fmt.HEADER_SIZE:
                raise BadRing(f"{size} bytes, shorter than the header")
            self._map = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        magic, version, capacity, pid, _, meta_len = _HEADER.unpack_from(self._map, 0)
        if magic != fmt.MAGIC or version != fmt.VERSION:
            self.close()
            raise BadRing(f"magic {magic!r} version {version}, expected {fmt.MAGIC!r} "
                          f"{fmt.VERSION}")
        if capacity < 1 or size < fmt.HEADER_SIZE + capacity * fmt.ENTRY_SIZE \
                or meta_len > fmt.HEADER_SIZE - _HEADER.size:
            self.close()
            raise BadRing(f"capacity {capacity} / meta {meta_len} bytes do not fit {size} bytes")
        raw_meta = bytes(self._map[_HEADER.size:_HEADER.size + meta_len])
        try:
            meta = json.loads(raw_meta or b"{}")
        except ValueError:
            self.close()
            raise BadRing("metadata is not JSON") from None
        self.capacity, self.pid = capacity, pid
        self.meta = meta if isinstance(meta, dict) else {}
        self.tags = tags_from_meta(self.meta, pid)
        self.read_upto = 0          # entries consumed (index of the next to read)
        self.lost = 0               # entries overwritten before we read them

    @staticmethod
    def initialized(path: Path) -> bool:
        """False while the writer has not yet stamped the header (all zero)."""
        with open(path, "rb") as f:
            return f.read(4) != b"\0\0\0\0"

    def written(self) -> int:
        return _WRITTEN.unpack_from(self._map, 16)[0]

    def read_new(self) -> list[Entry]:
        written = self.written()
        if written < self.read_upto:
            raise BadRing(f"written went back from {self.read_upto} to {written}")
        start = max(self.read_upto, written - self.capacity)
        self.lost += start - self.read_upto
        entries = [self._entry(i) for i in range(start, written)]
        # The writer may have lapped us while we copied: drop what it overwrote.
        overwritten = max(0, self.written() - self.capacity - start)
        if overwritten:
            self.lost += min(overwritten, len(entries))
            entries = entries[overwritten:]
        self.read_upto = written
        return entries

    def _entry(self, i: int) -> Entry:
        off = fmt.HEADER_SIZE + (i % self.capacity) * fmt.ENTRY_SIZE
        time_ns, kind, _, value, name = _ENTRY.unpack_from(self._map, off)
        return Entry(time_ns, kind, value, name.rstrip(b"\0").decode(errors="replace"))

    def close(self) -> None:
        self._map.close()


@dataclass
class _Ring:
    reader: RingReader
    inode: int
    pid: int                                # the writer, as this agent's /proc knows it
    open_step: Entry | None = None          # step marker still waiting for its end


def _maps_inode(base: Path, inode: int) -> bool:
    try:
        text = (base / "maps").read_text()
    except OSError:
        return False
    return any(m.inode == inode for m in parse_maps(text, _ANY_FILE))


_ANY_FILE = re.compile(r"")      # parse_maps matches basenames: every mapped file


def _innermost_pid(base: Path) -> int | None:
    try:
        for line in (base / "status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return None


def writer_pid(proc: Path, header_pid: int, inode: int) -> int | None:
    """The ring's writer as seen in `proc`: the header holds its pid in its own pid
    namespace (a pod's, where the agent has the host's: hostPID). It is the process
    that maps the ring's inode: the header's pid itself where the namespaces agree,
    else the one whose innermost pid (NSpid) is the header's. None when no process
    maps it (the writer has exited, or the file was written without a mapping)."""
    if _maps_inode(proc / str(header_pid), inode):
        return header_pid
    try:
        entries = [e for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return None
    for e in entries:
        base = Path(e.path)
        if _innermost_pid(base) == header_pid and _maps_inode(base, inode):
            return int(e.name)
    return None


@dataclass
class StepTracker:
    """Turns a ring's entries into train_step records."""

    stats: dict[str, int] = field(default_factory=dict)

    def feed(self, ring: _Ring, entries: list[Entry]) -> list[Record]:
        out = []
        for e in entries:
            if e.kind in (fmt.KIND_STEP, fmt.KIND_DONE):
                if ring.open_step is not None:
                    out.append(self._record(ring, ring.open_step, e.time_ns))
                ring.open_step = e if e.kind == fmt.KIND_STEP else None
            elif e.kind in (fmt.KIND_PHASE_BEGIN, fmt.KIND_PHASE_END):
                self.count("phase_markers")      # no phase measurement yet
            else:
                self.count("unknown_kinds")
        return out

    def _record(self, ring: _Ring, step: Entry, end_ns: int) -> Record:
        return Record("train_step", step.time_ns, dict(ring.reader.tags),
                      {"step": int(step.value), "seconds": max(0, end_ns - step.time_ns) / 1e9})

    def count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n


class MarkersSource(Probe):
    name = "markers"
    needs_bpf = False

    def __init__(self, ctx, directory: str | None = None, pid_alive=pid_alive,
                 proc: Path = Path("/proc")):
        super().__init__(ctx)
        self._proc = proc
        self.dir = Path(directory or getattr(ctx.config, "markers_dir", fmt.DEFAULT_DIR))
        self._pid_alive = pid_alive
        self._rings: dict[Path, _Ring] = {}
        # (path, inode) of rings never to open again: bad ones (counted once) and
        # finished ones we could not delete (so they are not read twice).
        self._skip: set[tuple[Path, int]] = set()
        self._tracker = StepTracker()
        self._lost_closed = 0

    def attach(self) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            if self.dir.stat().st_uid == os.geteuid():
                os.chmod(self.dir, 0o1777)   # training may run as any user, like /tmp
        except OSError as exc:
            raise ProbeUnavailable(f"markers directory {self.dir}: {exc.strerror}") from None

    def poll(self) -> list[Record]:
        if getattr(self, "_detached", False):
            return []       # detach() read nothing new; rediscovering would re-read rings
        self._discover()
        out: list[Record] = []
        for path, ring in list(self._rings.items()):
            alive = self._pid_alive(ring.pid)   # before reading: no entry after it
            try:
                out += self._tracker.feed(ring, ring.reader.read_new())
            except BadRing as exc:
                self._mark_bad(path, str(exc), ring.inode)
                self._close(path, delete=False)
                continue
            if not alive:
                if ring.open_step is not None:
                    self._tracker.count("unterminated_steps")
                self._close(path, delete=True)
        return out

    def _discover(self) -> None:
        try:
            entries = list(os.scandir(self.dir))
        except OSError:
            return
        for de in entries:
            path = Path(de.path)
            if not de.name.endswith(".ring") or path in self._rings:
                continue
            try:
                inode = de.inode()
                if (path, inode) in self._skip or not RingReader.initialized(path):
                    continue
                ring = self._open(path, inode)
                if ring is not None:
                    self._rings[path] = ring
            except BadRing as exc:
                self._mark_bad(path, str(exc), inode)
            except OSError:
                continue        # vanished between scandir and open

    def _open(self, path: Path, inode: int) -> _Ring | None:
        """The ring with its writer's pid, and in Kubernetes its pod's tags and training
        job; None while the pod is not listed yet (opened again at the next poll)."""
        reader = RingReader(path)
        pid = writer_pid(self._proc, reader.pid, inode) or reader.pid
        pods = getattr(self.ctx, "pods", None)
        if pods is not None:
            resolution, pod = pods.for_pid(self._proc, pid)
            if resolution is Resolution.PENDING:
                reader.close()
                return None
            if pod is not None:
                reader.tags = {**tags_from_meta(reader.meta, reader.pid, pod.job, pod.index),
                               **pod.tags()}
        return _Ring(reader, inode, pid)

    def _mark_bad(self, path: Path, why: str, inode: int) -> None:
        self._skip.add((path, inode))
        self._tracker.count("bad_rings")
        log.warning("markers: skipping bad ring %s: %s", path, why)

    def _close(self, path: Path, delete: bool) -> None:
        ring = self._rings.pop(path)
        self._skip.add((path, ring.inode))
        self._lost_closed += ring.reader.lost
        ring.reader.close()
        self._tracker.count("rings_closed")
        if delete:
            try:
                path.unlink()
                self._skip.discard((path, ring.inode))
            except FileNotFoundError:
                self._skip.discard((path, ring.inode))
            except OSError as exc:
                self._tracker.count("delete_errors")
                log.warning("markers: cannot delete %s: %s", path, exc.strerror)

    def stats(self) -> dict[str, int]:
        lost = self._lost_closed + sum(r.reader.lost for r in self._rings.values())
        return {"lost": lost, **self._tracker.stats}

    def detach(self) -> None:
        self._detached = True
        for path in list(self._rings):
            self._close(path, delete=False)
