"""agent/sources/markers.py against real rings written by fabricscope.markers (no root)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fabricscope.agent.probes.base import Clock, ProbeContext
from fabricscope.agent.sources.markers import MarkersSource
from fabricscope import markers

ROOT = Path(__file__).resolve().parents[2]


def source(directory: Path, alive=lambda pid: True) -> MarkersSource:
    ctx = ProbeContext("n0", frozenset(), Clock(), None)
    src = MarkersSource(ctx, directory=str(directory), pid_alive=alive)
    src.attach()
    return src


@pytest.fixture
def writer(tmp_path, monkeypatch):
    """fabricscope.markers writing into tmp_path from this process, with a fake clock."""
    monkeypatch.setenv("FABRICSCOPE_MARKERS_DIR", str(tmp_path))
    for k in ("RANK", "FABRICSCOPE_JOB", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(markers, "_opened", False)
    monkeypatch.setattr(markers, "_disabled", False)
    now = [1_800_000_000_000_000_000]
    monkeypatch.setattr(markers.time, "time_ns", lambda: now[0])
    yield now
    if markers._ring is not None:
        markers._ring.map.close()
    monkeypatch.setattr(markers, "_ring", None)


def run_writer(directory: Path, code: str, **env) -> int:
    """A separate training process writing markers; returns its (now dead) pid."""
    proc = subprocess.run(
        [sys.executable, "-c", "import os\nfrom fabricscope import markers\n" + code
         + "\nprint(os.getpid())"],
        env={**{k: v for k, v in os.environ.items() if k not in markers.META_ENV},
             "FABRICSCOPE_MARKERS_DIR": str(directory), "PYTHONPATH": str(ROOT),
             **env}, capture_output=True, text=True, check=True)
    return int(proc.stdout.split()[-1])


def test_step_seconds_are_the_gap_to_the_next_marker(tmp_path, writer, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("FABRICSCOPE_JOB", "job-a")
    src = source(tmp_path)
    t0 = writer[0]
    markers.step(0)
    writer[0] = t0 + 1_500_000_000
    markers.step(1)
    assert [(r.fields["step"], r.fields["seconds"]) for r in src.poll()] == [(0, 1.5)]
    writer[0] = t0 + 2_500_000_000
    with markers.phase("data_load"):
        pass
    markers.done()
    recs = src.poll()
    assert [(r.measurement, r.time_ns, r.tags, r.fields) for r in recs] == [
        ("train_step", t0 + 1_500_000_000, {"rank": "3", "job": "job-a"},
         {"step": 1, "seconds": 1.0})]
    assert src.poll() == []
    stats = src.stats()
    assert stats["lost"] == 0 and stats["phase_markers"] == 2


def test_exited_process_ring_is_drained_then_deleted(tmp_path):
    src = source(tmp_path, alive=lambda pid: pid == os.getpid())
    pid = run_writer(tmp_path, "for i in range(5): markers.step(i)\nmarkers.done()",
                     RANK="1", MASTER_ADDR="198.18.0.1", MASTER_PORT="29500")
    ring = tmp_path / f"{pid}.ring"
    assert ring.exists()
    recs = src.poll()
    assert [r.fields["step"] for r in recs] == [0, 1, 2, 3, 4]
    assert all(r.tags == {"rank": "1", "job": "198.18.0.1:29500"} for r in recs)
    assert all(r.fields["seconds"] >= 0 for r in recs)
    assert not ring.exists()
    assert src.poll() == []
    assert src.stats()["rings_closed"] == 1


def test_overwritten_entries_are_counted_lost(tmp_path):
    src = source(tmp_path, alive=lambda pid: False)
    n = markers.CAPACITY + 904
    run_writer(tmp_path, f"for i in range({n}): markers.step(i)\nmarkers.done()")
    recs = src.poll()
    written = n + 1
    assert src.stats()["lost"] == written - markers.CAPACITY
    # the ring keeps the last CAPACITY entries: steps 905..n-1 and done
    assert [r.fields["step"] for r in recs] == list(range(written - markers.CAPACITY, n))


def test_unterminated_last_step_of_a_dead_process_is_counted(tmp_path):
    src = source(tmp_path, alive=lambda pid: False)
    run_writer(tmp_path, "markers.step(0)\nmarkers.step(1)")
    assert [r.fields["step"] for r in src.poll()] == [0]
    assert src.stats()["unterminated_steps"] == 1


def test_rings_appearing_later_and_several_at_once(tmp_path):
    src = source(tmp_path, alive=lambda pid: False)
    assert src.poll() == []
    pids = [run_writer(tmp_path, "markers.step(7)\nmarkers.done()", RANK=str(rank))
            for rank in range(3)]
    recs = src.poll()
    # no job env: the job tag falls back to the writer's pid
    assert sorted((r.tags["rank"], r.tags["job"]) for r in recs) == \
        sorted((str(rank), str(pid)) for rank, pid in enumerate(pids))
    assert list(tmp_path.iterdir()) == []


def test_bad_rings_are_counted_once_and_skipped(tmp_path):
    src = source(tmp_path)
    (tmp_path / "11.ring").write_bytes(b"NOPE" + bytes(600))
    (tmp_path / "12.ring").write_bytes(b"FSMK")                 # shorter than a header
    (tmp_path / "13.ring").write_bytes(bytes(markers.HEADER_SIZE))   # not stamped yet
    (tmp_path / "notes.txt").write_text("not a ring")
    assert src.poll() == []
    assert src.poll() == []
    assert src.stats()["bad_rings"] == 2


def test_unwritable_directory_makes_the_source_unavailable(tmp_path):
    from fabricscope.agent.probes.base import ProbeUnavailable
    blocker = tmp_path / "file"
    blocker.write_text("x")
    ctx = ProbeContext("n0", frozenset(), Clock(), None)
    with pytest.raises(ProbeUnavailable, match="markers directory"):
        MarkersSource(ctx, directory=str(blocker / "sub")).attach()
