"""agent/probes/gloo/procs.ProcessTable over a fake /proc tree: a process that exits
keeps answering for its late events (a zombie, then reaped) for GONE_S, and never for
another process that gets its pid; a process the watcher witnessed while it lived
is named when first asked after it exited."""

from __future__ import annotations

import os
import shutil

from fabricscope.agent.probes.gloo.procs import ProcessTable
from tests.unit.test_tcp_owners import FakeProc


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def started(tmp_path, pid: int, start: int) -> None:
    (tmp_path / str(pid) / "stat").write_text(
        f"{pid} (python) S " + " ".join(["0"] * 18) + f" {start} 0\n")   # field 22


def table(tmp_path, proc: FakeProc, clock: Clock) -> ProcessTable:
    return ProcessTable(tmp_path, own_netns=os.stat(proc.netns).st_ino, clock=clock)


def test_a_process_forgotten_as_it_exited_answers_its_late_events_as_a_zombie_and_reaped(
        tmp_path):
    """The probe drained the ring, the rank exited and the next rescan forgot it; the
    events it sent between the two still name its rank."""
    proc, clock = FakeProc(tmp_path), Clock()
    proc.process(30, "python", [], {"RANK": "1", "FABRICSCOPE_JOB": "llm"})
    started(tmp_path, 30, 5150)
    procs = table(tmp_path, proc, clock)
    assert procs.get(30).rank == "1"
    os.unlink(tmp_path / "30" / "ns" / "net")          # a zombie: no namespaces
    (tmp_path / "30" / "environ").unlink()
    assert not procs.alive(30)
    procs.forget(30)
    assert procs.pids() == []                           # not reaped twice
    assert procs.get(30).rank == "1"
    shutil.rmtree(tmp_path / "30")                      # reaped
    clock.now += ProcessTable.GONE_S - 1
    assert procs.get(30).rank == "1" and procs.late == 2
    clock.now += 2
    assert procs.get(30) is None


def test_a_new_process_with_a_forgotten_pid_is_read_anew(tmp_path):
    proc, clock = FakeProc(tmp_path), Clock()
    proc.process(30, "python", [], {"RANK": "1", "FABRICSCOPE_JOB": "llm"})
    started(tmp_path, 30, 5150)
    procs = table(tmp_path, proc, clock)
    assert procs.get(30).rank == "1"
    procs.forget(30)
    shutil.rmtree(tmp_path / "30")
    proc.process(30, "python", [], {"RANK": "3", "FABRICSCOPE_JOB": "other"})
    started(tmp_path, 30, 9999)                         # another process, the same pid
    info = procs.get(30)
    assert (info.rank, info.job) == ("3", "other") and procs.late == 0
    assert procs.pids() == [30]


def witnessed(tmp_path, rank: str) -> tuple[FakeProc, ProcessTable]:
    """Process 30 (started at 5150) with RANK `rank`, witnessed while it lives."""
    proc = FakeProc(tmp_path)
    proc.process(30, "python", [], {"RANK": rank, "FABRICSCOPE_JOB": "llm"})
    started(tmp_path, 30, 5150)
    procs = table(tmp_path, proc, Clock())
    procs.witness(30)
    return proc, procs


def exits(tmp_path, pid: int) -> None:
    """The process becomes a zombie: no namespaces, no memory."""
    os.unlink(tmp_path / str(pid) / "ns" / "net")
    (tmp_path / str(pid) / "environ").unlink()


def test_a_process_witnessed_while_it_lived_is_named_when_first_asked_after_it_exited(
        tmp_path):
    """The watcher read the rank at its first call; the main thread drains its events
    only after it exited (a zombie, then reaped)."""
    _, procs = witnessed(tmp_path, "1")
    exits(tmp_path, 30)
    info = procs.get(30)
    assert (info.rank, info.job, info.local) == ("1", "llm", True) and procs.late == 1
    procs.forget(30)
    shutil.rmtree(tmp_path / "30")                      # reaped
    assert procs.get(30).rank == "1"


def test_a_process_witnessed_then_reaped_before_any_ask_is_named(tmp_path):
    _, procs = witnessed(tmp_path, "2")
    shutil.rmtree(tmp_path / "30")
    assert procs.get(30).rank == "2"


def test_a_witness_never_names_a_later_process_with_the_pid(tmp_path):
    proc, procs = witnessed(tmp_path, "1")
    shutil.rmtree(tmp_path / "30")
    proc.process(30, "python", [], {"RANK": "3", "FABRICSCOPE_JOB": "other"})
    started(tmp_path, 30, 9999)                         # another process, the same pid
    exits(tmp_path, 30)                                 # and already a zombie
    assert procs.get(30) is None and procs.late == 0


def test_a_process_that_is_gone_when_witnessed_is_not_kept(tmp_path):
    proc, clock = FakeProc(tmp_path), Clock()
    procs = table(tmp_path, proc, clock)
    procs.witness(31)                                   # no such process
    assert procs.get(31) is None
