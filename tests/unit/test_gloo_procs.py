"""agent/probes/gloo/procs.ProcessTable over a fake /proc tree: a process that exits
keeps answering for its late events (a zombie, then reaped) for GONE_S, and never for
another process that gets its pid."""

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
