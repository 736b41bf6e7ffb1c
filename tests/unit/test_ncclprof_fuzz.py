"""Random event sequences through the plugin: no crash, the pool bounded, and the
counters consistent with what was driven and what the ring holds."""

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabricscope.agent.probes.ncclprof.reader import RingReader
from tests.support import nccl_profiler_host as nh

POOL = 32
TYPES = [nh.GROUP, nh.COLL, nh.P2P, nh.PROXY_OP, nh.PROXY_STEP, nh.KERNEL_CH, nh.NET_PLUGIN,
         nh.PROXY_CTRL, nh.COLL_API]
STATES = [0, 2, 5, 8, 9, 10, 11, 12, 19, 20, 21, 22, 99]

op = st.one_of(
    st.tuples(st.just("start"), st.sampled_from(TYPES), st.integers(0, 40), st.integers(0, 4)),
    st.tuples(st.just("stop"), st.integers(0, 40)),
    st.tuples(st.just("state"), st.integers(0, 40), st.sampled_from(STATES)),
    st.tuples(st.just("garbage"), st.integers(0, 2**64 - 1)))


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    return nh.build_plugin(tmp_path_factory.mktemp("plugin"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(version=st.sampled_from([3, 4, 5, 6]), ops=st.lists(op, max_size=120))
def test_random_event_sequences_keep_the_pool_bounded_and_counters_consistent(
        plugin, tmp_path_factory, version, ops):
    host = nh.NcclHost(plugin, version, tmp_path_factory.mktemp("ring"), pool=POOL, records=64)
    ctx, _ = host.init()
    handles: list = []
    starts = 0
    for o in ops:
        if o[0] == "start":
            _, type_, parent, channels = o
            parent_h = handles[parent] if parent < len(handles) else None
            extra = {"proxyOp__pid": os.getpid()} if type_ == nh.PROXY_OP else {}
            if type_ == nh.COLL:
                extra = {"coll__func": "AllReduce",
                         ("coll__nMaxChannels" if version < 4 else "coll__nChannels"): channels}
            handles.append(host.start(ctx, type_, parent_h, **extra))
            starts += 1
        elif o[0] == "stop" and o[1] < len(handles):
            host.stop(handles[o[1]])
        elif o[0] == "state" and o[1] < len(handles):
            host.state(handles[o[1]], o[2], size=4096, ptimer=10)
        elif o[0] == "garbage":
            host.stop(o[1] or None)
        assert nh.pool_in_use(host) <= POOL
    reader = RingReader(host.ring_path)
    published = reader.poll()
    host.finalize(ctx)
    published += reader.poll()
    c = reader.counters()
    assert nh.pool_in_use(host) == 0
    assert c["events"] == starts
    assert c["records"] + c["ring_full"] >= len(published) and c["records"] == len(published)
    assert c["torn"] == 0 and c["decode_errors"] == 0
