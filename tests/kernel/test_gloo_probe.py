"""The gloo probe's attach, detach and configuration errors on the real kernel (root)."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from fabricscope.agent.config import AgentConfig
from fabricscope.agent.probes.base import Clock, ProbeContext, ProbeUnavailable
from fabricscope.errors import UserError


@pytest.fixture(scope="module", autouse=True)
def kernel_ready():
    from fabricscope.agent import kernel
    kernel.prepare()


def context(**cfg) -> ProbeContext:
    config = replace(AgentConfig(), probes=["gloo"], **cfg)
    return ProbeContext("test-node", frozenset(), Clock(), config)


def make(**cfg):
    from fabricscope.agent.probes.gloo.probe import GlooProbe
    return GlooProbe(context(**cfg))


def test_attach_probes_the_own_torch_and_detaches_twice():
    from fabricscope.agent.probes.gloo.probe import own_torch_library
    from fabricscope.agent.probes.gloo.layout import OPS, STATS
    probe = make()
    try:
        probe.attach()
        stats = probe.stats()
        assert own_torch_library() is not None
        assert stats["libraries_attached"] >= 1
        assert set(STATS) <= set(stats)
        (symbols,) = [syms for path, syms in _attached(probe) if path == own_torch_library()]
        assert {op.symbol for op in OPS} <= set(symbols)
        records = probe.poll()      # other tests' training may run meanwhile
        assert all(r.measurement.startswith(("gloo_", "traffic_")) for r in records)
    finally:
        probe.detach()
        probe.detach()
    assert probe.poll() == []


def _attached(probe):
    return [(path, syms) for path, _pids, syms in probe.libraries()]


def test_missing_configured_library_is_unavailable(tmp_path):
    probe = make(gloo_paths=[str(tmp_path / "libtorch_cpu.so")])
    try:
        with pytest.raises(ProbeUnavailable, match="cannot open"):
            probe.attach()
    finally:
        probe.detach()


def test_configured_file_without_gloo_is_unavailable(tmp_path):
    lib = tmp_path / "libtorch_cpu.so"
    shutil.copy(shutil.which("true"), lib)
    probe = make(gloo_paths=[str(lib)])
    try:
        with pytest.raises(ProbeUnavailable, match="exports none"):
            probe.attach()
    finally:
        probe.detach()


def test_bad_model_settings_are_a_user_error():
    with pytest.raises(UserError, match="must be positive"):
        make(gloo_model_interval_s=0)
