"""Following NCCL log files (rotation, truncation, partial and overlong lines) and the
nccl_log source end to end on real files and pipes (no root)."""

import os
from types import SimpleNamespace

import pytest

from fabricscope.agent.probes.nccl.log_tail import FileTail, StreamTail
from fabricscope.agent.probes.base import Clock, ProbeContext, ProbeUnavailable
from fabricscope.agent.probes.nccl.log_source import NcclLogSource
from fabricscope.errors import UserError

COLL = ("h:9:9 [0] NCCL INFO AllReduce: opCount {n:x} sendbuff 0x1 recvbuff 0x1 count 10 "
        "datatype 7 op 0 root 0 comm 0xc0 [nranks=2] stream 0x5\n")


def append(path, text):
    with open(path, "a") as f:
        f.write(text)


def test_partial_line_waits_for_its_newline(tmp_path):
    log = tmp_path / "a.log"
    append(log, "one\ntw")
    tail = FileTail(str(log))
    assert tail.read_lines() == ["one"]
    assert tail.read_lines() == []
    append(log, "o\n")
    assert tail.read_lines() == ["two"]
    tail.close()


def test_missing_file_is_picked_up_when_it_appears(tmp_path):
    tail = FileTail(str(tmp_path / "later.log"))
    assert tail.read_lines() == [] and not tail.is_open
    append(tmp_path / "later.log", "hello\n")
    assert tail.read_lines() == ["hello"]
    tail.close()


def test_truncation_starts_again_from_the_top(tmp_path):
    log = tmp_path / "t.log"
    append(log, "a\nb\nc\n")
    tail = FileTail(str(log))
    assert tail.read_lines() == ["a", "b", "c"]
    with open(log, "w") as f:          # copytruncate, then the writer goes on
        f.write("x\n")
    assert tail.read_lines() == ["x"]
    assert tail.stats.truncations == 1
    tail.close()


def test_rotation_reads_the_old_file_to_its_end_then_the_new_one(tmp_path):
    log = tmp_path / "r.log"
    append(log, "1\n")
    tail = FileTail(str(log))
    assert tail.read_lines() == ["1"]
    append(log, "2\n3")                # written before the writer reopened
    os.rename(log, tmp_path / "r.log.1")
    append(log, "new\n")
    assert tail.read_lines() == ["2", "3", "new"]
    assert tail.stats.rotations == 1
    append(log, "more\n")
    assert tail.read_lines() == ["more"]
    tail.close()


def test_overlong_lines_are_dropped_and_counted(tmp_path):
    log = tmp_path / "o.log"
    tail = FileTail(str(log), max_line=10)
    append(log, "x" * 25)              # no newline yet: already too long
    assert tail.read_lines() == []
    append(log, "yyy\nok\n" + "z" * 11 + "\nend\n")
    assert tail.read_lines() == ["ok", "end"]
    assert tail.stats.overlong == 2
    tail.close()


def test_read_is_bounded_per_call(tmp_path):
    log = tmp_path / "big.log"
    append(log, "".join(f"{i:07d}\n" for i in range(1000)))   # 8000 bytes
    tail = FileTail(str(log), chunk=1000)
    first = tail.read_lines(max_bytes=4000)
    rest = tail.read_lines(max_bytes=1 << 20)
    assert len(first) == 500 and first + rest == [f"{i:07d}" for i in range(1000)]
    tail.close()


def test_stream_tail_reads_a_pipe_without_blocking():
    r, w = os.pipe()
    try:
        tail = StreamTail(r)
        assert tail.read_lines() == []
        os.write(w, b"a\nb\nc")
        assert tail.read_lines() == ["a", "b"]
        os.close(w)
        w = -1
        assert tail.read_lines() == ["c"] and tail.eof
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def ctx():
    return ProbeContext("n1", frozenset(), Clock(), SimpleNamespace())


def test_source_follows_glob_matches_and_counts_outcomes(tmp_path):
    first = tmp_path / "nccl.host.1.log"
    append(first, COLL.format(n=1) + "junk line\n")
    src = NcclLogSource(ctx(), paths=[str(tmp_path / "nccl.*.log")], rescan_s=0)
    src.attach()
    try:
        recs = src.poll()
        assert [(r.measurement, r.fields["op_count"]) for r in recs] == [("nccl_log_coll", 1)]
        second = tmp_path / "nccl.host.2.log"
        append(second, COLL.format(n=2))
        append(first, COLL.format(n=3))
        assert sorted(r.fields["op_count"] for r in src.poll()) == [2, 3]
        stats = src.stats()
        assert (stats["lines_record"], stats["lines_foreign"], stats["files_followed"]) == \
            (3, 1, 2)
        second.unlink()                 # read to its end already: retired
        assert src.poll() == [] and src.following() == [str(first)]
    finally:
        src.detach()


def test_source_reads_stdin_pipe():
    r, w = os.pipe()
    src = NcclLogSource(ctx(), paths=["-"], stdin_fd=r)
    src.attach()
    try:
        os.write(w, COLL.format(n=7).encode())
        assert [rec.fields["op_count"] for rec in src.poll()] == [7]
    finally:
        src.detach()
        os.close(r)
        os.close(w)


def test_source_without_paths_is_unavailable():
    with pytest.raises(ProbeUnavailable, match="nccl_log_paths"):
        NcclLogSource(ctx(), paths=[]).attach()


def test_source_rejects_a_directory(tmp_path):
    with pytest.raises(UserError, match="not a regular file"):
        NcclLogSource(ctx(), paths=[str(tmp_path)]).attach()
