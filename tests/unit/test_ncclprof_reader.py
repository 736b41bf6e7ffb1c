"""The ring reader against rings written by hand: published, torn and foreign files."""

import ctypes

import pytest

from fabricscope.agent.probes.ncclprof import layout
from fabricscope.agent.probes.ncclprof.reader import RingError, RingReader, ring_paths


def write_ring(path, records, write_index=None, capacity=16, magic=layout.MAGIC, pid=4242):
    h = layout.RingHeader(magic=magic, version=layout.VERSION, header_size=layout.HEADER_SIZE,
                          record_size=layout.RECORD_SIZE, capacity=capacity, pid=pid)
    h.write_index = len(records) if write_index is None else write_index
    body = bytearray(capacity * layout.RECORD_SIZE)
    for i, rec in enumerate(records):
        body[i * layout.RECORD_SIZE:(i + 1) * layout.RECORD_SIZE] = bytes(rec)
    path.write_bytes(bytes(h) + bytes(body))


def coll(index, **kw):
    r = layout.RawRecord(commit=index + 1, kind=layout.Kind.COLL, func=5, algo=2, proto=3,
                         dtype=10, count=8, bytes=16, **kw)
    return r


def test_published_records_decode_and_the_read_index_advances(tmp_path):
    path = tmp_path / "fabricscope-ncclprof-4242.ring"
    write_ring(path, [coll(0, seq=1), coll(1, seq=2)])
    reader = RingReader(path, pid_alive=lambda pid: True)
    recs = reader.poll()
    assert [(r.func, r.algo, r.proto, r.dtype, r.seq) for r in recs] == \
        [("AllReduce", "RING", "SIMPLE", "ncclBfloat16", 1), ("AllReduce", "RING", "SIMPLE",
                                                             "ncclBfloat16", 2)]
    assert reader.header.read_index == 2 and reader.poll() == []
    assert ring_paths(tmp_path) == [path]


def test_a_record_its_dead_producer_never_published_is_skipped_and_counted(tmp_path):
    path = tmp_path / "r.ring"
    unpublished = coll(1)
    unpublished.commit = 0
    write_ring(path, [coll(0), unpublished, coll(2)])
    alive = {"yes": True}
    reader = RingReader(path, pid_alive=lambda pid: alive["yes"])
    assert len(reader.poll()) == 1            # waits: the producer may be mid-copy
    alive["yes"] = False
    assert len(reader.poll()) == 1 and reader.counters()["torn"] == 1


def test_a_record_stuck_across_two_polls_behind_published_ones_is_skipped(tmp_path):
    path = tmp_path / "r.ring"
    stuck = coll(0)
    stuck.commit = 0
    write_ring(path, [stuck, coll(1)])
    reader = RingReader(path, pid_alive=lambda pid: True)
    assert reader.poll() == []
    assert len(reader.poll()) == 1 and reader.torn == 1


def test_an_unknown_code_is_counted_not_raised(tmp_path):
    path = tmp_path / "r.ring"
    write_ring(path, [coll(0, ), layout.RawRecord(commit=2, kind=9)])
    reader = RingReader(path, pid_alive=lambda pid: True)
    assert len(reader.poll()) == 1 and reader.decode_errors == 1


@pytest.mark.parametrize("kw,msg", [({"magic": 1}, "magic 0x1 is not the profiler's"),
                                    ({"capacity": 12}, "capacity 12 does not fit")])
def test_a_foreign_file_is_refused_with_its_cause_and_fix(tmp_path, kw, msg):
    path = tmp_path / "r.ring"
    write_ring(path, [], **kw)
    with pytest.raises(RingError, match=msg) as e:
        RingReader(path)
    assert "\n" not in str(e.value) and "same fabricscope release" in str(e.value)


def test_a_short_file_is_refused(tmp_path):
    (tmp_path / "r.ring").write_bytes(b"\0" * 10)
    with pytest.raises(RingError, match="shorter than the ring header"):
        RingReader(tmp_path / "r.ring")


def test_header_counters_are_read_by_name(tmp_path):
    path = tmp_path / "r.ring"
    write_ring(path, [])
    raw = bytearray(path.read_bytes())
    ctypes.c_uint64.from_buffer(raw, 192 + 8 * layout.Counter.RING_FULL).value = 3
    path.write_bytes(bytes(raw))
    assert RingReader(path).counters()["ring_full"] == 3
