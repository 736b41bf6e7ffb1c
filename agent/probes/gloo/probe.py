"""Probe "gloo": the collectives PyTorch runs over gloo (CPU), with their real
execution windows, plus the training steps, phases and traffic model they imply.

What it hooks: uprobes at entry and return of gloo::allreduce, broadcast,
allgather(v), reduce, gather, scatter, alltoall(v) and barrier; point-to-point
transfers (a pipeline's activations and gradients) at c10d::ProcessGroupGloo::send
and recv, their work's constructor and the work's wait() (entry and return); and with
`gloo_buffer_hooks` (off by default) at entry of
gloo::transport::tcp::UnboundBuffer::send/recv, in each libtorch_cpu.so file in
use (gloo is linked into it); see bpf/gloo.bpf.c. Which files: `gloo_paths`, the
torch next to the agent's own Python (both attached at start, so a process
started later is seen from its first collective: DDP's parameter broadcast), and
those found mapped by running processes (/proc/PID/maps, rescanned every
`rescan_s`; calls made before such a file is found are missed).

Attribution: uprobes fire in every process of the kernel; only processes in the
agent's network namespace are kept (others go to the BPF deny map and are counted
as `filtered`). Job and rank tags come from the process's environment.

When: a collective at its return; a step as soon as the next step's first AllReduce
is in flight (the BPF map of collectives entered and not yet returned, read after
each drain), since ranks waiting inside it for a slow peer return up to a step
later.

What it exports (fabricscope/measurements/gloo.py): gloo_collective (one per
collective: duration, S, algbw, busbw; with the buffer hooks sent bytes vs the ring
model), gloo_step and gloo_phase (inferred, agent/probes/gloo/steps.py), and
traffic_model (T, B, D of the process's collective traffic every
`gloo_model_interval_s`, with or without the buffer hooks: T from the collectives'
bytes over time, D from their windows, B from the nic probe's busiest received bins
inside them, ProbeContext.nic_bins; the hooks make the series the payload sent). Each step also carries the time the process's CPU
cgroup was throttled during it and the cgroup's quota (fabricscope/cgroupcpu.py:
cpu.stat read every 50 ms by a sampler thread and at every poll before the events;
agent/probes/gloo/records.CpuSamples): the diagnosis shows a CPU limit that starves
a rank (diagnosis/detect_steps.py).

Message sizes: read from gloo's options objects and cross-checked (gloo_layout.py);
"bytes on the wire" are the payload bytes the collective handed to gloo's TCP
transport (exact per collective and thread, from the send uprobe), not TCP bytes:
gloo's TCP writes happen partly on its device thread, where a collective is no
longer known.

What it costs: a uprobe is a trap (~1-2 us quiet, far more in a loaded VM); per
collective 2, and with the buffer hooks one more per send/recv segment (<= 1 MiB
each) -- a few dozen per DDP step, nothing per packet. In the 2-core lab the buffer
hooks' traps were the largest kernel-side cost (docs/PERFORMANCE.md: agents frozen
with gloo only, 1.057 with them, 0.986 without; ddp-overhead about 1.07 with them,
1.05 without), so they are off unless asked for.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import re
import threading
import time
from pathlib import Path

from fabricscope.agent import bpf
from fabricscope.agent.probes.gloo import layout
from fabricscope.agent.probes.base import ProbeContext, ProbeUnavailable
from fabricscope.agent.probes.base import ringbuf_pages as ringbuf_pages_for
from fabricscope.agent.probes.gloo.procs import ProcessTable, netns_inode
from fabricscope.agent.priority import keep_priority, release_priority
from fabricscope.agent.procmaps import shared_environments
from fabricscope.agent.probes.gloo.records import CPU_SAMPLE_S, CpuSamples, ProcessState
from fabricscope.agent.uprobes import Hook, LibraryUprobes, UprobeProbe, shared_maps
from fabricscope import cgroupcpu
from fabricscope.errors import UserError

log = logging.getLogger("fabricscope.agent.gloo")


def _comm(proc, pid: int) -> str:
    """The process's command name, for a log line ('?' once it is gone)."""
    try:
        with open(f"{proc}/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return "?"

LIB_NAME = re.compile(r"^libtorch_cpu\.so(\.\d+)*$")
RETURN_FN = "collective_return"
#: collectives at entry and return (their window); transfers at entry only (their size)
COLLECTIVE_HOOKS = [Hook(op.symbol, op.bpf_fn + "_entry", RETURN_FN) for op in layout.OPS]
#: point-to-point transfers: the call and the work's constructor at entry, its wait()
#: at entry and return (one wait function serves both kinds)
P2P_HOOKS = [h for op in layout.P2P for h in (
    Hook(op.call, f"p2p_{op.bpf_tag}_call"), Hook(op.work, f"p2p_{op.bpf_tag}_work"),
    Hook(op.wait, "p2p_wait_entry", "p2p_wait_return"))]
BUFFER_HOOKS = ([Hook(layout.SEND_SYM, "buffer_send")]
                + [Hook(sym, "buffer_recv") for sym in layout.RECV_SYMS])
DEFAULT_HOOKS = COLLECTIVE_HOOKS + P2P_HOOKS
HOOKS = DEFAULT_HOOKS + BUFFER_HOOKS
_COLLECTIVES = frozenset(op.symbol for op in layout.OPS)
#: how often the watcher takes the pids of processes that just made their first call
#: (gloo.bpf.c notice_process): a run lives far longer, so it is read while it lives
WATCH_S = 0.05
ALLREDUCE = next(op.id for op in layout.OPS if op.name == "AllReduce")


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


class GlooProbe(UprobeProbe):
    name = "gloo"

    def __init__(self, ctx: ProbeContext, *, proc: Path = Path("/proc"), rescan_s: float = 2.0,
                 ringbuf_pages: int | None = None):
        cfg = ctx.config
        #: UnboundBuffer hooks (config gloo_buffer_hooks): the payload of each collective
        self.buffer_hooks = bool(getattr(cfg, "gloo_buffer_hooks", False))
        # configured files and the agent's own torch are pinned: never detached by rescans
        super().__init__(ctx, LibraryUprobes(
            "gloo", HOOKS if self.buffer_hooks else DEFAULT_HOOKS, log, proc=proc,
            rescan_s=rescan_s, maps_cache=shared_maps(ctx, proc)))
        self.paths = list(getattr(cfg, "gloo_paths", []) or [])
        self.model_window_s = float(getattr(cfg, "gloo_model_window_s", 10.0))
        self.model_interval_s = float(getattr(cfg, "gloo_model_interval_s", 5.0))
        if not self.model_window_s > 0 or not self.model_interval_s > 0:
            raise UserError("gloo_model_window_s and gloo_model_interval_s must be positive",
                            "e.g. --gloo-model-window-s 10 --gloo-model-interval-s 5")
        # 64 pages (256 KiB) per 0.2 s of poll interval: a second of ~2,500 collectives
        self.ringbuf_pages = ringbuf_pages or ringbuf_pages_for(ctx, 64)
        self._procs = ProcessTable(proc, pods=getattr(ctx, "pods", None),
                                   environments=shared_environments(ctx, proc))
        self._proc = str(proc)
        #: each rank's CPU cgroup (its throttled time and quota per step), one sampler
        #: per cgroup directory however many ranks share it
        self._cpu_hierarchy = cgroupcpu.detect() if proc == Path("/proc") else None
        self._cpu: dict[str, CpuSamples] = {}
        self._cpu_lock = threading.Lock()
        self._cpu_stop = threading.Event()
        self._cpu_thread: threading.Thread | None = None
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._states: dict[int, ProcessState] = {}
        self._denied: set[int] = set()
        self._last_model = time.monotonic()
        self._poll_ns = 0                      # the poll's instant (_before_drain)
        self._in_flight: dict[int, int] = {}   # pid -> its AllReduce in flight then
        self._counters.update(decode_errors=0, unattributed=0, foreign_processes=0,
                              bytes_from_transfers=0, bytes_unknown=0, late_windows=0,
                              step_resyncs=0, cgroup_unknown=0, handler_errors=0,
                              processes_witnessed=0)

    # --- lifecycle ---------------------------------------------------------------------

    def attach(self) -> None:
        self._bpf = bpf.compile_program("gloo", [f"-DRINGBUF_PAGES={self.ringbuf_pages}",
                                                 *layout.cflags(), *self.ctx.cflags])
        bpf.check_layout(layout.GlooEvent, self._bpf[b"event_layout"].Leaf)
        bpf.open_ring(self._bpf[b"events"], self._on_event, self._handler_error, self.name)
        self._start_watcher()
        self._uprobes.bpf = self._bpf
        own = own_torch_library()
        for path in self.paths + ([own] if own else []):
            self._attach_path(path, configured=path in self.paths)
        self._uprobes.rescan(LIB_NAME, ("libtorch_cpu",))  # skip maps without it early

    def _start_watcher(self) -> None:
        """The thread that reads who a process is as soon as it makes its first call,
        at the priority the agent started with (agent/priority.py)."""
        self._watcher = threading.Thread(target=self._watch, args=(self._bpf[b"new_pids"],),
                                         daemon=True, name="gloo-process-watcher")
        self._watcher.start()
        keep_priority(self._watcher.native_id)

    def _watch(self, new_pids) -> None:
        """Every WATCH_S, the pids queued since (each process once), witnessed while
        they live: the main thread drains their events only at its next poll, which a
        loaded node can hold off past a short run's end."""
        while not self._watch_stop.wait(WATCH_S):
            while True:
                try:
                    pid = int(new_pids.pop().value)
                except KeyError:       # the queue is empty
                    break
                self._procs.witness(pid)
                self._counters["processes_witnessed"] += 1

    def _rescan(self) -> None:
        self._uprobes.rescan(LIB_NAME, ("libtorch_cpu",))  # skip maps without it early
        self._learn_mapping_processes()
        self._reap()

    def _learn_mapping_processes(self) -> None:
        """Read the namespace and job of every process mapping libtorch now, while it
        lives: its events are read at the next poll, and a short run can have exited
        by then (its events would count as unattributed)."""
        for sighting in self._uprobes.files.values():
            for pid in sighting.pids:
                self._procs.get(pid)

    # --- CPU throttling ----------------------------------------------------------------

    def _cpu_of(self, pid: int) -> CpuSamples | None:
        cgroup = cgroupcpu.CgroupCpu.of_process(self._cpu_hierarchy, pid, self._proc)
        if cgroup is None:
            self._counters["cgroup_unknown"] += 1
            return None
        with self._cpu_lock:
            samples = self._cpu.get(cgroup.dir)
            if samples is None:
                samples = self._cpu[cgroup.dir] = CpuSamples(cgroup)
            if self._cpu_thread is None:
                self._cpu_thread = threading.Thread(target=self._sample_cpu, daemon=True,
                                                    name="gloo-cpu-sampler")
                self._cpu_thread.start()
        samples.sample(time.monotonic_ns())
        return samples

    def _sample_cpu(self) -> None:
        while not self._cpu_stop.wait(CPU_SAMPLE_S):
            self._sample_cgroups()

    def _before_drain(self) -> None:
        """The poll's instant and the AllReduces in flight then, read before the ring
        is drained: the BPF program submits a collective's event before it deletes the
        collective from `active`, so one that is not in flight at this instant has its
        event in the ring already, and the drain that follows sees it. The steps in
        progress are then judged at an instant of which every returned collective is
        known. Then one CPU sample of every cgroup, past that instant."""
        self._poll_ns = time.monotonic_ns()
        self._in_flight = {}
        if self._bpf is not None:
            for _tid, ev in self._bpf[b"active"].items():
                if ev.op == ALLREDUCE and ev.start_ns <= self._poll_ns:
                    self._in_flight[ev.pid] = min(ev.start_ns,
                                                  self._in_flight.get(ev.pid, ev.start_ns))
        self._sample_cgroups()

    def _sample_cgroups(self) -> None:
        """One sample of every cgroup (the sampler thread's, and each poll's)."""
        with self._cpu_lock:
            cgroups = list(self._cpu.values())
        for samples in cgroups:
            samples.sample(time.monotonic_ns())

    def _forget_cpu(self) -> None:
        """Cgroups no process of the probe is in any more."""
        used = {id(s.cpu) for s in self._states.values() if s.cpu is not None}
        with self._cpu_lock:
            for key in [k for k, v in self._cpu.items() if id(v) not in used]:
                del self._cpu[key]

    def detach(self) -> None:
        self._cpu_stop.set()
        self._watch_stop.set()
        if self._cpu_thread is not None:
            self._cpu_thread.join(timeout=2)
        if self._watcher is not None:
            self._watcher.join(timeout=2)
            release_priority(self._watcher.native_id)
        super().detach()

    def _after_rescan(self) -> None:
        self._progress(self._poll_ns, self._steps_closed_in_flight())
        now = time.monotonic()
        if now - self._last_model >= self.model_interval_s:
            self._last_model = now
            self._models()

    def _steps_closed_in_flight(self) -> dict[int, int]:
        """Each local process's AllReduce in flight at the poll's instant (read before
        the drain, _before_drain) closes its last step when it is the next step's first
        (StepTracker.next_started): a step's length is known from the next one's entry,
        and a rank that waits inside that AllReduce for a slow peer returns up to a
        step later. Returns pid -> the earliest start of its AllReduces in flight."""
        earliest = {pid: start for pid, start in self._in_flight.items() if pid in self._states}
        for pid, start_ns in earliest.items():
            self._pending += self._states[pid].on_next_step(start_ns, self.ctx.clock.to_wall)
        return earliest

    def _progress(self, now: int, in_flight: dict[int, int]) -> None:
        """Each local process's step in progress at `now`, the poll's instant
        (gloo_progress): a rank that computes far longer than its peers is late to the
        next collective before that step ends, and the ones waiting in it say so while
        they wait. Every collective that returned before `now` is known by then
        (_before_drain), so what a report says so far is no more than the step's own."""
        for pid, state in self._states.items():
            self._pending += state.progress(now, in_flight.get(pid), self.ctx.clock.to_wall)

    def stats(self) -> dict[str, int]:
        out = dict(self._counters)
        out["attach_errors"] = self._uprobes.counters["attach_errors"]
        out["scans"] = self._uprobes.counters["scans"]
        out["libraries_attached"] = len(self._uprobes.attached)   # a gauge, as before
        out["processes"] = len(self._states)
        out["late_attributed"] = self._procs.late      # events of processes already gone
        if self._bpf is not None:
            table = self._bpf[b"stats"]
            for i, name in enumerate(layout.STATS):
                out[name] = int(table.sum(ctypes.c_int(i)).value)
            out.update(bpf.prog_stat_counters(fn.fd for fn in self._bpf.funcs.values()))
        return out

    # --- events ------------------------------------------------------------------------

    def _on_event(self, _ctx, data, size) -> int:
        raw = ctypes.string_at(data, size)
        off = layout.GlooEvent.pid.offset
        pid = int.from_bytes(raw[off:off + 4], "little") if len(raw) >= off + 4 else 0
        info = self._procs.get(pid)
        if info is None:
            self._counters["unattributed"] += 1
            return 0
        if not info.local:
            # a late event of a process already reaped must not deny its pid again:
            # the entry would outlive it and silence whichever process takes the pid next
            if pid not in self._denied and not self._procs.forgotten(pid):
                self._deny(pid)
                log.info("gloo: pid %d (%s) calls gloo from another network namespace "
                         "(%s) than this agent's (%s): its calls are another node's, and "
                         "dropped", pid, _comm(self._procs.proc, pid),
                         netns_inode(self._procs.proc / str(pid)) or "?", self._procs.own_netns)
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
            state = self._states[pid] = ProcessState(info, self.model_window_s,
                                                     payload_known=self.buffer_hooks,
                                                     cpu=self._cpu_of(pid))
        self._pending += state.on_collective(c, self.ctx.clock.to_wall)
        return 0

    def _handler_error(self) -> None:
        self._counters["handler_errors"] += 1

    def _deny(self, pid: int) -> None:
        self._denied.add(pid)
        self._counters["foreign_processes"] += 1
        try:
            self._bpf[b"deny"][ctypes.c_uint32(pid)] = ctypes.c_uint8(1)
        except Exception as exc:   # map full: its events keep coming and are dropped here
            log.debug("gloo: deny map: %s", exc)

    def _reap(self) -> None:
        """Flush the steps of local processes that exited (also of those whose late
        events came after an earlier reap); forget foreign ones."""
        for pid in set(self._procs.pids()) | set(self._states):
            if self._procs.alive(pid):
                continue
            state = self._states.pop(pid, None)
            if state is not None:
                self._pending += state.flush(self.ctx.clock.to_wall, self._nic_bins())
                self._counters["late_windows"] += state.tracker.late
                self._counters["step_resyncs"] += state.tracker.resyncs
            self._procs.forget(pid)
            self._denied.discard(pid)
            try:
                del self._bpf[b"deny"][ctypes.c_uint32(pid)]
            except KeyError:
                pass
        self._forget_cpu()

    def _models(self) -> None:
        now = time.monotonic_ns()
        for state in self._states.values():
            record = state.model_record(now, self.ctx.clock.to_wall, self._nic_bins())
            if record is not None:
                self._pending.append(record)

    def _nic_bins(self):
        """The nic probe's recent received bins (B of the traffic model); None without it."""
        return getattr(self.ctx, "nic_bins", None)

    # --- library files -----------------------------------------------------------------

    def _attach_path(self, path: str, configured: bool) -> None:
        try:
            s = self._uprobes.pin(path)
        except OSError as exc:
            raise ProbeUnavailable(f"gloo_paths: cannot open {path}: {exc.strerror}") from None
        if s is None:
            return
        if not _COLLECTIVES & set(self._uprobes.attach(s)) and configured:
            raise ProbeUnavailable(f"gloo_paths: {path} exports none of gloo's collectives "
                                   "(check with nm -D --defined-only | grep gloo)")
