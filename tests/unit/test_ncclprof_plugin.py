"""The plugin driven through each ABI version as NCCL drives it (tests/support/
nccl_profiler_host.py), its records read back through the agent's ring reader."""

import os
import time

import pytest

from fabricscope.agent.probes.ncclprof.layout import Flag, Kind, Wait
from fabricscope.agent.probes.ncclprof.reader import RingReader
from tests.support import nccl_profiler_host as nh


@pytest.fixture(scope="session")
def plugin(tmp_path_factory):
    return nh.build_plugin(tmp_path_factory.mktemp("plugin"))


def run(plugin, tmp_path, version, **kw):
    host = nh.NcclHost(plugin, version, tmp_path)
    ctx, mask = host.init()
    nh.collective(host, ctx, seq=7, **kw)
    reader = RingReader(host.ring_path)
    return host, ctx, mask, reader, reader.poll()


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6])
def test_every_version_reports_the_collective_with_its_proxy_ops(plugin, tmp_path, version):
    host, ctx, mask, reader, recs = run(plugin, tmp_path, version)
    assert mask == nh.COLL | nh.P2P | nh.PROXY_OP | nh.PROXY_STEP | nh.KERNEL_CH | nh.NET_PLUGIN
    proxies = [r for r in recs if r.kind is Kind.PROXY]
    (coll,) = [r for r in recs if r.kind is Kind.COLL]
    assert (coll.func, coll.algo, coll.proto, coll.dtype) == ("AllReduce", "RING", "SIMPLE",
                                                              "ncclFloat32")
    assert (coll.count, coll.bytes, coll.nchannels, coll.rank) == (1 << 20, 4 << 20, 2, 3)
    assert coll.comm_hash == (0xC0FFEE if version < 4 else 0x1234ABCD)
    assert coll.seq == (7 if version > 1 else coll.seq)
    assert not coll.flags & (Flag.INCOMPLETE | Flag.ORPHAN) and coll.stop_ns >= coll.start_ns
    if version >= 3:    # kernel channels keep the collective open for its proxy ops
        assert coll.proxy_ops == len(proxies) == 4 and coll.steps == 16
        assert coll.sent_bytes == coll.recv_bytes == 2 * 4 * 65536
    else:               # published at its stop: the proxy ops come after, and name it
        assert coll.proxy_ops == 0 and len(proxies) == 4
        assert all(p.flags & Flag.ORPHAN and p.comm_hash == coll.comm_hash for p in proxies)
    assert {(p.channel, p.peer, bool(p.flags & Flag.SEND)) for p in proxies} == \
        {(c, 1, s) for c in (0, 1) for s in (True, False)}
    assert all(p.seq == coll.seq and p.func == "AllReduce" and p.bytes == 4 * 65536
               for p in proxies)
    assert reader.counters()["records"] == 5 and reader.counters()["ignored"] >= 1
    host.finalize(ctx)
    assert nh.pool_in_use(host) == 0


@pytest.mark.parametrize("version,clock,span", [(1, None, None), (2, None, None),
                                                (3, "host", None), (4, "gpu", 5001),
                                                (5, "gpu", 5001), (6, "gpu", 5001)])
def test_kernel_time_is_gpu_side_when_the_abi_gives_ptimers(plugin, tmp_path, version, clock,
                                                            span):
    *_, recs = run(plugin, tmp_path, version)
    (coll,) = [r for r in recs if r.kind is Kind.COLL]
    assert coll.kernel_clock == clock
    assert coll.kernel_chs == (2 if version >= 3 else 0)
    if span is not None:
        assert (coll.kernel_start, coll.kernel_ns) == (1_000_000, span)


@pytest.mark.parametrize("version", [4, 5, 6])
def test_step_states_split_send_and_receive_waits_with_their_bytes(plugin, tmp_path, version):
    *_, recs = run(plugin, tmp_path, version)
    send = next(r for r in recs if r.kind is Kind.PROXY and r.flags & Flag.SEND)
    recv = next(r for r in recs if r.kind is Kind.PROXY and not r.flags & Flag.SEND)
    assert all(send.waits_ns[w] > 0 for w in (Wait.SEND_GPU, Wait.SEND_PEER, Wait.SEND_NET))
    assert all(recv.waits_ns[w] > 0 for w in (Wait.RECV_NET, Wait.RECV_FLUSH, Wait.RECV_GPU))
    assert send.waits_ns[Wait.RECV_NET] == 0 and recv.waits_ns[Wait.SEND_NET] == 0
    assert (send.sent_bytes, send.recv_bytes, recv.recv_bytes) == (4 * 65536, 0, 4 * 65536)
    assert (send.net_events, send.net_bytes, send.net_qp) == (4, 4 * 65536, 0x1A2)
    assert recv.net_events == 0 and send.steps == send.nsteps == 4


