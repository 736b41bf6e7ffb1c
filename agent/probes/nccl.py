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
(fabricscope/measurements/collectives.py). Times are enqueue times.

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
import time
from pathlib import Path

from agent import bpf
from agent.probes import nccl_procs
from agent.probes.base import Probe, ProbeContext
from agent.probes.nccl_layout import APIS, STAT_NAMES, DecodeError, NcclEventC, decode
from agent.probes.nccl_records import CommTable, observe, to_record
from fabricscope.errors import UserError
from fabricscope.records import Record

log = logging.getLogger("fabricscope.agent.nccl")

RETURN_FN = "nccl_return"
_SYMBOLS_RE = "^(" + "|".join(a.symbol for a in APIS) + ")$"


class NcclProbe(Probe):
    name = "nccl"
    needs_bpf = True

    def __init__(self, ctx: ProbeContext, *, pids: set[int] | None = None,
                 rescan_s: float = 2.0, entry_only: bool = False, ringbuf_pages: int = 64,
                 proc: Path = Path("/proc")):
        """pids: record only these processes (None: all). entry_only: no uretprobes
        (no return code or duration; for the overhead benchmark)."""
        super().__init__(ctx)
        self.paths = list(getattr(ctx.config, "nccl_paths", []) or [])
        self.pid_filter = set(pids) if pids is not None else None
        self.rescan_s = rescan_s
        self.entry_only = entry_only
        self.ringbuf_pages = ringbuf_pages
        self.proc = proc
        self._bpf = None
        self._files: dict[tuple[int, int], nccl_procs.Sighting] = {}
        self._attached: dict[tuple[int, int], list[str]] = {}
        self._configured: set[tuple[int, int]] = set()
        self._comms = CommTable()
        self._pending: list[Record] = []
        self._last_scan = float("-inf")
        self._name_re = nccl_procs.DEFAULT_NAME
        self._needles: tuple[str, ...] = ("libnccl",)
        self._counters = {"decode_errors": 0, "attach_errors": 0, "scans": 0,
                          "scan_unreadable": 0, "paths_missing": 0, "records": 0,
                          "libraries_attached": 0, "libraries_detached": 0}

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
        self._attach_configured()
        self._rescan()

    def detach(self) -> None:
        for key in list(self._attached):
            self._detach_file(key)
        for s in self._files.values():
            _close(s.fd)
        self._files.clear()
        self._configured.clear()
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None

    def poll(self) -> list[Record]:
        if self._bpf is None:
            return []
        # Drain first: events of a process that just exited still find its comms.
        self._bpf.ring_buffer_consume()
        if time.monotonic() - self._last_scan >= self.rescan_s:
            self._rescan()
        out, self._pending = self._pending, []
        self._counters["records"] += len(out)
        return out

    def stats(self) -> dict[str, int]:
        """Counters only (exported as fabricscope_agent_probe_events_total); `lost` is
        events_lost_total. Gauges (files attached, known comms) are in libraries()."""
        out = dict(self._counters)
        out["comms_evicted"] = self._comms.evicted
        if self._bpf is not None:
            out.update(zip(STAT_NAMES, bpf.percpu_sums(self._bpf[b"stats"], len(STAT_NAMES))))
            # Run time of our programs (not the uprobe trap itself), while the kernel's
            # BPF stats are on (sysctl kernel.bpf_stats_enabled=1); else 0.
            out["bpf_run_ns"], out["bpf_runs"] = bpf.prog_run_stats(
                fn.fd for fn in self._bpf.funcs.values())
        return out

    def libraries(self) -> list[tuple[str, frozenset[int], tuple[str, ...]]]:
        """(path as first seen, pids mapping it, symbols probed) per attached file."""
        return [(self._files[k].shown_path, frozenset(self._files[k].pids), tuple(syms))
                for k, syms in self._attached.items()]

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
                sighting = nccl_procs.open_path(path)
            except OSError as exc:
                self._counters["paths_missing"] += 1
                log.warning("nccl_paths: cannot open %s: %s (skipped)", path, exc.strerror)
                continue
            # maps show the resolved file: match a symlink's target name too
            names += {os.path.basename(path), os.path.basename(os.path.realpath(path))}
            if sighting.key in self._files:
                _close(sighting.fd)
                continue
            self._files[sighting.key] = sighting
            self._configured.add(sighting.key)
            if not self._attach_file(sighting):
                raise UserError(f"nccl_paths: {path} exports none of the NCCL functions",
                                "point nccl_paths at a libnccl.so (check with nm -D)")
        if names:
            alternatives = "|".join(re.escape(n) for n in names)
            self._name_re = re.compile(f"{nccl_procs.DEFAULT_NAME.pattern}|^({alternatives})$")
            self._needles += tuple(names)

    def _rescan(self) -> None:
        self._last_scan = time.monotonic()
        result = nccl_procs.scan(self.proc, self._name_re, self._files,
                                 skip_pids=frozenset({os.getpid()}), needles=self._needles)
        self._counters["scans"] += 1
        self._counters["scan_unreadable"] += result.unreadable
        for key, s in result.files.items():
            if key not in self._files:
                self._files[key] = s
                log.info("nccl: %s mapped by pid %s", s.shown_path, min(s.pids))
                self._attach_file(s)
        for key in [k for k, s in self._files.items()
                    if not s.pids and k not in self._configured]:
            log.info("nccl: no process maps %s any more; detaching", self._files[key].shown_path)
            self._detach_file(key)
            _close(self._files.pop(key).fd)
        alive = {p for s in self._files.values() for p in s.pids}
        self._comms.drop_pids(alive)

    def _attach_file(self, s: nccl_procs.Sighting) -> list[str]:
        from bcc import BPF
        path = f"/proc/self/fd/{s.fd}".encode()   # stays valid while we hold the fd
        try:
            present = {name.decode() for name, _ in
                       BPF.get_user_functions_and_addresses(path, _SYMBOLS_RE.encode())}
        except Exception as exc:
            self._counters["attach_errors"] += 1
            log.warning("nccl: cannot read symbols of %s: %s", s.shown_path, exc)
            return []
        done: list[str] = []
        self._attached[s.key] = done
        for api in APIS:
            if api.symbol not in present:
                continue
            try:
                self._bpf.attach_uprobe(name=path, sym=api.symbol.encode(),
                                        fn_name=api.entry_fn.encode())
                if not self.entry_only:
                    self._bpf.attach_uretprobe(name=path, sym=api.symbol.encode(),
                                               fn_name=RETURN_FN.encode())
            except Exception as exc:
                self._counters["attach_errors"] += 1
                log.warning("nccl: cannot probe %s in %s: %s", api.symbol, s.shown_path, exc)
                continue
            done.append(api.symbol)
        self._counters["libraries_attached"] += 1
        log.info("nccl: probing %d functions in %s", len(done), s.shown_path)
        return done

    def _detach_file(self, key: tuple[int, int]) -> None:
        if key not in self._attached:
            return
        symbols = self._attached.pop(key)
        self._counters["libraries_detached"] += 1
        s = self._files.get(key)
        if s is None or self._bpf is None:
            return
        path = f"/proc/self/fd/{s.fd}".encode()
        for sym in symbols:
            for detach in (self._bpf.detach_uprobe,
                           None if self.entry_only else self._bpf.detach_uretprobe):
                if detach is None:
                    continue
                try:
                    detach(name=path, sym=sym.encode())
                except Exception as exc:   # already gone: nothing left to release
                    log.debug("nccl: detach %s in %s: %s", sym, s.shown_path, exc)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
