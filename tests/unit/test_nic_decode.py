"""nic probe decoders without root: header mirrors, flow deltas, drop reasons, qdiscs, settings."""

import argparse
import re
from pathlib import Path

import numpy as np
import pytest

from fabricscope.agent.config import AgentConfig
from fabricscope.agent.probes.nic import drops as nic_drops
from fabricscope.agent.probes.nic import qdisc as nic_qdisc
from fabricscope.agent.probes.nic.flows import KEY_DTYPE, VAL_DTYPE, FlowTable
from fabricscope.agent.probes.nic.ring import BIN_DTYPE
from fabricscope.agent.probes.nic.settings import LinkSpeeds, from_config, ring_slots
from fabricscope import config as fsconfig
from fabricscope.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
SIZES = {"__u8": 1, "__u16": 2, "__u32": 4, "__u64": 8}


def c_struct(name: str) -> list[tuple[str, int, int]]:
    """(field, offset, size) of a struct in bpf/nic.h, with natural alignment."""
    text = (ROOT / "bpf" / "nic.h").read_text()
    body = re.search(r"struct %s \{(.*?)\};" % name, text, re.S).group(1)
    out, off, align = [], 0, 1
    for typ, field, count in re.findall(r"(__u\d+)\s+(\w+)(?:\[(\d+)\])?;", body):
        size = SIZES[typ]
        off = (off + size - 1) // size * size
        out.append((field, off, size * int(count or 1)))
        off += size * int(count or 1)
        align = max(align, size)
    return out + [("<size>", (off + align - 1) // align * align, 0)]


@pytest.mark.parametrize("name,dtype", [("fs_nic_bin", BIN_DTYPE),
                                        ("fs_nic_flow_key", KEY_DTYPE),
                                        ("fs_nic_flow_val", VAL_DTYPE)])
def test_numpy_mirrors_match_nic_h(name, dtype):
    fields = c_struct(name)
    assert fields[-1][1] == dtype.itemsize
    for field, off, size in fields[:-1]:
        assert dtype.fields[field][1] == off, field
        assert dtype.fields[field][0].itemsize == size, field


# --- flows ---------------------------------------------------------------------------

def flow_key(src="198.19.1.1", dst="198.19.1.2", sport=40000, dport=5201, proto=6,
             direction=0, ifindex=3) -> bytes:
    k = np.zeros(1, KEY_DTYPE)
    k["saddr"][0, :4] = [int(x) for x in src.split(".")]
    k["daddr"][0, :4] = [int(x) for x in dst.split(".")]
    k["ifindex"], k["sport"], k["dport"], k["proto"], k["family"], k["dir"] = \
        ifindex, sport, dport, proto, 4, direction
    return k.tobytes()


def flow_vals(per_cpu) -> bytes:
    """per_cpu: list of (bytes, packets, ce, last_ns, dscp)."""
    v = np.zeros(len(per_cpu), VAL_DTYPE)
    for i, (b, p, ce, last, dscp) in enumerate(per_cpu):
        v[i] = (b, last, p, ce, dscp, np.zeros(7, np.uint8))
    return v.tobytes()


def table(deleted=None, cpus=2, idle_ns=10**9):
    return FlowTable(cpus, idle_ns, (deleted if deleted is not None else []).append)


def test_flow_deltas_sum_cpus_and_subtract_the_previous_read():
    t = table()
    k = flow_key()
    (d,) = t.update(k, flow_vals([(1000, 2, 0, 5, 0), (500, 1, 1, 9, 46)]), 1, now_ns=10)
    assert (d.bytes, d.packets, d.ce_marks, d.dscp) == (1500, 3, 1, 46)   # dscp of newest
    assert (d.saddr, d.daddr, d.sport, d.dport, d.proto, d.direction) == \
        ("198.19.1.1", "198.19.1.2", 40000, 5201, "tcp", "rx")
    (d,) = t.update(k, flow_vals([(1800, 3, 0, 20, 0), (500, 1, 1, 9, 46)]), 1, now_ns=30)
    assert (d.bytes, d.packets, d.ce_marks, d.dscp) == (800, 1, 0, 0)
    assert t.update(k, flow_vals([(1800, 3, 0, 20, 0), (500, 1, 1, 9, 46)]), 1, now_ns=40) == []


def test_flow_that_vanished_without_our_delete_counts_as_evicted():
    t = table()
    t.update(flow_key(), flow_vals([(10, 1, 0, 5, 0), (0, 0, 0, 0, 0)]), 1, now_ns=10)
    assert t.update(b"", b"", 0, now_ns=20) == []
    assert t.evicted == 1


def test_idle_flows_are_deleted_after_their_last_delta_and_restart_cleanly():
    deleted: list[bytes] = []
    t = table(deleted, idle_ns=100)
    k = flow_key(proto=17, direction=1)
    (d,) = t.update(k, flow_vals([(10, 1, 0, 5, 0), (0, 0, 0, 0, 0)]), 1, now_ns=500)
    assert d.proto == "udp" and d.direction == "tx" and deleted == [k]
    assert t.evicted == 0 and t.deleted == 1
    (d,) = t.update(k, flow_vals([(4, 1, 0, 600, 0), (0, 0, 0, 0, 0)]), 1, now_ns=610)
    assert d.bytes == 4                       # a re-created entry counts from zero


def test_ipv6_flow_addresses():
    k = np.zeros(1, KEY_DTYPE)
    k["saddr"][0] = list(bytes.fromhex("fd000000000000000000000000000001"))
    k["daddr"][0] = list(bytes.fromhex("fd000000000000000000000000000002"))
    k["family"], k["proto"] = 6, 58
    (d,) = table(cpus=1).update(k.tobytes(), flow_vals([(80, 1, 0, 1, 0)]), 1, now_ns=1)
    assert (d.saddr, d.daddr, d.proto, d.sport) == ("fd00::1", "fd00::2", "icmpv6", 0)


# --- drop reasons --------------------------------------------------------------------

FORMAT = """name: kfree_skb
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:void * skbaddr;\toffset:8;\tsize:8;\tsigned:0;
\tfield:unsigned short protocol;\toffset:32;\tsize:2;\tsigned:0;
\tfield:enum skb_drop_reason reason;\toffset:36;\tsize:4;\tsigned:0;

print fmt: "skbaddr=%p reason: %s", REC->skbaddr, __print_symbolic(REC->reason, { 1, "CONSUMED" }, { 2, "NOT_SPECIFIED" }, { 3, "NO_SOCKET" }, { 12, "NETFILTER_DROP" })
"""


def test_reason_layout_from_the_format_file():
    off, names = nic_drops.reason_layout(FORMAT)
    assert off == 36
    assert names == {1: "CONSUMED", 2: "NOT_SPECIFIED", 3: "NO_SOCKET", 12: "NETFILTER_DROP"}
    old = FORMAT.replace("\tfield:enum skb_drop_reason reason;\toffset:36;\tsize:4;\tsigned:0;\n", "")
    assert nic_drops.reason_layout(old) is None


def test_drop_counts_are_deltas_by_name_without_consumed():
    _, names = nic_drops.reason_layout(FORMAT)
    counts = nic_drops.DropCounts(names, other_slot=511)
    totals = [0] * 512
    totals[3], totals[1] = 5, 100
    assert counts.update(totals) == {"NO_SOCKET": 5}
    totals[3], totals[12], totals[511], totals[1] = 7, 1, 4, 200
    assert counts.update(totals) == {"NO_SOCKET": 2, "NETFILTER_DROP": 1, "OTHER": 4}
    assert counts.update(totals) == {}


def test_initial_netns_check(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("x")
    b.write_text("y")
    assert nic_drops.in_initial_netns(str(a), str(a))
    assert not nic_drops.in_initial_netns(str(a), str(b))
    assert not nic_drops.in_initial_netns(str(tmp_path / "missing"), str(a))
    # PID 1's namespace unreadable: the initial namespace's fixed inode decides
    assert not nic_drops.in_initial_netns(str(a), str(tmp_path / "missing"))


# --- qdiscs --------------------------------------------------------------------------

class Msg(dict):
    def __init__(self, kind, handle, parent, queue, basic, index=3):
        super().__init__(index=index, handle=handle, parent=parent)
        self.attrs = {"TCA_KIND": kind, "TCA_STATS2": Stats({"TCA_STATS_QUEUE": queue,
                                                            "TCA_STATS_BASIC": basic})}

    def get_attr(self, name):
        return self.attrs.get(name)


class Stats(dict):
    def get_attr(self, name):
        return self.get(name)


def test_qdisc_parse_and_deltas():
    q = {"qlen": 3, "backlog": 4500, "drops": 10, "requeues": 0, "overlimits": 50}
    tbf = nic_qdisc.parse(Msg("tbf", 0x10000, 0xFFFFFFFF, q, {"bytes": 10**6, "packets": 700}))
    assert (tbf.kind, tbf.handle, tbf.parent, tbf.backlog_bytes, tbf.qlen) == \
        ("tbf", "1:0", "root", 4500, 3)
    assert nic_qdisc.parse(Msg("clsact", 0xFFFF0000, 0xFFFFFFF1, q, {})) is None
    deltas = nic_qdisc.QdiscDeltas([tbf])
    q2 = dict(q, drops=25, overlimits=80, backlog=0, qlen=0)
    (d,) = deltas.update([nic_qdisc.parse(Msg("tbf", 0x10000, 0xFFFFFFFF, q2,
                                              {"bytes": 2 * 10**6, "packets": 1400}))])
    assert (d.drops, d.overlimits, d.bytes, d.packets, d.backlog_bytes) == (15, 30, 10**6, 700, 0)
    # replaced qdisc: counters went down, so they count from zero
    (d,) = deltas.update([nic_qdisc.parse(Msg("tbf", 0x10000, 0xFFFFFFFF, dict(q, drops=2),
                                              {"bytes": 5, "packets": 1}))])
    assert (d.drops, d.bytes) == (2, 5)


# --- settings ------------------------------------------------------------------------

def agent_cfg(*argv) -> AgentConfig:
    parser = argparse.ArgumentParser()
    fsconfig.add_arguments(parser, AgentConfig)
    return fsconfig.load(AgentConfig, "agent", parser.parse_args(list(argv)), env={})


def test_defaults_give_65536_bins_of_100_us():
    # 4 poll intervals of 1.0 s (40,000 bins), rounded up to a power of two
    s = from_config(agent_cfg())
    assert (s.bin_ns, s.window_ns, s.ring_slots, s.bins_per_window, s.threshold) == \
        (100_000, 10**9, 65536, 10_000, 0.5)
    assert ring_slots(100_000, 0.2) == 8192
    assert ring_slots(10_000, 0.2) == 131072 and ring_slots(10**7, 0.2) == 1024


def test_rings_over_the_budget_get_fewer_slots_within_it():
    from fabricscope.agent.probes.nic.settings import BIN_BYTES, RING_BUDGET_BYTES, slots_within
    # 2 NICs on 128 CPUs: 8192 slots (0.2 s of 100 us bins at a margin of 4) fit 128 MiB
    assert slots_within(RING_BUDGET_BYTES, 2, 128) == 8192
    assert 8192 * 2 * 2 * BIN_BYTES * 128 <= RING_BUDGET_BYTES
    assert slots_within(RING_BUDGET_BYTES, 1, 2) >= 65536        # this lab: never shrinks
    assert slots_within(1, 64, 1024) == 1024                     # never below the minimum


@pytest.mark.parametrize("argv,words", [
    (["--nic-bin-us", "5"], "nic_bin_us 5"),
    (["--nic-window-s", "0.00015"], "not a multiple"),
    (["--nic-burst-threshold", "1.5"], "nic_burst_threshold"),
    (["--link-speed-bps", "eth0=fast"], "not a link speed"),
    (["--link-speed-bps", "1gbit,2gbit"], "two defaults"),
    (["--interfaces", "bad name"], "not an interface name"),
    (["--nic-max-flows", "3"], "nic_max_flows"),
    (["--nic-bursts-per-window", "-1"], "nic_bursts_per_window"),
])
def test_bad_settings_are_one_line_user_errors(argv, words):
    with pytest.raises(UserError) as err:
        from_config(agent_cfg(*argv))
    assert words in err.value.cause and "\n" not in err.value.one_line()


def test_link_speed_precedence(tmp_path):
    (tmp_path / "eth0" / "device").mkdir(parents=True)     # hardware under it
    (tmp_path / "eth0" / "speed").write_text("25000\n")
    (tmp_path / "veth1").mkdir()
    (tmp_path / "veth1" / "speed").write_text("-1\n")
    parsed = LinkSpeeds.parse(["eth1=100mbit", "40gbit"])
    speeds = LinkSpeeds(parsed.overrides, parsed.default_bps, tmp_path)
    assert speeds.speed_bps("eth0") == 25 * 10**9          # kernel
    assert speeds.speed_bps("eth1") == 10**8               # override
    assert speeds.speed_bps("veth1") == 40 * 10**9         # kernel unknown: bare default
    assert LinkSpeeds(sysfs=tmp_path).speed_bps("nope") is None   # no guess
    assert LinkSpeeds.parse(["eth0=1.5gbit"]).overrides == {"eth0": 1_500_000_000}
