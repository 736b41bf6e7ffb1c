"""Uprobes of one BPF program on library files, attached and detached per file.

The uprobe probes (nccl on libnccl.so, gloo on libtorch_cpu.so) share this
lifecycle: a library file is opened once and probed as /proc/self/fd/N, a path
that stays valid while the fd is held, whatever mount namespace the file came
from; each file gets an entry uprobe, and maybe a uretprobe, per hooked symbol it
exports; files found in process maps (agent/procmaps.py) are rescanned at a
cadence and detached once no process maps them, while pinned (configured) files
stay until close(). What to hook and what to do with the events stays in the
probe: LibraryUprobes knows neither a library nor an event. UprobeProbe is the
probe skeleton around it (detach, and a poll that drains, rescans and hands over).

Counters (the probe picks the ones it exports): attach_errors (unreadable symbol
tables and failed attachments), scans, scan_unreadable (processes or mappings
that vanished or refused), scan_remembered (processes whose maps a rescan did not
read: procmaps.ScanMemo), libraries_attached, libraries_detached.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from fabricscope.agent import procmaps
from fabricscope.agent.kernel import Capability
from fabricscope.agent.probes.base import Probe, ProbeContext
from fabricscope.agent.procmaps import Sighting
from fabricscope.records import Record

FileKey = tuple[int, int]     # (st_dev, st_ino) of the opened file


@dataclass(frozen=True)
class Hook:
    symbol: str
    entry_fn: str                  # BPF function run at the symbol's entry
    return_fn: str | None = None   # run at its return (a uretprobe); None: entry only


class LibraryUprobes:
    def __init__(self, name: str, hooks: list[Hook], log: logging.Logger, *,
                 proc: Path = Path("/proc"), rescan_s: float = 2.0, maps_cache=None):
        """name: the probe's, prefixed to log lines. The BPF object is set later
        (`self.bpf`), once the probe has loaded its program."""
        self.name, self.hooks, self.log = name, list(hooks), log
        self.proc, self.rescan_s, self.maps_cache = proc, rescan_s, maps_cache
        self.bpf = None
        self.files: dict[FileKey, Sighting] = {}        # open, whether attached or not
        self.attached: dict[FileKey, list[Hook]] = {}   # what each file has attached
        self.pinned: set[FileKey] = set()               # configured: never detached by rescan
        self.memo = procmaps.ScanMemo()              # rescans read new processes' maps
        self.counters = {"attach_errors": 0, "scans": 0, "scan_unreadable": 0,
                         "scan_remembered": 0,
                         "libraries_attached": 0, "libraries_detached": 0}
        self._symbols_re = ("^(" + "|".join(re.escape(h.symbol) for h in self.hooks)
                            + ")$").encode()
        self._last_scan = float("-inf")

    def pin(self, path: str) -> Sighting | None:
        """Open a configured file and keep it until close(); None when the file is
        tracked already (another path to it). Raises OSError when it cannot be opened."""
        s = procmaps.open_path(path)
        if s.key in self.files:
            _close(s.fd)
            return None
        self.files[s.key] = s
        self.pinned.add(s.key)
        return s

    def rescan_due(self) -> bool:
        return time.monotonic() - self._last_scan >= self.rescan_s

    def rescan(self, name: re.Pattern, needles: tuple[str, ...] | None = None) -> None:
        """Attach the files that processes newly map (basename matching `name`);
        detach and close those no process maps any more, except pinned ones."""
        self._last_scan = time.monotonic()
        result = procmaps.scan(self.proc, name, self.files, skip_pids=frozenset({os.getpid()}),
                               needles=needles, cache=self.maps_cache, memo=self.memo)
        self.counters["scans"] += 1
        self.counters["scan_unreadable"] += result.unreadable
        self.counters["scan_remembered"] += result.remembered
        for key, s in result.files.items():
            if key not in self.files:
                self.files[key] = s
                self.log.info("%s: %s mapped by pid %s", self.name, s.shown_path, min(s.pids))
                self.attach(s)
        for key in [k for k, s in self.files.items() if not s.pids and k not in self.pinned]:
            self.log.info("%s: no process maps %s any more; detaching", self.name,
                          self.files[key].shown_path)
            self.detach(key)
            _close(self.files.pop(key).fd)

    def attach(self, s: Sighting) -> list[str]:
        """Probe each hook whose symbol the tracked file `s` exports; returns the
        symbols probed ([] also when its symbol table cannot be read)."""
        path = f"/proc/self/fd/{s.fd}".encode()
        try:
            present = exported_symbols(path, self._symbols_re)
        except Exception as exc:
            self.counters["attach_errors"] += 1
            self.log.warning("%s: cannot read symbols of %s: %s", self.name, s.shown_path, exc)
            return []
        done: list[Hook] = []
        self.attached[s.key] = done
        for hook in self.hooks:
            if hook.symbol not in present:
                continue
            try:
                self._attach_hook(path, hook, s.shown_path)
            except Exception as exc:
                self.counters["attach_errors"] += 1
                self.log.warning("%s: cannot probe %s in %s: %s", self.name, hook.symbol,
                                 s.shown_path, exc)
                continue
            done.append(hook)
        self.counters["libraries_attached"] += 1
        self.log.info("%s: probing %d functions in %s", self.name, len(done), s.shown_path)
        return [h.symbol for h in done]

    def _attach_hook(self, path: bytes, hook: Hook, shown: str) -> None:
        self.bpf.attach_uprobe(name=path, sym=hook.symbol.encode(), fn_name=hook.entry_fn.encode())
        if hook.return_fn is None:
            return
        try:
            self.bpf.attach_uretprobe(name=path, sym=hook.symbol.encode(),
                                      fn_name=hook.return_fn.encode())
        except Exception:
            # All or nothing per symbol: what is attached is exactly what detach() removes.
            self._release(self.bpf.detach_uprobe, path, hook.symbol, shown)
            raise

    def detach(self, key: FileKey) -> None:
        """Remove a file's probes; the file stays open and tracked."""
        if key not in self.attached:
            return
        hooks = self.attached.pop(key)
        self.counters["libraries_detached"] += 1
        s = self.files.get(key)
        if s is None or self.bpf is None:
            return
        path = f"/proc/self/fd/{s.fd}".encode()
        for hook in hooks:
            self._release(self.bpf.detach_uprobe, path, hook.symbol, s.shown_path)
            if hook.return_fn is not None:
                self._release(self.bpf.detach_uretprobe, path, hook.symbol, s.shown_path)

    def _release(self, detach, path: bytes, symbol: str, shown: str) -> None:
        try:
            detach(name=path, sym=symbol.encode())
        except Exception as exc:   # already gone: nothing left to release
            self.log.debug("%s: detach %s in %s: %s", self.name, symbol, shown, exc)

    def close(self) -> None:
        """Detach every file and close every fd; call before the BPF object's cleanup."""
        for key in list(self.attached):
            self.detach(key)
        for s in self.files.values():
            _close(s.fd)
        self.files.clear()
        self.pinned.clear()
        self.bpf = None

    def pids(self) -> set[int]:
        """Processes mapping a tracked file, as of the last rescan."""
        return {p for s in self.files.values() for p in s.pids}

    def libraries(self) -> list[tuple[str, frozenset[int], tuple[str, ...]]]:
        """(path as first seen, pids mapping it, symbols probed) per attached file."""
        return [(self.files[k].shown_path, frozenset(self.files[k].pids),
                 tuple(h.symbol for h in hooks)) for k, hooks in self.attached.items()]


