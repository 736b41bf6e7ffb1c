"""tcp_retransmit decoding from raw event bytes, and the C/ctypes layout agreement."""

from __future__ import annotations

import ctypes
import shutil
import socket
import struct
import subprocess

import pytest

from fabricscope.agent import bpf
from fabricscope.agent.probes.tcp import retransmit as tr
from fabricscope import schema

# struct fs_retransmit_event, packed by hand from bpf/tcp_retransmit.h (not via ctypes).
EVENT = struct.Struct("<Q16s16sHHHHiiBBBBI")


def raw_event(ts, saddr, daddr, sport, dport, family=2, segs=1, state=1, err=0, hook=1,
              ca_state=3, timeout=0, nbytes=None):
    nbytes = segs * 1448 if nbytes is None else nbytes
    return EVENT.pack(ts, tr.addr_key(saddr), tr.addr_key(daddr), sport, dport, family, segs,
                      state, err, hook, ca_state, timeout, 0, nbytes)


def to_wall(ns):
    return ns + 1_000_000_000_000


def test_ipv4_retransmit_decodes_to_a_valid_record():
    rec = tr.decode(raw_event(5, "198.18.0.1", "198.18.0.2", 40000, 29500, segs=45), to_wall)
    assert (rec.measurement, rec.time_ns) == ("tcp_retransmit", 1_000_000_000_005)
    assert rec.tags == {"saddr": "198.18.0.1", "daddr": "198.18.0.2", "sport": "40000",
                        "dport": "29500", "state": "ESTABLISHED", "kind": "fast"}
    assert rec.fields == {"segs": 45, "err": 0, "payload_bytes": 45 * 1448}
    schema.validate(_with_node(rec))


def _with_node(rec):
    rec.tags["node"] = "n0"
    return rec


def test_ipv6_and_unknown_segment_count():
    rec = tr.decode(raw_event(1, "fd00::1", "fd00::2", 1, 2, family=10, segs=0, state=2),
                    to_wall)
    assert (rec.tags["saddr"], rec.tags["daddr"], rec.tags["state"]) == \
        ("fd00::1", "fd00::2", "SYN_SENT")
    # unknown (TC did not see it) counts as one segment, of unknown size
    assert rec.fields == {"segs": 1, "err": 0}


def test_skipped_retransmit_is_its_own_measurement():
    rec = tr.decode(raw_event(1, "198.18.0.1", "198.18.0.2", 1, 2, err=-16, segs=0), to_wall)
    assert rec.measurement == "tcp_retransmit_skipped"
    assert rec.tags["reason"] == "EBUSY" and rec.fields == {"err": -16}
    schema.validate(_with_node(rec))


@pytest.mark.parametrize("err", [1, -105, -1])     # NET_XMIT_DROP, ENOBUFS, EPERM
def test_transmit_failures_count_as_retransmits_like_the_kernel(err):
    rec = tr.decode(raw_event(1, "198.18.0.1", "198.18.0.2", 1, 2, err=err, segs=3), to_wall)
    assert rec.measurement == "tcp_retransmit"
    assert rec.fields == {"segs": 3, "err": err, "payload_bytes": 3 * 1448}
    assert tr.err_name(err) in ("NET_XMIT_DROP", "ENOBUFS", "EPERM")


def test_short_event_is_an_error_not_a_guess():
    with pytest.raises(ValueError):
        tr.decode(b"\0" * 10, to_wall)


def test_address_keys_are_v4_mapped():
    assert tr.addr_key("198.18.0.1") == socket.inet_pton(socket.AF_INET6, "::ffff:198.18.0.1")
    assert tr.addr_text(tr.addr_key("198.18.0.1")) == "198.18.0.1"
    assert tr.addr_text(tr.addr_key("fd00::7")) == "fd00::7"


def test_ctypes_mirror_matches_the_hand_packed_layout():
    assert ctypes.sizeof(tr.RetransmitEvent) == EVENT.size == 64


