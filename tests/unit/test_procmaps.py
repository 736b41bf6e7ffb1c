"""Discovery of library files in process maps (agent/procmaps.py), with the NCCL
probe's name pattern: parsing and a fake /proc tree (no root)."""

import os
import re

from fabricscope.agent import procmaps
from fabricscope.agent.probes.nccl.probe import LIB_NAME

MAPS = """\
55d0c7a00000-55d0c7a21000 r--p 00000000 fd:01 1311 /usr/bin/python3.11
7f2a10000000-7f2a10200000 r--p 00000000 fd:01 4242 /opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2
7f2a10200000-7f2a20000000 r-xp 00200000 fd:01 4242 /opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2
7f2a30000000-7f2a30001000 r--p 00000000 00:2a 77 /usr/lib/x86_64-linux-gnu/libnccl.so.2.18.3 (deleted)
7f2a40000000-7f2a40001000 r--p 00000000 fd:01 88 /usr/lib/libnccl-net.so
7f2a50000000-7f2a50001000 rw-p 00000000 00:00 0 [heap]
7f2a60000000-7f2a60001000 r--p 00000000 fd:01 99 /data/my libnccl.so.2 copy/libnccl.so
"""


def test_parse_maps_finds_each_nccl_file_once():
    found = procmaps.parse_maps(MAPS, LIB_NAME)
    assert [(m.dev, m.inode, m.path, m.deleted) for m in found] == [
        ("fd:01", 4242, "/opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2",
         False),
        ("00:2a", 77, "/usr/lib/x86_64-linux-gnu/libnccl.so.2.18.3", True),
        ("fd:01", 99, "/data/my libnccl.so.2 copy/libnccl.so", False),
    ]
    assert found[0].start == 0x7F2A10000000 and found[0].end == 0x7F2A10200000


def test_parse_maps_with_a_configured_name():
    found = procmaps.parse_maps(MAPS, re.compile(r"^libnccl-net\.so$"))
    assert [m.inode for m in found] == [88]


def make_proc(tmp_path, pid, lib_path, inode="4242", real=None):
    """A fake /proc/PID with maps and root/; `real` is the file the path resolves to."""
    d = tmp_path / "proc" / str(pid)
    (d / "root").mkdir(parents=True)
    (d / "maps").write_text(f"7f0000000000-7f0000001000 r-xp 00000000 fd:01 {inode} {lib_path}\n")
    target = d / "root" / lib_path.lstrip("/")
    target.parent.mkdir(parents=True)
    if real is None:
        target.write_bytes(b"\x7fELF fake")
    else:
        os.link(real, target)
    return target


def test_scan_groups_pids_by_file_and_keeps_known_files(tmp_path):
    lib = make_proc(tmp_path, 100, "/lib/libnccl.so.2")
    make_proc(tmp_path, 101, "/container/path/libnccl.so.2", real=lib)   # same inode
    make_proc(tmp_path, 102, "/other/libnccl.so.2", inode="5")            # another file
    (tmp_path / "proc" / "self").mkdir()                                  # not a pid
    proc = tmp_path / "proc"
    first = procmaps.scan(proc, LIB_NAME)
    try:
        assert first.scanned == 3
        groups = sorted(sorted(s.pids) for s in first.files.values())
        assert groups == [[100, 101], [102]]
        key = next(k for k, s in first.files.items() if 100 in s.pids)
        assert key == (os.stat(lib).st_dev, os.stat(lib).st_ino)
        # pid 101 exits; a rescan reuses the open file and only updates pids
        (proc / "101" / "maps").write_text("")
        again = procmaps.scan(proc, LIB_NAME, known=first.files)
        assert again.files[key] is first.files[key] and again.files[key].pids == {100}
        assert len(again.files) == 2
    finally:
        for s in first.files.values():
            os.close(s.fd)


def test_scan_counts_unopenable_mappings(tmp_path):
    d = tmp_path / "proc" / "7"
    d.mkdir(parents=True)
    (d / "maps").write_text(
        "7f0000000000-7f0000001000 r-xp 00000000 fd:01 1 /gone/libnccl.so.2 (deleted)\n")
    result = procmaps.scan(tmp_path / "proc", LIB_NAME)
    assert result.files == {} and result.unreadable == 1


def test_skip_pids(tmp_path):
    make_proc(tmp_path, 100, "/lib/libnccl.so.2")
    result = procmaps.scan(tmp_path / "proc", LIB_NAME, skip_pids=frozenset({100}))
    assert result.files == {} and result.scanned == 0


def test_needles_skip_maps_without_them(tmp_path):
    make_proc(tmp_path, 100, "/lib/libnccl.so.2")
    proc = tmp_path / "proc"
    assert procmaps.scan(proc, LIB_NAME, needles=("libtorch_cpu",)).files == {}
    found = procmaps.scan(proc, LIB_NAME, needles=("libnccl",))
    try:
        assert [s.pids for s in found.files.values()] == [{100}]
    finally:
        for s in found.files.values():
            os.close(s.fd)


