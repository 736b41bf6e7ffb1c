"""tcp_flows: C header vs ctypes mirrors (host cc), flow event decoding from raw bytes,
and the BPF source inliner."""

from __future__ import annotations

import ctypes
import shutil
import struct
import subprocess

import pytest

from fabricscope.agent import bpf
from fabricscope.agent.probes.tcp import flow_layout as fl
from fabricscope.agent.probes.tcp.common import addr_key
from fabricscope import schema

# struct fs_flow_event, packed by hand from bpf/tcp_flows.h (not via ctypes).
EVENT = struct.Struct("<Q16s16sHHHBBiiIIQQQQIIQ")


def raw(ev_type, saddr="198.18.0.1", daddr="198.18.0.2", sport=40000, dport=29500, active=1,
        oldstate=2, state=1, reason=0xFFFFFFFF, flags=0, duration_ns=0, acked=0, sent=0,
        received=0, pid=0, gap_ns=0):
    return EVENT.pack(1_000, addr_key(saddr), addr_key(daddr), sport, dport, 2, ev_type,
                      active, oldstate, state, reason, flags, duration_ns, acked, sent,
                      received, pid, 0, gap_ns)


def wall(ns):
    return ns + 10 ** 18


def valid(rec):
    rec.tags["node"] = "n0"
    schema.validate(rec)
    return rec


def test_open_event():
    rec = valid(fl.decode_flow_event(raw(fl.EV_OPEN, duration_ns=250_000), wall))
    assert (rec.measurement, rec.time_ns) == ("tcp_flow_open", 10 ** 18 + 1_000)
    assert rec.tags["side"] == "client" and rec.tags["sport"] == "40000"
    assert rec.fields == {"active": True, "handshake_us": 250.0}
    passive = fl.decode_flow_event(raw(fl.EV_OPEN, active=0, oldstate=3), wall)
    assert passive.tags["side"] == "server" and "handshake_us" not in passive.fields


def test_close_event_with_and_without_what_the_probe_saw():
    rec = valid(fl.decode_flow_event(raw(
        fl.EV_CLOSE, oldstate=9, state=7, flags=fl.CLOSE_ESTABLISHED | fl.CLOSE_UNA,
        duration_ns=3 * 10 ** 9, acked=1 << 33, sent=(1 << 33) + 5, received=77), wall))
    assert rec.tags["from_state"] == "LAST_ACK"
    assert rec.fields == {"established": True, "active": True, "duration_s": 3.0,
                          "bytes_acked": 1 << 33, "bytes_sent": (1 << 33) + 5,
                          "bytes_received": 77}
    failed = valid(fl.decode_flow_event(raw(fl.EV_CLOSE, oldstate=2, state=7), wall))
    assert failed.tags["from_state"] == "SYN_SENT"
    assert failed.fields == {"established": False, "active": True}
    # seen only at teardown (tcp_destroy_sock): the state it closed from is not known
    late = valid(fl.decode_flow_event(raw(fl.EV_CLOSE, oldstate=0, state=7,
                                          flags=fl.CLOSE_ESTABLISHED), wall))
    assert late.tags["from_state"] == "UNKNOWN" and late.fields["established"] is True


def test_reset_events():
    sent = valid(fl.decode_flow_event(raw(fl.EV_RST_SENT, state=0, reason=1), wall))
    assert sent.tags["direction"] == "sent" and sent.tags["reason"] == "NO_SOCKET"
    assert "state" not in sent.tags and sent.fields == {"count": 1}
    got = valid(fl.decode_flow_event(raw(fl.EV_RST_RECV, state=0), wall))
    assert got.tags["direction"] == "received" and "reason" not in got.tags
    old_kernel = fl.decode_flow_event(raw(fl.EV_RST_SENT, state=1), wall)
    assert "reason" not in old_kernel.tags and old_kernel.tags["state"] == "ESTABLISHED"


def test_transfer_event():
    rec = valid(fl.decode_flow_event(raw(fl.EV_TRANSFER, active=0, duration_ns=1_500_000,
                                         acked=120, received=1 << 20), wall))
    assert (rec.measurement, rec.time_ns) == ("tcp_transfer", 10 ** 18 + 1_000)
    assert rec.tags["side"] == "server" and rec.tags["daddr"] == "198.18.0.2"
    assert rec.fields == {"seconds": 0.0015, "bytes_in": 1 << 20, "bytes_out": 120}
    # one after a reported transfer of the flow carries the pause (0 is a pause too)
    after = valid(fl.decode_flow_event(raw(fl.EV_TRANSFER, flags=fl.TRANSFER_AFTER_REPORTED,
                                           acked=3000, gap_ns=7_500_000), wall))
    assert after.fields["gap_s"] == 0.0075 and after.fields["bytes_out"] == 3000


