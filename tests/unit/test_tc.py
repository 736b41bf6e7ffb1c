"""agent/tc.py without root: the choice between tcx and clsact, and the attribute
layouts the bpf() syscall reads (uapi offsets)."""

from __future__ import annotations

import ctypes
import errno
from types import SimpleNamespace

import pytest

from fabricscope.agent import tc
from fabricscope.agent.probes.base import ProbeUnavailable

IFACES = [SimpleNamespace(index=2, name="eth0"), SimpleNamespace(index=3, name="eth1")]
FNS = {"ingress": SimpleNamespace(fd=10, name="in"), "egress": SimpleNamespace(fd=11, name="out")}


@pytest.fixture
def kernel(monkeypatch):
    """A fake kernel: tcx links succeed unless `refuse` holds an errno; clsact records."""
    state = SimpleNamespace(refuse=None, links=[], closed=[], clsact=[], next_fd=100)

    def link(prog_fd, ifindex, direction):
        if state.refuse is not None:
            raise OSError(state.refuse, "refused")
        state.next_fd += 1
        state.links.append((prog_fd, ifindex, direction, state.next_fd))
        return state.next_fd

    def attach_clsact(self, ifaces):
        state.clsact += [(i.index, d) for i in ifaces for d in self.fns]
        self.hooks += [tc.Hook(i.index, i.name, d) for i in ifaces for d in self.fns]

    monkeypatch.setattr(tc, "tcx_link", link)
    monkeypatch.setattr(tc.TcPrograms, "_attach_clsact", attach_clsact)
    monkeypatch.setattr(tc.os, "close", state.closed.append)
    return state


def test_auto_takes_tcx_links_one_per_interface_and_direction(kernel):
    progs = tc.TcPrograms(FNS)
    progs.attach(IFACES)
    assert progs.mechanism == "tcx" and kernel.clsact == []
    assert [(fd, i, d) for fd, i, d, _ in kernel.links] == \
        [(10, 2, "ingress"), (11, 2, "egress"), (10, 3, "ingress"), (11, 3, "egress")]
    progs.detach()
    assert sorted(kernel.closed) == [101, 102, 103, 104] and progs.hooks == []


@pytest.mark.parametrize("err", [errno.EINVAL, errno.EOPNOTSUPP, 524])
def test_auto_falls_back_to_clsact_on_a_kernel_without_tcx(kernel, err):
    kernel.refuse = err
    progs = tc.TcPrograms(FNS)
    progs.attach(IFACES)
    assert progs.mechanism == "clsact" and len(kernel.clsact) == 4


def test_a_half_done_tcx_attach_is_undone_before_the_fallback(kernel, monkeypatch):
    real = tc.tcx_link

    def second_fails(prog_fd, ifindex, direction):
        if kernel.links:
            raise OSError(errno.EINVAL, "refused")
        return real(prog_fd, ifindex, direction)
    monkeypatch.setattr(tc, "tcx_link", second_fails)
    progs = tc.TcPrograms(FNS)
    progs.attach(IFACES)
    assert kernel.closed == [101] and progs.mechanism == "clsact"
    assert all(h.link_fd < 0 for h in progs.hooks)


def test_tcx_mode_does_not_fall_back_and_other_errors_never_do(kernel):
    kernel.refuse = errno.EINVAL
    with pytest.raises(ProbeUnavailable, match="cannot attach tcx on eth0 ingress"):
        tc.TcPrograms(FNS, "tcx").attach(IFACES)
    kernel.refuse = errno.EPERM
    with pytest.raises(ProbeUnavailable, match="eth0 ingress: refused"):
        tc.TcPrograms(FNS).attach(IFACES)
    assert kernel.clsact == []


def test_clsact_mode_never_tries_tcx(kernel):
    progs = tc.TcPrograms({"egress": FNS["egress"]}, "clsact")
    progs.attach(IFACES[:1])
    assert kernel.links == [] and kernel.clsact == [(2, "egress")]


def test_modes_and_config():
    with pytest.raises(ValueError, match="auto, tcx, clsact"):
        tc.TcPrograms(FNS, "xdp")
    assert tc.mode_of(None) == "auto"
    assert tc.mode_of(SimpleNamespace(tc_attach="clsact")) == "clsact"


def test_syscall_attributes_match_the_uapi_offsets():
    # union bpf_attr: link_create.tcx.expected_revision at 24; query.prog_cnt at 24,
    # query.revision at 56 (include/uapi/linux/bpf.h)
    assert tc._LinkCreateAttr.expected_revision.offset == 24
    assert tc._QueryAttr.prog_ids.offset == 16 and tc._QueryAttr.prog_cnt.offset == 24
    assert tc._QueryAttr.revision.offset == 56 and ctypes.sizeof(tc._QueryAttr) == 64
