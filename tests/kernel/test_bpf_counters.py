"""Every BPF program counts through the one `stats` array of bpf/fs_common.h.

tcp_retransmit and tcp_flows share one object and one array (tcp_flows' counters
follow tcp_retransmit's), so a wrong offset would show up here as one program's
numbers under the other's names: each probe moves exactly the counters its
traffic explains. nic, gloo and nccl count through the same helper; their kernel
tests check their counters against crafted frames (test_nic_parse) and exact
call counts (test_nccl_probe, test_gloo_probe).
"""

from __future__ import annotations

import uuid

import pytest

from tests.kernel.tcp_lab import (Collector, await_up, finish, probes_on, send_argv, sink_argv,
                                  traffic)

pytestmark = pytest.mark.root

NBYTES = 2_000_000


@pytest.fixture(scope="module")
def lab():
    from fabricscope.lab.running import running_lab
    with running_lab(f"bc{uuid.uuid4().hex[:6]}", 2) as lab:
        yield lab


def one_transfer(lab, port: int) -> None:
    with traffic([(lab.nodes[1], sink_argv(port))]) as (sink,):
        await_up(sink)
        with traffic([(lab.nodes[0], send_argv(lab.nodes[1].address, port, NBYTES))]) as (s,):
            assert int(finish(s)) == NBYTES
        finish(sink)


@pytest.mark.parametrize("probe", ["tcp_retransmit", "tcp_flows"])
def test_each_tcp_program_moves_its_own_counters(lab, probe):
    from fabricscope.agent.probes import load_class
    from fabricscope.agent.probes.tcp.flow_layout import FLOW_STATS
    from fabricscope.agent.probes.tcp.retransmit import STATS
    with probes_on(lab, load_class(probe)) as probes:
        col = Collector(lab, probes)
        before = probes[0].stats()
        one_transfer(lab, 5200 if probe == "tcp_retransmit" else 5201)
        col.until(lambda c: any(r.measurement == "tcp_flow_close" for r in c.records[0])
                  if probe == "tcp_flows" else True, what="the sender's close")
        after = probes[0].stats()
    moved = {k for k in after if isinstance(after[k], int) and after[k] != before.get(k, 0)}
    # the sender's TC egress saw its packets, nothing was lost or retransmitted
    assert {"tc_packets", "tc_segs", "tc_bytes"} <= moved
    assert after["tc_bytes"] - before["tc_bytes"] >= NBYTES
    assert after["lost"] == 0 and after["emitted"] == before["emitted"]
    if probe == "tcp_flows":
        assert set(FLOW_STATS) - {"flow_events_lost"} <= set(after)
        # tcp_probe hits on the ACKs, the open and close state changes, the events
        assert after["probe_hits"] > before["probe_hits"]
        assert after["rtt_samples"] > before["rtt_samples"]
        assert after["state_hits"] - before["state_hits"] >= 2
        assert after["flow_events_emitted"] - before["flow_events_emitted"] >= 2
    else:
        assert not set(FLOW_STATS) & set(after)
    assert set(STATS) - {"lost"} <= set(after)


@pytest.mark.parametrize("probe", ["tcp_retransmit", "tcp_flows"])
def test_tracepoint_mode_loads_where_no_ethernet_interface_holds_the_address(probe):
    """Without TC egress (the node's address on no Ethernet interface here) the
    programs fall back to the tracepoints; that build must load too."""
    from fabricscope.agent import kernel
    from fabricscope.agent.probes import load_class
    from fabricscope.agent.probes.base import Clock, ProbeContext
    kernel.prepare()
    p = load_class(probe)(ProbeContext("n", frozenset(["198.19.255.254"]), Clock(), None))
    try:
        p.attach()
        assert p.stats()["lost"] == 0
    finally:
        p.detach()
