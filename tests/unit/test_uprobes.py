"""LibraryUprobes (agent/uprobes.py) without the kernel: a recording stand-in for the
BCC object, a fake /proc tree and a stubbed symbol table (no root, no bcc import)."""

from __future__ import annotations

import logging
import os
import re

import pytest

from fabricscope.agent import uprobes
from fabricscope.agent.uprobes import Hook, LibraryUprobes, UprobeProbe

LIB = re.compile(r"^libdemo\.so(\.\d+)*$")
HOOKS = [Hook("op_a", "a_entry", "op_return"), Hook("op_b", "b_entry"),
         Hook("op_c", "c_entry", "op_return")]
log = logging.getLogger("test.uprobes")


class RecordingBPF:
    """Stands in for bcc.BPF: records (call, symbol); refuses what `fail` names."""

    def __init__(self, fail: set[tuple[str, str]] = frozenset()):
        self.calls: list[tuple[str, str]] = []
        self.fail = fail

    def _do(self, call: str, sym: bytes) -> None:
        if (call, sym.decode()) in self.fail:
            raise RuntimeError(f"{call} {sym.decode()} refused")
        self.calls.append((call, sym.decode()))

    def attach_uprobe(self, name, sym, fn_name):
        self._do("attach_uprobe", sym)

    def attach_uretprobe(self, name, sym, fn_name):
        self._do("attach_uretprobe", sym)

    def detach_uprobe(self, name, sym):
        self._do("detach_uprobe", sym)

    def detach_uretprobe(self, name, sym):
        self._do("detach_uretprobe", sym)


@pytest.fixture
def exports(monkeypatch):
    """Symbols each fake library file exports, by the file's inode."""
    table: dict[int, set[str]] = {}

    def exported(path: bytes, regex: bytes) -> set[str]:
        ino = os.stat(path).st_ino
        if ino not in table:
            raise OSError("not an ELF file")
        return {s for s in table[ino] if re.match(regex.decode(), s)}

    monkeypatch.setattr(uprobes, "exported_symbols", exported)
    return table


@pytest.fixture
def probes(exports):   # never the real bcc here: see `exports`
    made: list[LibraryUprobes] = []

    def make(tmp_path, bpf=None):
        u = LibraryUprobes("demo", HOOKS, log, proc=tmp_path / "proc", rescan_s=0)
        u.bpf = bpf or RecordingBPF()
        (tmp_path / "proc").mkdir(exist_ok=True)
        made.append(u)
        return u

    yield make
    for u in made:      # closes every fd also when a test fails
        u.close()


def library(tmp_path, exports, name="libdemo.so.1", symbols=("op_a", "op_b", "op_c")):
    path = tmp_path / name
    path.write_bytes(b"\x7fELF demo")
    exports[os.stat(path).st_ino] = set(symbols) | {"unrelated"}
    return path


def map_library(tmp_path, pid: int, lib) -> None:
    d = tmp_path / "proc" / str(pid)
    (d / "root").mkdir(parents=True, exist_ok=True)
    ino = os.stat(lib).st_ino
    (d / "maps").write_text(f"7f0000000000-7f0000001000 r-xp 00000000 fd:01 {ino} {lib}\n")
    target = d / "root" / str(lib).lstrip("/")
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(lib, target)


def test_pinned_file_gets_entry_and_return_probes_per_exported_symbol(tmp_path, exports,
                                                                      probes):
    lib = library(tmp_path, exports, symbols=("op_a", "op_b"))
    u = probes(tmp_path)
    s = u.pin(str(lib))
    assert u.pin(str(lib)) is None and len(u.files) == 1       # same file: tracked once
    assert u.attach(s) == ["op_a", "op_b"]
    assert u.bpf.calls == [("attach_uprobe", "op_a"), ("attach_uretprobe", "op_a"),
                           ("attach_uprobe", "op_b")]
    assert u.libraries() == [(str(lib), frozenset(), ("op_a", "op_b"))]
    u.bpf.calls.clear()
    u.detach(s.key)
    u.detach(s.key)                                            # a second time: nothing left
    assert u.bpf.calls == [("detach_uprobe", "op_a"), ("detach_uretprobe", "op_a"),
                           ("detach_uprobe", "op_b")]
    assert (u.counters["libraries_attached"], u.counters["libraries_detached"]) == (1, 1)
    assert u.libraries() == [] and s.key in u.files            # still open and tracked