def test_bad_events_are_errors_not_guesses():
    with pytest.raises(ValueError):
        fl.decode_flow_event(b"\0" * 20, wall)
    with pytest.raises(ValueError, match="unknown type"):
        fl.decode_flow_event(raw(9), wall)


def test_the_connecting_pid_rides_on_the_event_not_in_the_record():
    event = raw(fl.EV_TRANSFER, duration_ns=1_000, acked=70_000, pid=4321)
    assert fl.connecting_pid(event) == 4321
    assert "pid" not in fl.decode_flow_event(event, wall).tags    # owner tags come later
    assert fl.connecting_pid(raw(fl.EV_RST_RECV)) == 0 and fl.connecting_pid(b"\0" * 20) == 0


def test_mirror_sizes():
    assert ctypes.sizeof(fl.FlowEvent) == EVENT.size == 112
    assert ctypes.sizeof(fl.FlowSlot) == 232 and ctypes.sizeof(fl.FlowStat) == 464
    assert fl.STAT_DTYPE.itemsize == 464 and fl.FLOW_DTYPE.itemsize == 36


def _offsets(tmp_path, struct_name, mirror):
    fields = [name for name, _ in mirror._fields_]
    prog = tmp_path / f"{struct_name}.c"
    prog.write_text(
        '#include <stdio.h>\n#include <stddef.h>\n#include "tcp_flows.h"\nint main(void) {\n'
        f'  printf("size %zu\\n", sizeof(struct {struct_name}));\n'
        + "".join(f'  printf("{f} %zu\\n", offsetof(struct {struct_name}, {f}));\n'
                  for f in fields) + "  return 0;\n}\n")
    exe = tmp_path / struct_name
    subprocess.run(["cc", f"-I{bpf.BPF_DIR}", "-o", str(exe), str(prog)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
@pytest.mark.parametrize("struct_name,mirror", [
    ("fs_flow_event", fl.FlowEvent), ("fs_flow_slot", fl.FlowSlot), ("fs_flow_stat", fl.FlowStat),
    ("fs_sock", fl.Sock)])
def test_ctypes_mirrors_match_the_c_header(tmp_path, struct_name, mirror):
    got = _offsets(tmp_path, struct_name, mirror)
    assert got.pop("size") == ctypes.sizeof(mirror)
    for name, offset in got.items():
        assert offset == getattr(mirror, name).offset, name


def test_inline_includes_pastes_local_headers_once_with_line_markers(tmp_path):
    (tmp_path / "a.h").write_text("#define A 1\n")
    (tmp_path / "b.h").write_text('#include "a.h"\nint b;\n')
    (tmp_path / "p.bpf.c").write_text('#include <linux/types.h>\n#include "a.h"\n'
                                      '#include "b.h"\nint main;\n')
    text = bpf.inline_includes(tmp_path / "p.bpf.c")
    assert text.count("#define A 1") == 1 and "int b;" in text
    assert "#include <linux/types.h>" in text and '#include "a.h"' not in text
    assert text.splitlines()[-2:] == ['#line 4 "p.bpf.c"', "int main;"]


def test_the_real_programs_inline_the_shared_helpers_once():
    text = bpf.inline_includes(bpf.BPF_DIR / "tcp_flows.bpf.c")
    assert text.count("BPF_HASH(own_addrs") == 1
    assert "TRACEPOINT_PROBE(tcp, tcp_retransmit_skb)" in text
    assert "TRACEPOINT_PROBE(tcp, tcp_probe)" in text


def test_counter_names_cover_the_c_counters_in_order():
    """Both programs count into one `stats` array (bpf/fs_common.h): tcp_retransmit's
    FS_NSTATS counters, then tcp_flows' FS_NFSTATS at offset FS_NSTATS, so the Python
    names must match the C numbering exactly or every flow counter shifts."""
    import re
    from pathlib import Path

    from fabricscope.agent.probes.tcp.retransmit import STATS
    bpf_dir = Path(bpf.__file__).resolve().parent.parent / "bpf"
    retransmit = (bpf_dir / "tcp_retransmit.h").read_text()
    flows = (bpf_dir / "tcp_flows.h").read_text()

    def numbered(text: str, prefix: str) -> list[int]:
        return [int(n) for n in re.findall(rf"#define {prefix}\w+ (\d+)", text)]
    assert numbered(retransmit, "FS_STAT_") == list(range(len(STATS)))
    assert int(re.search(r"#define FS_NSTATS (\d+)", retransmit).group(1)) == len(STATS)
    assert numbered(flows, "FS_FSTAT_") == list(range(len(fl.FLOW_STATS)))
    assert int(re.search(r"#define FS_NFSTATS (\d+)", flows).group(1)) == len(fl.FLOW_STATS)
