"""Probe "nccl": every NCCL API call of every process on the node, from uprobes on libnccl.

What it hooks: uprobes (entry) and uretprobes on the exported NCCL functions
(collectives and their *Config variants, Send/Recv, GroupStart/End, communicator
init/split/shrink/grow/destroy/abort/finalize) of each libnccl.so file in use;
see bpf/nccl.bpf.c. Which files: those in `nccl_paths` (attached at start, so
every call of a process started later is seen from its first one) and those
found mapped in running processes (/proc/PID/maps, also inside containers),
rescanned every `rescan_s`; a discovered file is detached once no process maps
it any more. Calls a process makes before its library is discovered are missed.

What it exports: nccl_call (one record per call, exact) and nccl_comm
(fabricscope/measurements/collectives.py), and nccl_step (steps inferred from the
calls' repeating pattern, agent/probes/nccl/steps.py; processes of this node only).
Times are enqueue times.

What it costs: a uprobe is a trap into the kernel; each probed call pays it
twice (entry and return). Measured with `fabricscope bench uprobe-cost` (2-core
VM, kernel 6.18, real libnccl 2.32.3, ncclAllReduce's argument-check path):
94 ns per call unprobed, +1.05 us with entry+return probes, +0.68 us entry only;
draining and decoding costs the agent about 6 us of Python per event. Per-call
records suit real training rates (hundreds to a few thousand calls per second
per process: 8 ranks x 1000 calls/s is ~5 % of an agent core and ~100k InfluxDB
field writes/s per node); a large cluster at such rates would want per-window
aggregates instead (not implemented: it needs a config switch). Events beyond
what the ring buffer holds between polls are counted as `lost`.

Communicators created before a process's library was probed stay unknown: their
calls carry no nranks, rank or comm_id. ncclCommInitAll (single-process, several
GPUs) is not probed.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
from pathlib import Path

from fabricscope.agent.procmaps import shared_environments
from fabricscope.agent import bpf
from fabricscope.agent.probes.base import ProbeContext
from fabricscope.agent.probes.base import ringbuf_pages as ringbuf_pages_for
from fabricscope.agent.probes.gloo.procs import ProcessTable
from fabricscope.agent.probes.nccl.layout import APIS, STAT_NAMES, DecodeError, NcclEventC, decode
from fabricscope.agent.probes.nccl.records import CommTable, observe, to_record
from fabricscope.agent.probes.nccl.steps import StepRecords
from fabricscope.agent.uprobes import Hook, LibraryUprobes, UprobeProbe, shared_maps
from fabricscope.errors import UserError

log = logging.getLogger("fabricscope.agent.nccl")

#: basenames treated as NCCL: libnccl.so, libnccl.so.2, libnccl.so.2.32.3
LIB_NAME = re.compile(r"^libnccl\.so(\.\d+)*$")
RETURN_FN = "nccl_return"


class NcclProbe(UprobeProbe):
    name = "nccl"

    def __init__(self, ctx: ProbeContext, *, pids: set[int] | None = None,
                 rescan_s: float = 2.0, entry_only: bool = False,
                 ringbuf_pages: int | None = None,
                 proc: Path = Path("/proc")):
        """pids: record only these processes (None: all). entry_only: no uretprobes
        (no return code or duration; for the overhead benchmark)."""
        hooks = [Hook(api.symbol, api.entry_fn, None if entry_only else RETURN_FN)
                 for api in APIS]
        super().__init__(ctx, LibraryUprobes("nccl", hooks, log, proc=proc, rescan_s=rescan_s,
                                             maps_cache=shared_maps(ctx, proc)))
        self.paths = list(getattr(ctx.config, "nccl_paths", []) or [])
        self.pid_filter = set(pids) if pids is not None else None
        self.entry_only = entry_only
        self.ringbuf_pages = ringbuf_pages or ringbuf_pages_for(ctx, 64)   # see gloo
        self._comms = CommTable()
        self._steps = StepRecords(ProcessTable(proc, pods=getattr(ctx, "pods", None),
                                               environments=shared_environments(ctx, proc)))
        self._name_re = LIB_NAME
        self._needles: tuple[str, ...] = ("libnccl",)
        self._counters.update(decode_errors=0, paths_missing=0)

    # --- lifecycle ---------------------------------------------------------------------

    def attach(self) -> None:
        cflags = [f"-DRINGBUF_PAGES={self.ringbuf_pages}", *self.ctx.cflags]
        if self.entry_only:
            cflags.append("-DFS_NCCL_ENTRY_ONLY")
        if self.pid_filter is not None:
            cflags.append("-DFS_NCCL_FILTER_PIDS")
        self._bpf = bpf.compile_program("nccl", cflags)
        bpf.check_layout(NcclEventC, self._bpf[b"event_layout"].Leaf)
        if self.pid_filter is not None:
            table = self._bpf[b"pids"]
            for pid in self.pid_filter:
                table[ctypes.c_uint32(pid)] = ctypes.c_uint8(1)
        self._bpf[b"events"].open_ring_buffer(self._on_event)
        self._uprobes.bpf = self._bpf
        self._attach_configured()
        self._rescan()

    def stats(self) -> dict[str, int]:
        """Counters only (exported as fabricscope_agent_probe_events_total); `lost` is
        events_lost_total. Gauges (files attached, known comms) are in libraries()."""
        out = {**self._counters, **self._uprobes.counters}
        out["comms_evicted"] = self._comms.evicted
        out.update(self._steps.stats())
        if self._bpf is not None:
            out.update(zip(STAT_NAMES, bpf.percpu_sums(self._bpf[b"stats"], len(STAT_NAMES))))
            # Run time of our programs (not the uprobe trap itself), while the kernel's
            # BPF stats are on (sysctl kernel.bpf_stats_enabled=1), else 0; missed_hits.
            out.update(bpf.prog_stat_counters(fn.fd for fn in self._bpf.funcs.values()))
        return out

    def poll(self):
        out = super().poll()
        return out + self._steps.feed(out)     # nccl_step (agent/probes/nccl/steps.py)

    # --- events ------------------------------------------------------------------------

    def _on_event(self, _ctx, data, size) -> int:
        # Called from ring_buffer_consume(); an exception here would be lost in ctypes.
        try:
            ev = decode(ctypes.string_at(data, size))
            self._pending.append(to_record(ev, self._comms, self.ctx.clock))
            observe(ev, self._comms)
        except Exception as exc:   # DecodeError, or a bug: count it, never lose it silently
            self._counters["decode_errors"] += 1
            log.debug("undecodable nccl event: %s", exc, exc_info=not isinstance(exc, DecodeError))
        return 0

    # --- library files -----------------------------------------------------------------

    def _attach_configured(self) -> None:
        names = []
        for path in self.paths:
            try:
                sighting = self._uprobes.pin(path)
            except OSError as exc:
                self._counters["paths_missing"] += 1
                log.warning("nccl_paths: cannot open %s: %s (skipped)", path, exc.strerror)
                continue
            # maps show the resolved file: match a symlink's target name too
            names += {os.path.basename(path), os.path.basename(os.path.realpath(path))}
            if sighting is not None and not self._uprobes.attach(sighting):
                raise UserError(f"nccl_paths: {path} exports none of the NCCL functions",
                                "point nccl_paths at a libnccl.so (check with nm -D)")
        if names:
            alternatives = "|".join(re.escape(n) for n in names)
            self._name_re = re.compile(f"{LIB_NAME.pattern}|^({alternatives})$")
            self._needles += tuple(names)

    def _rescan(self) -> None:
        self._uprobes.rescan(self._name_re, self._needles)
        # poll() drained first, so the last events of a process that exited found its comms
        self._comms.drop_pids(self._uprobes.pids())
