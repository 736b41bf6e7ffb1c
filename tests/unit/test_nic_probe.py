"""nic probe glue without root: names shared with the C side, record values, schema."""

import re
from pathlib import Path

import pytest

from fabricscope.agent.config import AgentConfig
from fabricscope.agent.probes import REGISTRY, load_class
from fabricscope.agent.probes.base import Clock, ProbeContext
from fabricscope.agent.probes.nic.probe import DROP_SLOTS, IFINDEX_SLOTS, KERNEL_STATS, NicProbe
from fabricscope.agent.probes.nic.settings import LineRate, SpeedSource
from fabricscope.agent.probes.nic.window import Burst, WindowStats
from fabricscope.errors import UserError
from fabricscope.records import Record
from fabricscope.agent.bpf import inline_includes
from fabricscope.schema import validate

ROOT = Path(__file__).resolve().parents[2]
C_SOURCE = inline_includes(ROOT / "bpf" / "nic.bpf.c")   # with bpf/fs_common.h
HEADER = (ROOT / "bpf" / "nic.h").read_text()
LOADER = (ROOT / "agent" / "probes" / "nic" / "probe.py").read_text()


GBIT = LineRate(1_000_000_000, SpeedSource.KERNEL)


def probe(**cfg) -> NicProbe:
    return NicProbe(ProbeContext("n", frozenset(), Clock(offset_ns=10**18), AgentConfig(**cfg)))


def test_registered():
    assert REGISTRY["nic"] == "fabricscope.agent.probes.nic.probe:NicProbe"
    assert load_class("nic") is NicProbe and NicProbe.needs_bpf


def test_every_map_and_function_the_loader_uses_exists_in_the_c_source():
    used = set(re.findall(r'_bpf\[b"(\w+)"\]', LOADER)) | \
        set(re.findall(r'b"(fs_nic_\w+)"', LOADER))
    assert {"fs_nic_ring", "fs_nic_flows", "fs_nic_ifaces", "stats", "fs_nic_drops",
            "fs_nic_ingress", "fs_nic_egress", "fs_nic_kfree_skb"} <= used
    for name in used:
        assert re.search(r"\b%s\b" % name, C_SOURCE), name


def test_kernel_stat_names_follow_the_header_order():
    defines = dict((int(v), k) for k, v in re.findall(r"#define FS_NIC_STAT_(\w+) (\d+)", HEADER))
    assert len(KERNEL_STATS) == int(re.search(r"FS_NIC_NSTATS (\d+)", HEADER).group(1))
    assert [defines[i].lower() for i in range(len(KERNEL_STATS))] == list(KERNEL_STATS)
    assert DROP_SLOTS == int(re.search(r"FS_NIC_DROP_SLOTS (\d+)", HEADER).group(1))
    assert IFINDEX_SLOTS == int(re.search(r"FS_NIC_IFINDEX_SLOTS (\d+)", HEADER).group(1))


def test_window_record_values():
    p = probe()
    w = WindowStats(start_ns=5 * 10**9, covered_bins=10_000, bytes=125_000_000, packets=1000,
                    peak_bytes=12_500, p99_bytes=6_250.0, hot_bins=3, lost_bins=0)
    r = p._window_record(w, {"interface": "eth0", "direction": "rx"}, GBIT,
                         p.ctx.clock.to_wall, 40, 16)
    assert r.time_ns == 10**18 + 5 * 10**9
    assert (r.fields["bursts"], r.fields["bursts_listed"]) == (40, 16)
    f = r.fields
    assert f["rate_bps"] == pytest.approx(1e9)            # 125 MB in 1 s
    assert f["peak_bps"] == pytest.approx(1e9)            # 12.5 kB in 100 us
    assert f["p99_bps"] == pytest.approx(5e8)
    assert f["peak_util"] == pytest.approx(1.0)
    assert f["hot_s"] == pytest.approx(3e-4) and f["bin_us"] == 100
    assert (f["link_speed_bps"], f["link_speed_source"]) == (10**9, "kernel")
    validate(Record(r.measurement, r.time_ns, {**r.tags, "node": "n"}, r.fields))


def test_a_window_on_a_link_without_line_rate_says_so_and_quotes_no_share_of_it():
    p = probe()
    w = WindowStats(start_ns=5 * 10**9, covered_bins=10_000, bytes=125_000_000, packets=1000,
                    peak_bytes=33_750, p99_bytes=6_250.0, hot_bins=0, lost_bins=0)
    r = p._window_record(w, {"interface": "veth0", "direction": "rx"},
                         LineRate(None, SpeedSource.UNKNOWN), p.ctx.clock.to_wall, 0, 0)
    f = r.fields
    assert f["link_speed_source"] == "unknown"
    assert not {"link_speed_bps", "peak_util", "hot_bins", "hot_s", "bursts",
                "bursts_listed"} & set(f)
    assert f["peak_bps"] == pytest.approx(2.7e9)          # 33.75 kB in 100 us, always there
    validate(Record(r.measurement, r.time_ns, {**r.tags, "node": "n"}, f))


def test_without_line_rate_no_bin_is_hot():
    p = probe()
    assert p._hot_bytes(None) == float("inf")
    assert p._hot_bytes(10**9) == pytest.approx(0.5 * 12_500)   # threshold 0.5 of 100 us


def test_burst_record_values():
    p = probe()
    b = Burst(start_ns=7_000_123, end_ns=8_000_000, bytes=125_302, packets=31,
              peak_bytes=16_168, hot_bins=9, bins=11)
    r = p._burst_record(b, {"interface": "eth0", "direction": "rx"}, GBIT,
                        p.ctx.clock.to_wall)
    assert r.time_ns == 10**18 + 7_000_123
    assert r.fields["duration_ns"] == 999_877
    assert r.fields["peak_util"] == pytest.approx(16_168 * 8 / 1e-4 / 1e9)
    validate(Record(r.measurement, r.time_ns, {**r.tags, "node": "n"}, r.fields))


def test_bad_settings_fail_at_construction_with_one_line():
    with pytest.raises(UserError) as err:
        probe(nic_bin_us=20_000)
    assert "nic_bin_us" in err.value.one_line()


def test_poll_and_detach_before_attach_are_harmless():
    p = probe()
    assert p.poll() == []
    p.detach()
    p.detach()
    assert p.stats()["lost"] == 0


def test_received_bins_are_kept_for_the_traffic_model_only_when_the_gloo_probe_runs():
    kept = probe(gloo_model_window_s=20.0).history
    assert kept is not None and kept.keep_bins == 25 * 10_000      # its window and 5 s
    assert probe(probes=["nic", "tcp_flows"]).history is None
