"""NcclProbe without the kernel: safe before attach, counters only, registry entries."""

from types import SimpleNamespace

from fabricscope.agent.probes import REGISTRY, load_class
from fabricscope.agent.probes.base import Clock, ProbeContext
from fabricscope.agent.probes.nccl.probe import NcclProbe


def ctx(paths=None):
    return ProbeContext("n1", frozenset(), Clock(), SimpleNamespace(nccl_paths=paths or []))


def test_detach_and_poll_are_safe_before_attach():
    probe = NcclProbe(ctx())
    assert probe.poll() == []
    probe.detach()
    probe.detach()
    assert probe.libraries() == []


def test_stats_are_counters_with_lost():
    stats = NcclProbe(ctx()).stats()
    assert all(isinstance(v, int) and v == 0 for v in stats.values())
    assert {"decode_errors", "paths_missing", "libraries_attached", "libraries_detached",
            "comms_evicted"} <= stats.keys()


def test_registered_and_needs_bpf():
    assert REGISTRY["nccl"] == "fabricscope.agent.probes.nccl.probe:NcclProbe"
    assert load_class("nccl") is NcclProbe and NcclProbe.needs_bpf
    assert load_class("nccl_log").name == "nccl_log"
    assert not getattr(load_class("nccl_log"), "needs_bpf", False)


def test_config_field_reaches_the_probe():
    from fabricscope.agent.config import AgentConfig
    from fabricscope import config as fsconfig
    cfg = fsconfig.load(AgentConfig, "agent", env={
        "FABRICSCOPE_AGENT_NCCL_PATHS": "/opt/a/libnccl.so.2, /opt/b/libnccl.so.2"})
    assert cfg.nccl_paths == ["/opt/a/libnccl.so.2", "/opt/b/libnccl.so.2"]
    probe = NcclProbe(ProbeContext("n1", frozenset(), Clock(), cfg))
    assert probe.paths == cfg.nccl_paths
