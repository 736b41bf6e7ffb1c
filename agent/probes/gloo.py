"""Probe "gloo": the collectives PyTorch runs over gloo (CPU), with their real
execution windows, plus the training steps, phases and traffic model they imply.

What it hooks: uprobes at entry and return of gloo::allreduce, broadcast,
allgather(v), reduce, gather, scatter, alltoall(v) and barrier, and at entry of
gloo::transport::tcp::UnboundBuffer::send/recv, in each libtorch_cpu.so file in
use (gloo is linked into it); see bpf/gloo.bpf.c. Which files: `gloo_paths`, the
torch next to the agent's own Python (both attached at start, so a process
started later is seen from its first collective: DDP's parameter broadcast), and
those found mapped by running processes (/proc/PID/maps, rescanned every
`rescan_s`; calls made before such a file is found are missed).

Attribution: uprobes fire in every process of the kernel; only processes in the
agent's network namespace are kept (others go to the BPF deny map and are counted
as `filtered`). Job and rank tags come from the process's environment.

What it exports (fabricscope/measurements/gloo.py): gloo_collective (one per
collective: duration, S, algbw, busbw, sent bytes vs the ring model), gloo_step and
gloo_phase (inferred, agent/probes/gloo_steps.py), traffic_model (T, B, D of the
process's collective traffic every `gloo_model_interval_s`).

Message sizes: read from gloo's options objects and cross-checked (gloo_layout.py);
"bytes on the wire" are the payload bytes the collective handed to gloo's TCP
transport (exact per collective and thread, from the send uprobe), not TCP bytes:
gloo's TCP writes happen partly on its device thread, where a collective is no
longer known.

What it costs: a uprobe is a trap (~1-2 us); per collective 2 + one per send/recv
segment (<= 1 MiB each) -- a few dozen per DDP step, nothing per packet.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import re
import time
from pathlib import Path

from agent import bpf
from agent.probes import gloo_layout as layout
from agent.probes import nccl_procs
from agent.probes.base import Probe, ProbeContext, ProbeUnavailable
from agent.probes.gloo_procs import ProcessTable
from agent.probes.gloo_records import ProcessState
from fabricscope.errors import UserError
from fabricscope.records import Record

log = logging.getLogger("fabricscope.agent.gloo")

LIB_NAME = re.compile(r"^libtorch_cpu\.so(\.\d+)*$")
RETURN_FN = "collective_return"
_SYMBOLS_RE = "^(" + "|".join(re.escape(s) for s in
                              [op.symbol for op in layout.OPS] + [layout.SEND_SYM,
                                                                   *layout.RECV_SYMS]) + ")$"


def own_torch_library() -> str | None:
    """libtorch_cpu.so of the torch importable by this Python (without importing it)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        path = Path(base) / "lib" / "libtorch_cpu.so"
        if path.is_file():
            return str(path)
    return None