def test_the_maps_cache_serves_a_second_scan_of_the_same_moment(tmp_path):
    from fabricscope.agent.procmaps import MapsCache
    now = [100.0]
    cache = MapsCache(ttl_s=1.0, clock=lambda: now[0])
    pid_dir = tmp_path / "42"
    pid_dir.mkdir()
    (pid_dir / "maps").write_text("first\n")
    assert cache.read(str(pid_dir)) == "first\n"
    (pid_dir / "maps").write_text("second\n")
    assert cache.read(str(pid_dir)) == "first\n" and cache.hits == 1     # same moment
    now[0] += 1.0
    assert cache.read(str(pid_dir)) == "second\n"                         # stale: read again


def _stat(proc, pid: int, start: int) -> None:
    # /proc/PID/stat: field 22 (the 20th after the parenthesised command) is the start time
    rest = " ".join(["S"] + ["0"] * 18 + [str(start)] + ["0"] * 10)
    (proc / str(pid) / "stat").write_text(f"{pid} (python3 (x)) {rest}\n")


def test_a_memo_rereads_only_new_young_or_all_at_a_full_rescan(tmp_path):
    proc = tmp_path / "proc"
    make_proc(tmp_path, 100, "/lib/libnccl.so.2")          # maps the library
    (proc / "200").mkdir()
    (proc / "200" / "maps").write_text("")                 # maps nothing (yet)
    _stat(proc, 100, 5000)
    _stat(proc, 200, 6000)
    now = [0.0]
    # start times in ticks of 1/100 s: 100 started 10 s before the first scan, 200 at it
    memo = procmaps.ScanMemo(young_s=60.0, full_s=30.0, clock=lambda: now[0],
                             uptime=lambda: 60.0 + now[0], ticks_per_s=100)
    first = procmaps.scan(proc, LIB_NAME, memo=memo)
    try:
        assert first.scanned == 2 and first.remembered == 0           # the first is full
        key = next(iter(first.files))
        # 10 s on: 100 keeps its library without a read; 200 is young: read again
        (proc / "100" / "maps").write_text("")
        now[0] = 10.0
        again = procmaps.scan(proc, LIB_NAME, known=first.files, memo=memo)
        assert (again.scanned, again.remembered) == (1, 1)
        assert again.files[key].pids == {100}
        # 70 s on, 5 s after a full rescan: 200 is old now, and not read either
        memo.last_full = 65.0
        now[0] = 70.0
        later = procmaps.scan(proc, LIB_NAME, known=first.files, memo=memo)
        assert (later.scanned, later.remembered) == (0, 2)           # 200 is old now
        assert later.files[key].pids == {100}
        # the full rescan reads everyone: 100 no longer maps it
        now[0] = 96.0
        full = procmaps.scan(proc, LIB_NAME, known=first.files, memo=memo)
        assert (full.scanned, full.remembered) == (2, 0)
        assert full.files[key].pids == set()
    finally:
        for s in first.files.values():
            os.close(s.fd)


def test_a_memo_counts_youth_from_the_process_start_not_from_the_first_scan(tmp_path):
    """An agent started next to a long-running training reads its maps once, not at
    every rescan of its first minute."""
    proc = tmp_path / "proc"
    (proc / "400").mkdir(parents=True)
    (proc / "400" / "maps").write_text("")
    _stat(proc, 400, 1000)                         # started 10 s after boot
    now = [0.0]
    memo = procmaps.ScanMemo(young_s=60.0, full_s=1000.0, clock=lambda: now[0],
                             uptime=lambda: 3600.0 + now[0], ticks_per_s=100)
    assert procmaps.scan(proc, LIB_NAME, memo=memo).scanned == 1
    now[0] = 2.0
    assert (procmaps.scan(proc, LIB_NAME, memo=memo).scanned, memo.young(memo.procs[400])) \
        == (0, False)
    (proc / "401").mkdir()
    (proc / "401" / "maps").write_text("")
    _stat(proc, 401, 360000)                       # started 2 s ago: young
    now[0] = 4.0
    again = procmaps.scan(proc, LIB_NAME, memo=memo)
    now[0] = 6.0
    assert (again.scanned, procmaps.scan(proc, LIB_NAME, memo=memo).scanned) == (1, 1)


def test_a_memo_tells_a_reused_pid_by_its_start_time(tmp_path):
    proc = tmp_path / "proc"
    (proc / "300").mkdir(parents=True)
    (proc / "300" / "maps").write_text("")
    _stat(proc, 300, 100)
    now = [0.0]
    memo = procmaps.ScanMemo(young_s=1.0, full_s=1000.0, clock=lambda: now[0],
                             uptime=lambda: 1.0 + now[0], ticks_per_s=100)
    procmaps.scan(proc, LIB_NAME, memo=memo)
    now[0] = 5.0                                       # old, and no full rescan due
    assert procmaps.scan(proc, LIB_NAME, memo=memo).remembered == 1
    lib = make_proc(tmp_path, 301, "/lib/libnccl.so.2")
    _stat(proc, 301, 200)
    # pid 300 exits and a new process (another start time) gets it: read at once
    import shutil
    shutil.rmtree(proc / "300")
    make_proc(tmp_path, 300, "/lib/libnccl.so.2", real=lib)
    _stat(proc, 300, 900)
    found = procmaps.scan(proc, LIB_NAME, memo=memo)
    try:
        assert found.scanned == 2 and sorted(p for s in found.files.values() for p in s.pids) \
            == [300, 301]
    finally:
        for s in found.files.values():
            os.close(s.fd)
