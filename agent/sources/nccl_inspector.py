"""Source `nccl_inspector`: NCCL Inspector's JSON dumps (NCCL >= 2.28), followed as files.

NCCL Inspector (NVIDIA/nccl plugins/profiler/inspector, a profiler plugin) appends one
compact JSON object per line and per completed operation to
`<NCCL_INSPECTOR_DUMP_DIR>/<hostname>-pid<pid>.log`: `header` (communicator hash, name,
rank, ranks, nodes), `metadata` (dump time in us, host, pid) and `coll_perf` or
`p2p_perf` (operation, sequence number, message size, execution time, timing source,
algbw, busbw; with NCCL_INSPECTOR_DUMP_VERBOSE=1 also the start time). Every poll this
source reads the lines appended to each `*.log` file of `nccl_inspector_dir` since
the last poll (files present at start are followed from their end, as `tail -F`; a file
that shrank is read again from its start, counted `truncated`), and turns each into a
nccl_inspector_collective record tagged with the process's job and rank (its pid's
environment, as the gloo probe does; the agent must share the training pods' pid
namespace). A line that is not such an object is counted `malformed_lines` and skipped;
a partial last line waits for its end.

Inspector's Prometheus mode (NCCL_INSPECTOR_PROM_DUMP=1) writes per-GPU aggregates
without rank or sequence numbers for node_exporter's textfile collector; this source
reads the JSON mode only. Inspector runs instead of fabricscope's profiler plugin (NCCL
loads one profiler plugin).
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

from fabricscope.agent.procmaps import shared_environments
from fabricscope.agent.probes.base import Probe, ProbeContext, ProbeUnavailable
from fabricscope.agent.probes.gloo.procs import ProcessTable
from fabricscope.agent.probes.ncclprof.records import job_tags
from fabricscope.records import Record

log = logging.getLogger("fabricscope.agent.nccl_inspector")

#: bytes read from one file per poll at most (~4,000 operations): a backlog spreads
#: over polls instead of stalling one
MAX_READ = 2 << 20


class Malformed(ValueError):
    """A dump line that is not an Inspector operation object."""


@dataclass
class _File:
    inode: int
    offset: int
    partial: bytes = b""


def _int(obj: dict, key: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise Malformed(f"{key} is not an integer")
    return value


def _gbs(value) -> float | None:
    """A bandwidth: Inspector writes NaN as the string "nan"."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def parse_line(line: bytes) -> tuple[int, dict[str, str], dict]:
    """(time_ns, tags without job/rank, fields) of one dump line. Raises Malformed."""
    try:
        obj = json.loads(line)
    except ValueError:
        raise Malformed("not JSON") from None
    if not isinstance(obj, dict):
        raise Malformed("not an object")
    header, meta = obj.get("header"), obj.get("metadata")
    kind = "coll" if "coll_perf" in obj else "p2p" if "p2p_perf" in obj else None
    perf = obj.get(f"{kind}_perf")
    if kind is None or not all(isinstance(x, dict) for x in (header, meta, perf)):
        raise Malformed("no header, metadata and coll_perf or p2p_perf")
    op, comm = perf.get(kind), header.get("id")
    if not isinstance(op, str) or not isinstance(comm, str):
        raise Malformed(f"{kind} or header.id is not a string")
    tags = {"op": op, "kind": kind, "comm": comm, "host": str(meta.get("hostname", "")),
            "timing": str(perf.get(f"{kind}_timing_source", "unknown"))}
    name = header.get("comm_name")
    if isinstance(name, str) and name and name != "unknown":
        tags["comm_name"] = name
    fields = {"seq": _int(perf, f"{kind}_sn"), "comm_rank": _int(header, "rank"),
              "bytes": _int(perf, f"{kind}_msg_size_bytes"),
              "exec_seconds": _int(perf, f"{kind}_exec_time_us") / 1e6,
              "nranks": _int(header, "n_ranks"), "nnodes": _int(header, "nnodes"),
              "pid": _int(meta, "pid")}
    for key in ("algbw", "busbw"):
        value = _gbs(perf.get(f"{kind}_{'algobw' if key == 'algbw' else key}_gbs"))
        if value is not None:
            fields[f"{key}_gbs"] = value
    if kind == "p2p":
        fields["peer"] = _int(perf, "p2p_peer")
    trace = perf.get("event_trace_ts")
    start = trace.get(f"{kind}_start_ts") if isinstance(trace, dict) else None
    time_us = start if isinstance(start, int) and start > 0 else _int(meta, "dump_timestamp_us")
    if time_us <= 0:
        raise Malformed("no positive timestamp")
    return time_us * 1000, tags, fields