class GlooProbe(Probe):
    name = "gloo"
    needs_bpf = True

    def __init__(self, ctx: ProbeContext, *, proc: Path = Path("/proc"), rescan_s: float = 2.0,
                 ringbuf_pages: int = 64):
        super().__init__(ctx)
        cfg = ctx.config
        self.paths = list(getattr(cfg, "gloo_paths", []) or [])
        self.model_window_s = float(getattr(cfg, "gloo_model_window_s", 10.0))
        self.model_interval_s = float(getattr(cfg, "gloo_model_interval_s", 5.0))
        if not self.model_window_s > 0 or not self.model_interval_s > 0:
            raise UserError("gloo_model_window_s and gloo_model_interval_s must be positive",
                            "e.g. --gloo-model-window-s 10 --gloo-model-interval-s 5")
        self.proc, self.rescan_s, self.ringbuf_pages = proc, rescan_s, ringbuf_pages
        self._bpf = None
        self._files: dict[tuple[int, int], nccl_procs.Sighting] = {}
        self._attached: dict[tuple[int, int], list[str]] = {}
        self._pinned: set[tuple[int, int]] = set()      # configured or own: never detached
        self._procs = ProcessTable(proc)
        self._states: dict[int, ProcessState] = {}
        self._denied: set[int] = set()
        self._pending: list[Record] = []
        self._last_scan = float("-inf")
        self._last_model = time.monotonic()
        self._counters = {"decode_errors": 0, "attach_errors": 0, "scans": 0,
                          "unattributed": 0, "foreign_processes": 0, "records": 0,
                          "bytes_from_transfers": 0, "bytes_unknown": 0, "late_windows": 0,
                          "step_resyncs": 0}

    # --- lifecycle ---------------------------------------------------------------------

    def attach(self) -> None:
        self._bpf = bpf.compile_program("gloo", [f"-DRINGBUF_PAGES={self.ringbuf_pages}",
                                                 *layout.cflags(), *self.ctx.cflags])
        bpf.check_layout(layout.GlooEvent, self._bpf[b"event_layout"].Leaf)
        self._bpf[b"events"].open_ring_buffer(self._on_event)
        own = own_torch_library()
        for path in self.paths + ([own] if own else []):
            self._attach_path(path, configured=path in self.paths)
        self._rescan()

    def detach(self) -> None:
        for key in list(self._attached):
            self._detach_file(key)
        for s in self._files.values():
            _close(s.fd)
        self._files.clear()
        self._pinned.clear()
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None

    def poll(self) -> list[Record]:
        if self._bpf is None:
            return []
        self._bpf.ring_buffer_consume()
        now = time.monotonic()
        if now - self._last_scan >= self.rescan_s:
            self._rescan()
            self._reap()
        if now - self._last_model >= self.model_interval_s:
            self._last_model = now
            self._models()
        out, self._pending = self._pending, []
        self._counters["records"] += len(out)
        return out

    def stats(self) -> dict[str, int]:
        out = dict(self._counters)
        out["libraries_attached"] = len(self._attached)
        out["processes"] = len(self._states)
        if self._bpf is not None:
            table = self._bpf[b"stats"]
            for i, name in enumerate(layout.STATS):
                out[name] = int(table.sum(ctypes.c_int(i)).value)
        return out

    # --- events ------------------------------------------------------------------------

    def _on_event(self, _ctx, data, size) -> int:
        # Called from ring_buffer_consume(); an exception here would be lost in ctypes.
        raw = ctypes.string_at(data, size)
        off = layout.GlooEvent.pid.offset
        pid = int.from_bytes(raw[off:off + 4], "little") if len(raw) >= off + 4 else 0
        info = self._procs.get(pid)
        if info is None:
            self._counters["unattributed"] += 1
            return 0
        if not info.local:
            if pid not in self._denied:
                self._deny(pid)
            return 0
        try:
            c = layout.decode(raw, info.world_size)
        except ValueError as exc:
            self._counters["decode_errors"] += 1
            log.debug("undecodable gloo event: %s", exc)
            return 0
        if c.bytes_source != "options":
            self._counters["bytes_from_transfers" if c.bytes is not None else "bytes_unknown"] += 1
        state = self._states.get(pid)
        if state is None:
            state = self._states[pid] = ProcessState(info, self.model_window_s)
        self._pending += state.on_collective(c, self.ctx.clock.to_wall)
        return 0

    def _deny(self, pid: int) -> None:
        self._denied.add(pid)
        self._counters["foreign_processes"] += 1
        try:
            self._bpf[b"deny"][ctypes.c_uint32(pid)] = ctypes.c_uint8(1)
        except Exception as exc:   # map full: its events keep coming and are dropped here
            log.debug("gloo: deny map: %s", exc)

    def _reap(self) -> None:
        """Flush the steps of local processes that exited; forget foreign ones."""
        for pid in self._procs.pids():
            if self._procs.alive(pid):
                continue
            state = self._states.pop(pid, None)
            if state is not None:
                self._pending += state.flush(self.ctx.clock.to_wall)
                self._counters["late_windows"] += state.tracker.late
                self._counters["step_resyncs"] += state.tracker.resyncs
            self._procs.forget(pid)
            self._denied.discard(pid)
            try:
                del self._bpf[b"deny"][ctypes.c_uint32(pid)]
            except KeyError:
                pass

    def _models(self) -> None:
        now = time.monotonic_ns()
        for state in self._states.values():
            record = state.model_record(now, self.ctx.clock.to_wall)
            if record is not None:
                self._pending.append(record)

    # --- library files -----------------------------------------------------------------

    def _attach_path(self, path: str, configured: bool) -> None:
        try:
            s = nccl_procs.open_path(path)
        except OSError as exc:
            raise ProbeUnavailable(f"gloo_paths: cannot open {path}: {exc.strerror}") from None
        if s.key in self._files:
            _close(s.fd)
            return
        self._files[s.key] = s
        self._pinned.add(s.key)
        if not self._attach_file(s) and configured:
            raise ProbeUnavailable(f"gloo_paths: {path} exports none of gloo's collectives "
                                   "(check with nm -D --defined-only | grep gloo)")

    def _rescan(self) -> None:
        self._last_scan = time.monotonic()
        result = nccl_procs.scan(self.proc, LIB_NAME, self._files,
                                 skip_pids=frozenset({os.getpid()}))
        self._counters["scans"] += 1
        for key, s in result.files.items():
            if key not in self._attached and key not in self._pinned:
                self._files[key] = s
                log.info("gloo: %s mapped by pid %s", s.shown_path, min(s.pids))
                self._attach_file(s)
        for key in [k for k, s in self._files.items() if not s.pids and k not in self._pinned]:
            log.info("gloo: no process maps %s any more; detaching", self._files[key].shown_path)
            self._detach_file(key)
            _close(self._files.pop(key).fd)

    def _attach_file(self, s: nccl_procs.Sighting) -> list[str]:
        from bcc import BPF
        path = f"/proc/self/fd/{s.fd}"   # stays valid while we hold the fd
        try:
            present = {name.decode() for name, _ in
                       BPF.get_user_functions_and_addresses(path.encode(),
                                                            _SYMBOLS_RE.encode())}
        except Exception as exc:
            self._counters["attach_errors"] += 1
            log.warning("gloo: cannot read symbols of %s: %s", s.shown_path, exc)
            return []
        done: list[str] = []
        self._attached[s.key] = done
        probes = [(op.symbol, op.bpf_fn + "_entry", True) for op in layout.OPS]
        probes += [(layout.SEND_SYM, "buffer_send", False)]
        probes += [(sym, "buffer_recv", False) for sym in layout.RECV_SYMS]
        for sym, fn, with_return in probes:
            if sym not in present:
                continue
            try:
                self._bpf.attach_uprobe(name=path.encode(), sym=sym.encode(), fn_name=fn.encode())
                done.append(sym)
                if with_return:
                    self._bpf.attach_uretprobe(name=path.encode(), sym=sym.encode(),
                                               fn_name=RETURN_FN.encode())
            except Exception as exc:
                self._counters["attach_errors"] += 1
                log.warning("gloo: cannot probe %s in %s: %s", sym, s.shown_path, exc)
        collectives = sum(1 for op in layout.OPS if op.symbol in done)
        log.info("gloo: probing %d collectives in %s", collectives, s.shown_path)
        return done if collectives else []

    def _detach_file(self, key: tuple[int, int]) -> None:
        symbols = self._attached.pop(key, [])
        s = self._files.get(key)
        if s is None or self._bpf is None:
            return
        path = f"/proc/self/fd/{s.fd}"
        returns = {op.symbol for op in layout.OPS}
        for sym in symbols:
            detaches = [self._bpf.detach_uprobe] + \
                ([self._bpf.detach_uretprobe] if sym in returns else [])
            for detach in detaches:
                try:
                    detach(name=path.encode(), sym=sym.encode())
                except Exception as exc:   # already gone: nothing left to release
                    log.debug("gloo: detach %s in %s: %s", sym, s.shown_path, exc)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