class UprobeProbe(Probe):
    """A probe whose BPF program runs on library uprobes. The subclass loads its
    program into self._bpf (and sets self._uprobes.bpf) in attach(), queues records
    in self._pending from its ring buffer callback, and says what a rescan does."""

    needs_bpf = True
    # uprobes are perf events; the libraries sit in other containers' mount namespaces
    capabilities = (Capability.BPF, Capability.PERFMON, Capability.SYS_PTRACE)

    def __init__(self, ctx: ProbeContext, uprobes: LibraryUprobes):
        super().__init__(ctx)
        self._bpf = None
        self._uprobes = uprobes
        self._pending: list[Record] = []
        self._counters: dict[str, int] = {"records": 0}

    def detach(self) -> None:
        """Close the uprobes, then drain what the ring still holds (the Probe contract:
        the poll after detach hands those records out) before the maps are freed."""
        self._uprobes.close()
        if self._bpf is not None:
            try:
                self._bpf.ring_buffer_consume()
            finally:
                self._bpf.cleanup()
                self._bpf = None

    def poll(self) -> list[Record]:
        if self._bpf is None:     # detached: what its drain left
            out, self._pending = self._pending, []
            self._counters["records"] += len(out)
            return out
        self._before_drain()
        # Drain first: events of a process that just exited still find its state.
        self._bpf.ring_buffer_consume()
        if self._uprobes.rescan_due():
            self._rescan()
        self._after_rescan()
        out, self._pending = self._pending, []
        self._counters["records"] += len(out)
        return out

    def libraries(self) -> list[tuple[str, frozenset[int], tuple[str, ...]]]:
        """(path as first seen, pids mapping it, symbols probed) per attached file."""
        return self._uprobes.libraries()

    def _rescan(self) -> None:
        raise NotImplementedError

    def _after_rescan(self) -> None:
        """Periodic work of the probe at every poll (none by default)."""

    def _before_drain(self) -> None:
        """Work of the probe at every poll before its events are read (none by default)."""


def shared_maps(ctx: ProbeContext, proc: Path):
    """The agent's shared MapsCache for scans of the real /proc (None otherwise)."""
    return getattr(ctx, "maps_cache", None) if proc == Path("/proc") else None


def exported_symbols(path: bytes, regex: bytes) -> set[str]:
    """Names of the functions the ELF file at `path` defines that match `regex`."""
    from bcc import BPF   # not at import: BCC must come after fabricscope.agent.kernel.prepare()
    return {name.decode() for name, _ in BPF.get_user_functions_and_addresses(path, regex)}


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