def test_a_full_pool_returns_null_handles_and_counts_them(plugin, tmp_path):
    host = nh.NcclHost(plugin, 5, tmp_path, pool=16)
    ctx, _ = host.init()
    handles = [host.start(ctx, nh.COLL, coll__func="AllReduce", coll__nChannels=0)
               for _ in range(20)]
    assert handles[:16] == [h for h in handles[:16] if h] and handles[16:] == [None] * 4
    reader = RingReader(host.ring_path)
    assert reader.counters()["pool_exhausted"] == 4
    for h in handles[:16]:
        host.stop(h)
    assert len(reader.poll()) == 16 and nh.pool_in_use(host) == 0


def test_a_stop_that_never_arrives_is_reclaimed_when_the_pool_runs_dry(plugin, tmp_path,
                                                                        monkeypatch):
    monkeypatch.setenv("FABRICSCOPE_NCCLPROF_STALE_MS", "1")
    host = nh.NcclHost(plugin, 6, tmp_path, pool=16)
    ctx, _ = host.init()
    leaked = [host.start(ctx, nh.COLL, coll__func="Broadcast") for _ in range(16)]
    deadline = time.monotonic() + 10
    fresh = None
    while fresh is None and time.monotonic() < deadline:   # await the sweep (every 100 ms)
        fresh = host.start(ctx, nh.COLL, coll__func="Broadcast")
    assert fresh is not None
    reader = RingReader(host.ring_path)
    recs = reader.poll()
    assert reader.counters()["stale_reclaimed"] == 16 == len(recs)
    assert all(r.flags & Flag.INCOMPLETE and r.func == "Broadcast" for r in recs)
    host.stop(leaked[0])                      # the late stop hits a reused object's old handle
    assert reader.counters()["bad_handle"] == 1
    host.stop(fresh)
    assert nh.pool_in_use(host) == 0


def test_finalize_closes_what_is_still_open_and_counts_it(plugin, tmp_path):
    host = nh.NcclHost(plugin, 4, tmp_path)
    ctx, _ = host.init()
    coll = host.start(ctx, nh.COLL, coll__func="AllGather", coll__nChannels=2)
    host.stop(coll)                 # its two kernel channels never come
    op = host.start(ctx, nh.PROXY_OP, coll, proxyOp__pid=os.getpid(), proxyOp__isSend=1)
    host.start(ctx, nh.PROXY_STEP, op)
    host.finalize(ctx)
    reader = RingReader(host.ring_path)
    recs = reader.poll()
    assert sorted(r.kind for r in recs) == [Kind.COLL, Kind.PROXY]
    assert all(r.flags & Flag.INCOMPLETE for r in recs)
    assert reader.counters()["unfinished_at_finalize"] == 3 and nh.pool_in_use(host) == 0
    assert reader.producer_gone()        # the last communicator closed the ring


def test_a_proxy_op_from_another_process_or_a_gone_collective_is_an_orphan(plugin, tmp_path):
    host = nh.NcclHost(plugin, 5, tmp_path)
    ctx, _ = host.init()
    coll = host.start(ctx, nh.COLL, coll__func="AllReduce", coll__nChannels=0,
                      coll__seqNumber=11)
    foreign = host.start(ctx, nh.PROXY_OP, coll, proxyOp__pid=os.getpid() + 1)
    host.stop(coll)                        # no kernel channels: published at its stop
    late = host.start(ctx, nh.PROXY_OP, coll, proxyOp__pid=os.getpid())
    host.stop(foreign)
    host.stop(late)
    reader = RingReader(host.ring_path)
    proxies = [r for r in reader.poll() if r.kind is Kind.PROXY]
    assert len(proxies) == 2 and all(r.flags & Flag.ORPHAN for r in proxies)
    assert [(r.func, r.seq) for r in proxies] == [("Unknown", 0), ("AllReduce", 11)]
    assert reader.counters()["orphans"] == 2


def test_event_mask_comes_from_nccl_profile_event_mask(plugin, tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_PROFILE_EVENT_MASK", "0x1a")
    host = nh.NcclHost(plugin, 6, tmp_path)
    assert host.init()[1] == 0x1A
