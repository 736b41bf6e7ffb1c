"""Probe "ncclprof": the records of fabricscope's NCCL profiler plugin (profiler/,
docs/nccl-profiler.md), read from the shared-memory ring each training process writes.

What it reads: `<ncclprof_dir>/fabricscope-ncclprof-<pid>.ring` (the plugin's
FABRICSCOPE_NCCLPROF_DIR, default /dev/shm; share it with the agent's pod). Every poll
it opens rings that appeared, reads the records published since the last poll (the
reader owns the ring's read index, agent/probes/ncclprof/reader.py) and, once a ring's
process has exited, reads it to the end and deletes the file.

Attribution: the pid in the ring header is looked up as the gloo probe does
(agent/probes/gloo/procs.py): a process in another network namespace belongs to
another node's agent (its ring is left alone, counted `foreign_rings`); a local one
gets job, rank, namespace and pod from its environment and pod. The header's pid is
the writer's getpid(), so the agent must share the training processes' pid namespace
(hostPID in Kubernetes), as for the markers source.

What it exports (fabricscope/measurements/ncclprof.py): ncclprof_collective per
collective and p2p task, ncclprof_proxy per poll window and (comm, peer, channel,
direction). Counters (probe_events_total{probe="ncclprof"}): the plugin's own
(pool_exhausted, orphans, bad_handle, stale_reclaimed, ...) summed over its rings, the
reader's `torn` and `decode_errors`, and `bad_rings`, `foreign_rings`, `rings_removed`;
the plugin's `ring_full` (records it could not publish) is `lost`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from fabricscope.agent.procmaps import shared_environments
from fabricscope.agent.probes.base import Probe, ProbeContext, ProbeUnavailable
from fabricscope.agent.probes.gloo.procs import ProcessTable
from fabricscope.agent.probes.ncclprof.layout import Kind
from fabricscope.agent.probes.ncclprof.reader import RingError, RingReader, ring_paths
from fabricscope.agent.probes.ncclprof.records import ProxyWindow, collective_record, job_tags
from fabricscope.records import Record

log = logging.getLogger("fabricscope.agent.ncclprof")

DEFAULT_DIR = "/dev/shm"
#: records read from one ring per poll at most: a ring holds 8192 by default, so a
#: backlog drains over a few polls instead of stalling one
MAX_PER_POLL = 65536
_OWN = ("bad_rings", "foreign_rings", "rings_removed", "delete_errors")


@dataclass
class _Ring:
    reader: RingReader
    inode: int
    tags: dict[str, str]
    offset_ns: int           # the writer's CLOCK_MONOTONIC -> UNIX epoch ns


class NcclProfProbe(Probe):
    name = "ncclprof"
    needs_bpf = False

    def __init__(self, ctx: ProbeContext, directory: str | None = None,
                 procs: ProcessTable | None = None):
        super().__init__(ctx)
        self.dir = Path(directory or getattr(ctx.config, "ncclprof_dir", "") or DEFAULT_DIR)
        self._procs = procs or ProcessTable(pods=getattr(ctx, "pods", None),
                                          environments=shared_environments(ctx))
        self._rings: dict[Path, _Ring] = {}
        # (path, inode) never to open again: bad or foreign rings (each counted once)
        self._skip: set[tuple[Path, int]] = set()
        self._counts = dict.fromkeys(_OWN, 0)
        self._closed: dict[str, int] = {}      # counters of rings already closed

    def attach(self) -> None:
        if not self.dir.is_dir():
            raise ProbeUnavailable(f"ncclprof_dir {self.dir} is not a directory: set it to "
                                   "the plugin's FABRICSCOPE_NCCLPROF_DIR")
        if not os.access(self.dir, os.R_OK | os.X_OK):
            raise ProbeUnavailable(f"ncclprof_dir {self.dir} is not readable by the agent: "
                                   "run it as root or as the training pods' user")

    def poll(self) -> list[Record]:
        self._discover()
        out: list[Record] = []
        window = ProxyWindow()
        offsets: dict[int, int] = {}
        for path, ring in list(self._rings.items()):
            alive = self._procs.alive(ring.reader.pid)   # before reading: nothing after it
            offsets[ring.reader.pid] = ring.offset_ns
            for rec in ring.reader.poll(MAX_PER_POLL):
                if rec.kind is Kind.PROXY:
                    window.add(rec, ring.tags)
                else:
                    out.append(collective_record(rec, ring.tags, ring.offset_ns))
            caught_up = ring.reader.header.read_index >= ring.reader.header.write_index
            if not alive and caught_up:
                self._close(path, delete=True)
        return out + window.records(offsets)

    def _discover(self) -> None:
        for path in ring_paths(self.dir):
            if path in self._rings:
                continue
            try:
                inode = path.stat().st_ino
            except OSError:
                continue            # removed between listing and stat
            if (path, inode) in self._skip:
                continue
            try:
                reader = RingReader(path, pid_alive=self._procs.alive)
            except RingError as exc:
                self._skip.add((path, inode))
                self._counts["bad_rings"] += 1
                log.warning("ncclprof: skipping %s", exc)
                continue
            ring = self._open(path, inode, reader)
            if ring is not None:
                self._rings[path] = ring

    def _open(self, path: Path, inode: int, reader: RingReader) -> _Ring | None:
        info = self._procs.get(reader.pid)
        if info is not None and not info.local:
            reader.close()
            self._skip.add((path, inode))
            self._counts["foreign_rings"] += 1
            return None
        # gone before we looked (info None): its ring is still read to the end
        tags = job_tags(info, reader.pid)
        h = reader.header
        offset = (h.real_ns_at_open - h.mono_ns_at_open if h.real_ns_at_open
                  else self.ctx.clock.offset_ns)
        return _Ring(reader, inode, tags, offset)

    def _close(self, path: Path, delete: bool) -> None:
        ring = self._rings.pop(path)
        for key, value in ring.reader.counters().items():
            self._closed[key] = self._closed.get(key, 0) + value
        pid = ring.reader.pid
        ring.reader.close()
        if not delete:
            return
        self._procs.forget(pid)        # the pid may be reused by another process
        try:
            path.unlink()
            self._counts["rings_removed"] += 1
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._skip.add((path, ring.inode))     # never read it twice
            self._counts["delete_errors"] += 1
            log.warning("ncclprof: cannot delete %s: %s", path, exc.strerror)

    def stats(self) -> dict[str, int]:
        totals = dict(self._closed)
        for ring in self._rings.values():
            for key, value in ring.reader.counters().items():
                totals[key] = totals.get(key, 0) + value
        totals["lost"] = totals.pop("ring_full", 0)
        return {**totals, **self._counts}

    def detach(self) -> None:
        for path in list(self._rings):
            self._close(path, delete=False)
