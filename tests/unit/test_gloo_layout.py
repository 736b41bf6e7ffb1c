"""agent/probes/gloo/layout.py: the C/Python contract and event decoding (no root).

The golden events carry the values a real 3-rank DDP run produced on this machine
(torch 2.13.0+cpu, an MLP of 2 x Linear(1024, 1024)): DDP's rebuilt gradient
bucket of 1,049,600 float32 and the parameter broadcast of 2,099,200.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest

from fabricscope.agent.probes.gloo import layout as gl

HEADER = Path(__file__).resolve().parents[2] / "bpf" / "gloo.h"
SOURCE = HEADER.with_name("gloo.bpf.c")


def event(**kw) -> bytes:
    base = dict(start_ns=1_000_000, end_ns=21_000_000, pid=4242, tid=4243, ctx_rank=0,
                ctx_size=3)
    base.update(kw)
    ev = gl.GlooEvent(**base)
    return bytes(ev)


def test_event_struct_matches_the_c_header():
    text = HEADER.read_text()
    body = re.search(r"struct fs_gloo_event \{(.*?)\};", text, re.S).group(1)
    c_fields = re.findall(r"__([us]\d+)\s+(\w+);", body)
    assert [name for _, name in c_fields] == [name for name, _ in gl.GlooEvent._fields_]
    sizes = {"u64": 8, "u32": 4, "s32": 4}
    for (ctype, name), (_, pytype) in zip(c_fields, gl.GlooEvent._fields_):
        assert sizes[ctype] == ctypes.sizeof(pytype), name
    assert ctypes.sizeof(gl.GlooEvent) == 104


def test_stats_and_ops_match_the_c_header():
    text = HEADER.read_text()
    stats = re.findall(r"#define FS_GS_(\w+) (\d+)", text)
    assert [int(v) for _, v in stats if _ != "NSTATS"] == list(range(len(gl.STATS)))
    ops = dict(re.findall(r"#define FS_GLOO_(\w+) (\d+)", text))
    assert int(ops.pop("NOPS")) == len(gl.OPS) + len(gl.P2P)
    assert {int(v): k.lower() for k, v in ops.items()} == \
        {**{op.id: op.bpf_fn for op in gl.OPS}, **{op.id: op.bpf_tag for op in gl.P2P}}


def test_cflags_define_every_layout_the_program_uses():
    used = set(re.findall(r"FS_LAYOUT_(\w+)\)", SOURCE.read_text()))
    flags = {f.split("=")[0][len("-DFS_LAYOUT_"):]: f.split("=")[1]
             for f in gl.cflags() if f.startswith("-DFS_LAYOUT_")}
    assert used == set(flags)
    assert flags["ALLREDUCE"] == "80,88,2,56,-1"
    assert f"-DFS_UB_SIZE_OFF={gl.UB_SIZE_OFF}" in gl.cflags()
    for entry in (f"{op.bpf_fn}_entry" for op in gl.OPS):
        assert f"FS_ENTRY({entry[:-6]}," in SOURCE.read_text()


def test_symbols_are_the_mangled_gloo_functions():
    for op in gl.OPS:
        assert op.symbol.startswith("_ZN4gloo")
        assert op.bpf_fn in op.symbol.lower()


def test_decode_allreduce_bucket_from_options():
    c = gl.decode(event(op=0, elements=1_049_600, elem_size=4, out_size=4_198_400,
                        sent_bytes=5_597_872, recv_bytes=5_597_856, sends=8, recvs=8), 3)
    assert (c.op, c.model, c.bytes, c.bytes_source) == ("AllReduce", "AllReduce", 4_198_400,
                                                        "options")
    assert (c.nranks, c.rank, c.pid, c.tid) == (3, 0, 4242, 4243)
    assert c.seconds == pytest.approx(0.020)
    assert (c.sent_bytes, c.sends, c.recv_bytes, c.recvs) == (5_597_872, 8, 5_597_856, 8)


def test_decode_broadcast_from_options():
    c = gl.decode(event(op=1, elements=2_099_200, elem_size=4, out_size=8_396_800,
                        sent_bytes=16_793_600, sends=2), 3)
    assert (c.op, c.bytes, c.bytes_source) == ("Broadcast", 8_396_800, "options")


def test_disagreeing_options_fall_back_to_transfers():
    # elements x elementSize != the buffer's own size: the offsets are wrong here
    c = gl.decode(event(op=0, elements=999, elem_size=4, out_size=4_198_400,
                        sent_bytes=5_597_872), 3)
    assert c.bytes_source == "transfers"
    assert c.bytes == round(5_597_872 / (2 * 2 / 3))


def test_unreadable_fields_fall_back_and_unknown_without_sends():
    c = gl.decode(event(op=0, elements=1, elem_size=4, out_size=4, flags=gl.F_NO_OUT), 3)
    assert (c.bytes, c.bytes_source) == (None, "unknown")
    c = gl.decode(event(op=0, elements=4, elem_size=3, out_size=12, sent_bytes=8), 3)
    assert c.bytes_source == "transfers"             # elementSize 3 is no C type


def test_bad_context_uses_world_size_and_no_rank():
    c = gl.decode(event(op=0, elements=4, elem_size=4, out_size=16, ctx_rank=5, ctx_size=3), 3)
    assert (c.nranks, c.rank) == (3, None)
    c = gl.decode(event(op=0, elements=4, elem_size=4, out_size=16, ctx_size=8), 4)
    assert (c.nranks, c.rank) == (4, None)          # larger than the job: misread
    c = gl.decode(event(op=0, elements=4, elem_size=4, out_size=16, flags=gl.F_NO_CONTEXT))
    assert (c.nranks, c.rank) == (None, None)


def test_size_rules_of_the_other_collectives():
    ag = gl.decode(event(op=2, elem_size=8, out_size=24, in_size=8), 3)
    assert (ag.op, ag.bytes, ag.bytes_source) == ("AllGather", 24, "options")
    bad = gl.decode(event(op=2, elem_size=8, out_size=20, in_size=8), 3)
    assert bad.bytes_source == "unknown"            # not n x elementSize: misread
    gather = gl.decode(event(op=5, elem_size=4, in_size=400, out_size=1200), 3)
    assert gather.bytes == 1200
    scatter = gl.decode(event(op=6, elem_size=4, out_size=100, ctx_size=4), 4)
    assert scatter.bytes == 400                     # per-rank output x nranks
    barrier = gl.decode(event(op=9), 3)
    assert (barrier.op, barrier.model, barrier.bytes) == ("Barrier", None, 0)


def test_decode_rejects_garbage():
    with pytest.raises(ValueError):
        gl.decode(b"\0" * 10)
    with pytest.raises(ValueError):
        gl.decode(event(op=77))


def test_point_to_point_symbols_name_their_call_work_and_wait():
    for op in gl.P2P:
        kind = op.name                                   # Send / Recv
        assert f"ProcessGroupGloo4{kind.lower()}E" in op.call
        assert f"{kind}WorkC1" in op.work and f"{kind}Work4wait" in op.wait


def test_decode_a_send_and_a_recv_with_their_peer_and_buffer_size():
    send = gl.decode(event(op=10, out_size=4000, peer=1, ctx_rank=-1, ctx_size=-1), 2)
    assert (send.op, send.model, send.bytes, send.bytes_source, send.peer) == \
        ("Send", "Send", 4000, "buffer", 1)
    assert send.nranks == 2 and send.rank is None and send.seconds == 0.02
    recv = gl.decode(event(op=11, out_size=4000, peer=0), 2)
    assert (recv.op, recv.peer, recv.bytes) == ("Recv", 0, 4000)


def test_a_point_to_point_misread_keeps_the_event_without_its_size_or_peer():
    unread = gl.decode(event(op=10, out_size=4000, peer=1, flags=gl.F_NO_OUT), 2)
    assert unread.bytes is None and unread.bytes_source == "unknown" and unread.peer == 1
    outside = gl.decode(event(op=11, out_size=1 << 41, peer=5), 2)
    assert outside.bytes is None and outside.peer is None
    anysource = gl.decode(event(op=11, out_size=8, peer=-1), None)
    assert anysource.peer is None and anysource.bytes == 8
