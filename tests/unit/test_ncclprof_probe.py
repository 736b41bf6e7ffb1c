"""The ncclprof probe over rings written by hand and by the real plugin: records with the
process's job tags, proxy ops summed per window, dead processes' rings read to the end
and removed, counters."""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from fabricscope.agent.probes.base import Clock, ProbeContext, ProbeUnavailable
from fabricscope.agent.probes.gloo.procs import ProcessTable
from fabricscope.agent.probes.ncclprof import layout
from fabricscope.agent.probes.ncclprof.probe import NcclProfProbe
from fabricscope.records import Record
from fabricscope.schema import validate
from tests.support import nccl_profiler_host as nh

MONO0, REAL0 = 5_000_000_000, 1_700_000_000_000_000_000
OFFSET = REAL0 - MONO0


class FakeProc:
    """A /proc tree: PID/ns/net (a link to this node's or another namespace) and environ."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(exist_ok=True)
        for ns in ("own-ns", "other-ns"):
            (root / ns).touch()
        self.own = os.stat(root / "own-ns").st_ino

    def add(self, pid: int, env: bytes = b"", local: bool = True) -> None:
        base = self.root / str(pid)
        (base / "ns").mkdir(parents=True)
        os.symlink(self.root / ("own-ns" if local else "other-ns"), base / "ns" / "net")
        (base / "environ").write_bytes(env)

    def kill(self, pid: int) -> None:
        os.unlink(self.root / str(pid) / "ns" / "net")

    def table(self) -> ProcessTable:
        return ProcessTable(self.root, own_netns=self.own)


def write_ring(path: Path, records, pid: int, capacity=16, counters=None) -> None:
    h = layout.RingHeader(magic=layout.MAGIC, version=layout.VERSION,
                          header_size=layout.HEADER_SIZE, record_size=layout.RECORD_SIZE,
                          capacity=capacity, pid=pid, mono_ns_at_open=MONO0,
                          real_ns_at_open=REAL0)
    h.write_index = len(records)
    for key, value in (counters or {}).items():
        h.counters[key] = value
    body = bytearray(capacity * layout.RECORD_SIZE)
    for i, rec in enumerate(records):
        rec.commit = i + 1
        body[i * layout.RECORD_SIZE:(i + 1) * layout.RECORD_SIZE] = bytes(rec)
    path.write_bytes(bytes(h) + bytes(body))


def coll(seq, start=MONO0 + 1000, **kw):
    r = layout.RawRecord(kind=layout.Kind.COLL, func=5, algo=2, proto=3, dtype=9, count=1024,
                         bytes=4096, comm_hash=0xABCDEF0123456789, seq=seq, rank=1, peer=-1,
                         nchannels=2, start_ns=start, stop_ns=start + 3000, proxy_ops=4,
                         sent_bytes=8192, recv_bytes=8192)
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def proxy(peer, channel, send, wait_ns, start=MONO0 + 2000, nbytes=65536):
    r = layout.RawRecord(kind=layout.Kind.PROXY, func=5, comm_hash=0xABCDEF0123456789,
                         rank=1, peer=peer, channel=channel, bytes=nbytes, steps=4,
                         start_ns=start, stop_ns=start + 10_000,
                         flags=layout.Flag.SEND if send else 0, net_events=2, net_ns=500)
    for w, ns in wait_ns.items():
        r.wait_ns[w] = ns
    return r


def ring_path(d: Path, pid: int) -> Path:
    return d / f"fabricscope-ncclprof-{pid}.ring"


def make_probe(tmp_path: Path, proc: FakeProc) -> NcclProfProbe:
    ctx = ProbeContext(node="n0", addresses=frozenset(), clock=Clock(0),
                       config=SimpleNamespace(ncclprof_dir=str(tmp_path / "rings")))
    probe = NcclProfProbe(ctx, procs=proc.table())
    probe.attach()
    return probe


def valid(records: list[Record]) -> list[Record]:
    for r in records:
        validate(Record(r.measurement, r.time_ns, {**r.tags, "node": "n0"}, r.fields))
    return records


@pytest.fixture
def env(tmp_path):
    (tmp_path / "rings").mkdir()
    proc = FakeProc(tmp_path / "proc")
    return tmp_path / "rings", proc


def test_a_collective_carries_the_process_job_and_rank_and_host_clock_time(tmp_path, env):
    rings, proc = env
    proc.add(4242, b"RANK=3\0MASTER_ADDR=10.0.0.1\0MASTER_PORT=29500\0")
    write_ring(ring_path(rings, 4242),
               [coll(7, gpu_start=111, gpu_stop=5111, flags=layout.Flag.GPU_TIMER,
                     kernel_chs=2)], 4242)
    (rec,) = valid(make_probe(tmp_path, proc).poll())
    assert rec.measurement == "ncclprof_collective"
    assert rec.tags == {"job": "10.0.0.1:29500", "rank": "3", "op": "AllReduce",
                        "kind": "coll", "algo": "RING", "proto": "SIMPLE",
                        "comm": "0xabcdef0123456789"}
    assert rec.time_ns == MONO0 + 1000 + OFFSET
    f = rec.fields
    assert (f["seq"], f["comm_rank"], f["bytes"], f["nchannels"]) == (7, 1, 4096, 2)
    assert f["enqueue_seconds"] == pytest.approx(3e-6)
    # GPU globaltimer values have no offset to the host clock: raw, and said so
    assert (f["kernel_start_ns"], f["kernel_end_ns"], f["kernel_clock"]) == (111, 5111, "gpu")
    assert f["kernel_seconds"] == pytest.approx(5e-6)


def test_host_observed_kernel_times_are_shifted_to_epoch(tmp_path, env):
    rings, proc = env
    proc.add(7, b"RANK=0\0")
    write_ring(ring_path(rings, 7), [coll(1, gpu_start=MONO0 + 10, gpu_stop=MONO0 + 90,
                                          flags=layout.Flag.KERNEL_HOST)], 7)
    (rec,) = valid(make_probe(tmp_path, proc).poll())
    assert rec.fields["kernel_start_ns"] == MONO0 + 10 + OFFSET
    assert rec.fields["kernel_clock"] == "host"


def test_proxy_ops_are_summed_per_peer_channel_and_direction_in_one_window(tmp_path, env):
    rings, proc = env
    proc.add(9, b"RANK=1\0")
    W = layout.Wait
    recs = [proxy(2, 0, True, {W.SEND_NET: 1000, W.SEND_GPU: 10}),
            proxy(2, 0, True, {W.SEND_NET: 3000, W.SEND_PEER: 7}, start=MONO0 + 1500),
            proxy(2, 0, False, {W.RECV_NET: 500, W.RECV_FLUSH: 5}),
            proxy(2, 1, True, {W.SEND_NET: 100})]
    write_ring(ring_path(rings, 9), recs, 9)
    out = valid(make_probe(tmp_path, proc).poll())
    by_key = {(r.tags["direction"], r.tags["channel"]): r for r in out}
    assert set(by_key) == {("send", "0"), ("recv", "0"), ("send", "1")}
    send = by_key[("send", "0")]
    assert send.time_ns == MONO0 + 1500 + OFFSET and send.tags["peer"] == "2"
    assert (send.fields["ops"], send.fields["steps"], send.fields["bytes"]) == (2, 8, 131072)
    assert send.fields["net_wait_seconds"] == pytest.approx(4e-6)
    assert send.fields["gpu_wait_seconds"] == pytest.approx(1e-8)
    assert send.fields["peer_wait_seconds"] == pytest.approx(7e-9)
    assert "flush_seconds" not in send.fields
    recv = by_key[("recv", "0")]
    assert recv.fields["net_wait_seconds"] == pytest.approx(5e-7)
    assert recv.fields["flush_seconds"] == pytest.approx(5e-9)


def test_only_new_records_are_read_at_the_next_poll(tmp_path, env):
    rings, proc = env
    proc.add(11)
    path = ring_path(rings, 11)
    write_ring(path, [coll(1)], 11)
    probe = make_probe(tmp_path, proc)
    assert len(probe.poll()) == 1
    assert probe.poll() == []
    assert path.exists()        # its process lives: the ring stays


def test_a_dead_process_ring_is_read_to_the_end_then_removed(tmp_path, env):
    rings, proc = env
    proc.add(12, b"RANK=5\0")
    path = ring_path(rings, 12)
    write_ring(path, [coll(1)], 12)
    probe = make_probe(tmp_path, proc)
    assert len(probe.poll()) == 1
    # the process writes two more records, then exits
    write_ring(path, [coll(1), coll(2), coll(3)], 12)
    reader = probe._rings[path].reader
    reader.header.read_index = 1        # what the first poll consumed (rewritten above)
    proc.kill(12)
    out = probe.poll()
    assert [r.fields["seq"] for r in out] == [2, 3]
    assert all(r.tags["rank"] == "5" for r in out)      # tags learnt while it lived
    assert not path.exists() and probe.stats()["rings_removed"] == 1
    assert probe.poll() == []


def test_a_ring_of_another_network_namespace_is_left_to_its_node(tmp_path, env):
    rings, proc = env
    proc.add(13, local=False)
    path = ring_path(rings, 13)
    write_ring(path, [coll(1)], 13)
    probe = make_probe(tmp_path, proc)
    assert probe.poll() == [] and probe.poll() == []
    assert path.exists() and probe.stats()["foreign_rings"] == 1


def test_a_foreign_file_is_counted_once_and_skipped(tmp_path, env, caplog):
    rings, proc = env
    ring_path(rings, 14).write_bytes(b"\x01" * 600)
    probe = make_probe(tmp_path, proc)
    assert probe.poll() == [] and probe.poll() == []
    assert probe.stats()["bad_rings"] == 1
    (line,) = [r.getMessage() for r in caplog.records if "ncclprof" in r.getMessage()]
    assert "same fabricscope release" in line and "\n" not in line


def test_plugin_counters_become_probe_counters_and_ring_full_is_lost(tmp_path, env):
    rings, proc = env
    proc.add(15)
    write_ring(ring_path(rings, 15), [coll(1)], 15,
               counters={layout.Counter.RING_FULL: 9, layout.Counter.POOL_EXHAUSTED: 4,
                         layout.Counter.ORPHANS: 2})
    probe = make_probe(tmp_path, proc)
    probe.poll()
    proc.kill(15)
    probe.poll()        # closes the ring: its counters stay in the totals
    stats = probe.stats()
    assert (stats["lost"], stats["pool_exhausted"], stats["orphans"]) == (9, 4, 2)
    assert stats["torn"] == 0 and "ring_full" not in stats
    assert all(isinstance(v, int) for v in stats.values())


def test_a_missing_directory_makes_the_probe_unavailable_with_the_fix(tmp_path):
    ctx = ProbeContext(node="n0", addresses=frozenset(), clock=Clock(0),
                       config=SimpleNamespace(ncclprof_dir=str(tmp_path / "nope")))
    with pytest.raises(ProbeUnavailable, match="FABRICSCOPE_NCCLPROF_DIR"):
        NcclProfProbe(ctx).attach()


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    return nh.build_plugin(tmp_path_factory.mktemp("plugin"))


def test_the_real_plugin_ring_reaches_records_through_the_probe(plugin, tmp_path):
    """The plugin (compiled from profiler/) writes this process's ring as NCCL drives it."""
    rings = tmp_path / "rings"
    rings.mkdir()
    host = nh.NcclHost(plugin, 5, rings)
    ctx_, _ = host.init()
    nh.collective(host, ctx_, seq=3)
    ctx = ProbeContext(node="n0", addresses=frozenset(), clock=Clock(),
                       config=SimpleNamespace(ncclprof_dir=str(rings)))
    probe = NcclProfProbe(ctx)
    probe.attach()
    out = valid(probe.poll())
    (c,) = [r for r in out if r.measurement == "ncclprof_collective"]
    assert (c.tags["op"], c.fields["seq"], c.fields["kernel_clock"]) == ("AllReduce", 3, "gpu")
    assert c.fields["comm_rank"] == 3 and c.tags["comm"] == "0x1234abcd"
    proxies = [r for r in out if r.measurement == "ncclprof_proxy"]
    assert {(r.tags["channel"], r.tags["direction"]) for r in proxies} == \
        {(ch, d) for ch in ("0", "1") for d in ("send", "recv")}
    assert all(r.fields["ops"] == 1 and r.fields["steps"] == 4 for r in proxies)
    host.finalize(ctx_)
    probe.detach()


def test_the_registry_finds_the_nccl_evidence_probes_and_none_needs_bpf():
    from fabricscope.agent.probes import REGISTRY, load_class
    assert REGISTRY["ncclprof"] == "fabricscope.agent.probes.ncclprof.probe:NcclProfProbe"
    for name in ("ncclprof", "nccl_inspector", "nccl_ras"):
        cls = load_class(name)
        assert cls.name == name and not cls.needs_bpf


def test_ring_counters_are_exported_on_metrics(tmp_path, env):
    from prometheus_client import generate_latest

    from fabricscope.agent.metrics import AgentMetrics
    rings, proc = env
    proc.add(16)
    write_ring(ring_path(rings, 16), [coll(1)], 16, counters={layout.Counter.RING_FULL: 3})
    probe = make_probe(tmp_path, proc)
    probe.poll()
    metrics = AgentMetrics()
    metrics.probe_stats.update("ncclprof", probe.stats())
    text = generate_latest(metrics.registry).decode()
    assert 'fabricscope_agent_events_lost_total{probe="ncclprof"} 3.0' in text
    assert 'fabricscope_agent_probe_events_total{event="torn",probe="ncclprof"} 0.0' in text