def test_rescan_attaches_mapped_files_and_detaches_unmapped_ones_but_not_pinned(
        tmp_path, exports, probes):
    pinned, found = library(tmp_path, exports, "libdemo.so"), library(tmp_path, exports)
    u = probes(tmp_path)
    u.attach(u.pin(str(pinned)))
    map_library(tmp_path, 100, found)
    map_library(tmp_path, 101, found)
    u.rescan(LIB)
    assert sorted((path, sorted(pids)) for path, pids, _ in u.libraries()) == \
        [(str(pinned), []), (str(found), [100, 101])]
    fd = next(s.fd for s in u.files.values() if s.shown_path == str(found))
    assert u.pids() == {100, 101}
    for pid in (100, 101):
        (tmp_path / "proc" / str(pid) / "maps").write_text("")     # the processes exit
    u.rescan(LIB)
    assert [path for path, _, _ in u.libraries()] == [str(pinned)]
    with pytest.raises(OSError):
        os.fstat(fd)                                           # the unmapped file was closed
    assert u.counters == {"attach_errors": 0, "scans": 2, "scan_unreadable": 0,
                          "scan_remembered": 0, "libraries_attached": 2,
                          "libraries_detached": 1}


def test_failed_return_probe_takes_its_entry_probe_back(tmp_path, exports, probes):
    lib = library(tmp_path, exports)
    u = probes(tmp_path, RecordingBPF(fail={("attach_uretprobe", "op_c")}))
    assert u.attach(u.pin(str(lib))) == ["op_a", "op_b"]
    assert u.bpf.calls[-1] == ("detach_uprobe", "op_c")       # all or nothing per symbol
    assert u.counters["attach_errors"] == 1


def test_unreadable_symbol_table_is_counted_and_attaches_nothing(tmp_path, probes):
    junk = tmp_path / "libdemo.so"
    junk.write_text("not ELF")
    u = probes(tmp_path)
    assert u.attach(u.pin(str(junk))) == []
    assert u.counters["attach_errors"] == 1 and u.libraries() == [] and u.bpf.calls == []


def test_close_detaches_everything_and_closes_every_fd(tmp_path, exports, probes):
    lib = library(tmp_path, exports)
    u = probes(tmp_path)
    s = u.pin(str(lib))
    u.attach(s)
    recorder = u.bpf
    u.close()
    assert ("detach_uretprobe", "op_c") in recorder.calls
    assert u.files == {} and u.attached == {} and u.bpf is None
    with pytest.raises(OSError):
        os.fstat(s.fd)
    with pytest.raises(OSError):
        u.pin(str(tmp_path / "missing.so"))


class DrainingBPF(RecordingBPF):
    """Also a ring buffer: each consume delivers one event to the probe."""

    def __init__(self, probe):
        super().__init__()
        self.probe, self.cleaned = probe, 0

    def ring_buffer_consume(self):
        self.probe._pending.append(f"event {len(self.probe._pending)}")

    def cleanup(self):
        self.cleaned += 1


class DemoProbe(UprobeProbe):
    name = "demo"

    def __init__(self, proc, rescan_s):
        super().__init__(None, LibraryUprobes("demo", HOOKS, log, proc=proc, rescan_s=rescan_s))
        self.calls: list[str] = []

    def attach(self):
        self._bpf = self._uprobes.bpf = DrainingBPF(self)

    def _rescan(self):
        self.calls.append("rescan")
        self._uprobes.rescan(LIB)

    def _after_rescan(self):
        self.calls.append("after")


def test_probe_skeleton_drains_rescans_at_the_cadence_and_detaches_once(tmp_path):
    (tmp_path / "proc").mkdir()
    probe = DemoProbe(tmp_path / "proc", rescan_s=3600)
    assert probe.poll() == [] and probe.libraries() == []
    probe.detach()                                     # safe before attach
    probe.attach()
    bpf = probe._bpf
    assert probe.poll() == ["event 0"] and probe.calls == ["rescan", "after"]
    assert probe.poll() == ["event 0"] and probe.calls == ["rescan", "after", "after"]
    assert probe._counters["records"] == 2
    probe.detach()                                     # drains the ring once more
    probe.detach()
    assert bpf.cleaned == 1 and probe._bpf is None
    assert probe.poll() == ["event 0"] and probe.poll() == []   # handed out after detach
    assert probe._counters["records"] == 3