@pytest.mark.parametrize("hook,state,ca_state,timeout,segs,kind", [
    (1, 1, 3, 0, 1, "fast"),          # Recovery
    (1, 1, 3, 0, 45, "fast"),
    (1, 1, 4, 1, 1, "rto"),           # first retransmit after entering Loss
    (1, 1, 4, 0, 1, "slow_start"),    # later ones in Loss
    (1, 1, 4, 0, 45, "slow_start"),
    (1, 1, 0, 0, 1, "tlp"),           # Open
    (1, 1, 1, 0, 1, "tlp"),           # Disorder
    (1, 1, 2, 0, 1, "tlp"),           # CWR
    # more than one MSS outside Loss and Recovery: from the retransmit queue, which
    # the kernel counts as fast (a probe is one segment)
    (1, 1, 0, 0, 45, "fast"),
    (1, 1, 1, 0, 2, "fast"),
    (1, 2, 4, 1, 1, "syn"),           # SYN_SENT, whatever the congestion state says
    (2, 3, 4, 1, 1, "synack"),
    (1, 1, 0xff, 0, 1, "unknown"),    # no tcp_cong_state_set on this kernel
])
def test_retransmit_kinds(hook, state, ca_state, timeout, segs, kind):
    assert tr.retransmit_kind(hook, state, ca_state, timeout, segs) == kind
    rec = tr.decode(raw_event(1, "198.18.0.1", "198.18.0.2", 1, 2, hook=hook, state=state,
                              ca_state=ca_state, timeout=timeout, segs=segs), to_wall)
    assert rec.tags["kind"] == kind
    schema.validate(_with_node(rec))


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_ctypes_mirror_matches_the_c_header(tmp_path):
    fields = [name for name, _ in tr.RetransmitEvent._fields_]
    prog = tmp_path / "layout.c"
    prog.write_text(
        '#include <stdio.h>\n#include <stddef.h>\n#include "tcp_retransmit.h"\n'
        "int main(void) {\n"
        '  printf("size %zu\\n", sizeof(struct fs_retransmit_event));\n'
        + "".join(f'  printf("{f} %zu\\n", offsetof(struct fs_retransmit_event, {f}));\n'
                  for f in fields)
        + '  printf("sizeof_flow %zu\\n", sizeof(struct fs_flow));\n  return 0;\n}\n')
    exe = tmp_path / "layout"
    subprocess.run(["cc", f"-I{bpf.BPF_DIR}", "-o", str(exe), str(prog)], check=True)
    got = dict(line.split() for line in subprocess.run(
        [str(exe)], capture_output=True, text=True, check=True).stdout.splitlines())
    assert int(got["size"]) == ctypes.sizeof(tr.RetransmitEvent)
    assert int(got["sizeof_flow"]) == ctypes.sizeof(tr.FsFlow)
    for f in fields:
        assert int(got[f]) == getattr(tr.RetransmitEvent, f).offset, f


def test_check_layout_names_the_mismatch():
    class Wrong(ctypes.Structure):
        _fields_ = [("ts_ns", ctypes.c_uint32)]
    with pytest.raises(Exception, match="ts_ns"):
        bpf.check_layout(Wrong, tr.RetransmitEvent)
    bpf.check_layout(tr.RetransmitEvent, tr.RetransmitEvent)


def test_tracepoint_format_parsing(tmp_path):
    fmt = tmp_path / "events/tcp/tcp_retransmit_skb/format"
    fmt.parent.mkdir(parents=True)
    fmt.write_text(
        "name: tcp_retransmit_skb\nformat:\n"
        "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
        "\tfield:const void * skaddr;\toffset:16;\tsize:8;\tsigned:0;\n"
        "\tfield:__u8 saddr_v6[16];\toffset:42;\tsize:16;\tsigned:0;\n"
        "\tfield:int err;\toffset:76;\tsize:4;\tsigned:1;\n")
    assert bpf.tracepoint_fields("tcp", "tcp_retransmit_skb", tmp_path) == \
        {"common_type", "skaddr", "saddr_v6", "err"}
    assert bpf.tracepoint_fields("tcp", "nope", tmp_path) is None


@pytest.mark.parametrize("release, raw", [("6.18.44-fc-v669", True), ("4.17.0", True),
                                          ("4.16.18-1-amd64", False), ("3.10.0-1160.el7", False),
                                          ("5.4.0-generic", True), ("weird", False)])
def test_raw_tracepoints_from_the_kernel_release(release, raw):
    assert tr.has_raw_tracepoints(release) is raw