class NcclInspectorSource(Probe):
    name = "nccl_inspector"
    needs_bpf = False

    def __init__(self, ctx: ProbeContext, directory: str | None = None,
                 procs: ProcessTable | None = None):
        super().__init__(ctx)
        self.dir = Path(directory or getattr(ctx.config, "nccl_inspector_dir", "") or "")
        self._procs = procs or ProcessTable(pods=getattr(ctx, "pods", None),
                                          environments=shared_environments(ctx))
        self._files: dict[Path, _File] = {}
        self._counts = {"lines": 0, "malformed_lines": 0, "truncated": 0, "read_errors": 0}
        self._warned: set[Path] = set()

    def attach(self) -> None:
        if not str(self.dir) or str(self.dir) == ".":
            raise ProbeUnavailable("nccl_inspector_dir is not set: give the training "
                                   "job's NCCL_INSPECTOR_DUMP_DIR")
        if not self.dir.is_dir():
            raise ProbeUnavailable(f"nccl_inspector_dir {self.dir} is not a directory: set "
                                   "it to the training job's NCCL_INSPECTOR_DUMP_DIR")
        self._scan(at_end=True)

    def poll(self) -> list[Record]:
        self._scan(at_end=False)
        out: list[Record] = []
        for path, state in list(self._files.items()):
            for line in self._read_lines(path, state):
                record = self._record(path, line)
                if record is not None:
                    out.append(record)
        return out

    def _scan(self, at_end: bool) -> None:
        try:
            found = {Path(e.path): e for e in os.scandir(self.dir) if e.name.endswith(".log")}
        except OSError:
            return
        for path in [p for p in self._files if p not in found]:
            del self._files[path]       # removed: forget it
        for path, entry in found.items():
            try:
                st = entry.stat()
            except OSError:
                continue
            known = self._files.get(path)
            if known is None or known.inode != st.st_ino:    # new, or replaced
                self._files[path] = _File(st.st_ino, st.st_size if at_end else 0)
            elif st.st_size < known.offset:
                self._counts["truncated"] += 1
                self._files[path] = _File(st.st_ino, 0)

    def _read_lines(self, path: Path, state: _File) -> list[bytes]:
        try:
            with open(path, "rb") as f:
                f.seek(state.offset)
                data = f.read(MAX_READ)
        except OSError as exc:
            self._counts["read_errors"] += 1
            if path not in self._warned:
                self._warned.add(path)
                log.warning("nccl_inspector: cannot read %s: %s (run the agent as the "
                            "training job's user or root)", path, exc.strerror)
            return []
        state.offset += len(data)
        *lines, state.partial = (state.partial + data).split(b"\n")
        return [line for line in lines if line.strip()]

    def _record(self, path: Path, line: bytes) -> Record | None:
        self._counts["lines"] += 1
        try:
            time_ns, tags, fields = parse_line(line)
        except Malformed as exc:
            self._counts["malformed_lines"] += 1
            if path not in self._warned:
                self._warned.add(path)
                log.warning("nccl_inspector: skipping a line of %s: %s (counted in "
                            "probe_events_total{event=\"malformed_lines\"})", path, exc)
            return None
        return Record("nccl_inspector_collective", time_ns,
                      {**self._job_tags(fields["pid"]), **tags}, fields)

    def _job_tags(self, pid: int) -> dict[str, str]:
        return job_tags(self._procs.get(pid), pid)

    def stats(self) -> dict[str, int]:
        return dict(self._counts)
