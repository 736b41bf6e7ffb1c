"""agent/sources/markers.py against real rings written by fabricscope.markers (no root)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fabricscope.agent.kube.resolver import PodIdentity, Resolution
from fabricscope.agent.probes.base import Clock, ProbeContext
from fabricscope.agent.sources.markers import MarkersSource, writer_pid
from fabricscope import markers

ROOT = Path(__file__).resolve().parents[2]


def source(directory: Path, alive=lambda pid: True, pods=None,
           proc: Path = Path("/proc")) -> MarkersSource:
    ctx = ProbeContext("n0", frozenset(), Clock(), None, pods=pods)
    src = MarkersSource(ctx, directory=str(directory), pid_alive=alive, proc=proc)
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


class OnePod:
    """A PodResolver that places every process in one pod of a training job
    (agent/kube/resolver.py; the real one is tested in test_kube_*)."""

    def __init__(self, resolution=Resolution.POD):
        self.resolution = resolution
        self.asked: list[int] = []

    def for_pid(self, proc, pid):
        self.asked.append(pid)
        if self.resolution is not Resolution.POD:
            return self.resolution, None
        return Resolution.POD, PodIdentity("team-a", "llama-worker-1", "uid-1",
                                           job="team-a/llama", index="1")


def test_a_ring_in_a_pod_carries_its_pod_and_its_training_job(tmp_path, writer):
    pods = OnePod()
    src = source(tmp_path, pods=pods)
    markers.step(0)
    markers.step(1)
    (rec,) = src.poll()
    assert rec.tags == {"job": "team-a/llama", "rank": "1", "namespace": "team-a",
                        "pod": "llama-worker-1"}
    assert pods.asked == [os.getpid()]      # the writer maps its ring: found by its pid


def test_a_ring_whose_pod_is_not_listed_yet_is_read_once_it_is(tmp_path, writer):
    pods = OnePod(Resolution.PENDING)
    src = source(tmp_path, pods=pods)
    markers.step(0)
    markers.step(1)
    assert src.poll() == []
    pods.resolution = Resolution.POD
    assert [r.tags["job"] for r in src.poll()] == ["team-a/llama"]


def fake_proc(root: Path, pid: int, nspid: str, maps_inode: int | None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "status").write_text(f"Name:\tpython\nNSpid:\t{nspid}\n")
    line = "7f00-7f10 rw-s 00000000 00:1a {} /run/fabricscope/markers/7.ring\n"
    (d / "maps").write_text(line.format(maps_inode) if maps_inode is not None else "")


def test_a_writer_in_its_own_pid_namespace_is_found_by_the_ring_it_maps(tmp_path):
    # the header says pid 7 (the pod's pid namespace); on the host it is 4242. The
    # host's pid 7 is another process, which does not map the ring
    fake_proc(tmp_path, 7, "7", None)
    fake_proc(tmp_path, 4100, "4100 7", 999)          # another pod's pid 7
    fake_proc(tmp_path, 4242, "4242 7", 1234)
    assert writer_pid(tmp_path, 7, 1234) == 4242
    assert writer_pid(tmp_path, 7, 5555) is None      # nobody maps it: exited
    fake_proc(tmp_path, 9, "9", 1234)
    assert writer_pid(tmp_path, 9, 1234) == 9         # one pid namespace: the header's
