"""agent/kernel.py: the capabilities the enabled probes need, checked before anything
is compiled, and named in one line when the container dropped one."""

from __future__ import annotations

import pytest

from fabricscope.agent.kernel import (Capability, check_capabilities, effective_capabilities,
                                      missing_capabilities)
from fabricscope.agent.probes import REGISTRY, load_class
from fabricscope.errors import UserError

NEEDS = {name: load_class(name).capabilities for name in REGISTRY}
DAEMONSET = (Capability.BPF, Capability.PERFMON, Capability.NET_ADMIN, Capability.SYS_RESOURCE,
             Capability.SYS_PTRACE)


def mask(*caps: Capability) -> int:
    return sum(1 << c for c in caps)


def test_the_daemonsets_capabilities_cover_every_probe_on_any_kernel():
    assert missing_capabilities(NEEDS, mask(*DAEMONSET), "6.18.0") == {}
    assert missing_capabilities(NEEDS, mask(*DAEMONSET), "5.10.0-28-amd64") == {}


def test_every_bpf_probe_needs_bpf_and_perfmon_and_user_space_sources_need_nothing():
    for name in REGISTRY:
        cls = load_class(name)
        if getattr(cls, "needs_bpf", False):
            assert {Capability.BPF, Capability.PERFMON} <= set(cls.capabilities), name
        else:
            assert cls.capabilities == (), name


def test_sys_resource_is_needed_only_where_bpf_memory_counts_against_memlock():
    without = mask(Capability.BPF, Capability.PERFMON, Capability.NET_ADMIN)
    needs = {"nic": NEEDS["nic"]}
    assert missing_capabilities(needs, without, "6.1.0") == {}
    assert missing_capabilities(needs, without, "5.10.0") == {Capability.SYS_RESOURCE: ["nic"]}


def test_sys_admin_stands_in_for_bpf_and_perfmon_as_before_linux_5_8():
    assert missing_capabilities({"gloo": NEEDS["gloo"]},
                                mask(Capability.SYS_ADMIN, Capability.SYS_PTRACE), "6.1") == {}


@pytest.mark.parametrize("dropped", DAEMONSET[:3] + DAEMONSET[4:])
def test_one_dropped_capability_is_one_line_naming_it_and_the_probes_that_need_it(dropped):
    have = mask(*(c for c in DAEMONSET if c is not dropped))
    with pytest.raises(UserError) as exc:
        check_capabilities(NEEDS, have, "6.18.0")
    text = str(exc.value)
    assert "\n" not in text
    assert f"CAP_{dropped.name}" in text and text.count("CAP_") == 1
    assert f"add {dropped.name} to the agent container's securityContext" in exc.value.fix
    assert all(name in text for name, caps in NEEDS.items() if dropped in caps)


def test_a_process_reads_its_own_effective_set(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001c000001000\n")
    assert effective_capabilities(status) == mask(Capability.NET_ADMIN, Capability.PERFMON,
                                                  Capability.BPF, 40)
