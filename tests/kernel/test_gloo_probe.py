"""The gloo probe's attach, detach and configuration errors on the real kernel (root),
and its watcher naming a rank that is gone before the first drain."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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


# One rank alone calls an AllReduce, says so, and exits when told.
SHORT_RANK = """import sys, torch, torch.distributed as dist
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
dist.all_reduce(torch.ones(4))
print("called", flush=True)
sys.stdin.readline()
"""


def test_a_rank_gone_before_the_first_drain_is_named_from_its_witness(tmp_path):
    """The watcher reads a rank at its first call; the rank exits and is reaped before
    the probe drains its event, which still names its job and rank."""
    from fabricscope.lab.stack import await_condition
    probe = make()
    try:
        probe.attach()
        probe.poll()
        before = probe.stats()
        env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "FABRICSCOPE_JOB": "short-run"}
        rank = subprocess.Popen([sys.executable, "-c", SHORT_RANK, str(tmp_path / "store")],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env=env)
        try:
            assert rank.stdout.readline().strip() == "called"
            await_condition(lambda: probe.stats()["processes_witnessed"]
                            > before["processes_witnessed"], 30, "the rank witnessed")
        finally:
            rank.communicate("\n", timeout=60)             # exits; reaped here
        assert not os.path.exists(f"/proc/{rank.pid}")
        records = probe.poll()
        after = probe.stats()
        assert after["unattributed"] == before["unattributed"], after
        mine = [r for r in records if r.tags.get("job") == "short-run"]
        assert mine and {r.tags["rank"] for r in mine} == {"0"}, records
    finally:
        probe.detach()
