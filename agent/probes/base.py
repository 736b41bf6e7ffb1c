"""The probe contract: every probe family and user-space source implements Probe.

A probe family is sibling files: `bpf/<family>.bpf.c` (the BPF program, real C,
options as `-D` cflags), `agent/probes/<family>.py` (this interface: load,
attach, drain maps/buffers, decode into Records) and
`fabricscope/measurements/<family>.py` (what it exports). Nothing downstream of
`poll()` knows which probe made a record.
"""

from __future__ import annotations

import abc
import math
import time
from dataclasses import dataclass, field

from fabricscope.agent.kernel import Capability
from fabricscope.records import Record


class ProbeUnavailable(Exception):
    """This probe cannot run on this kernel/host (missing tracepoint, feature, library).

    The agent logs one line with the reason, counts it in
    fabricscope_agent_probe_attached{probe=...}=0, and runs on without it."""


@dataclass(frozen=True)
class Clock:
    """Maps the kernel's CLOCK_MONOTONIC (bpf_ktime_get_ns) to UNIX epoch ns."""

    offset_ns: int = field(default_factory=lambda: time.time_ns() - time.monotonic_ns())

    def to_wall(self, monotonic_ns: int) -> int:
        return monotonic_ns + self.offset_ns


@dataclass
class ProbeContext:
    node: str                      # node name (tag `node` is added by the pipeline, not probes)
    addresses: frozenset[str]      # IP addresses owned by this node: attribution filter
    clock: Clock
    config: object                 # fabricscope.agent.config.AgentConfig
    cflags: list[str] = field(default_factory=list)   # extra BCC cflags (kernel headers etc.)
    maps_cache: object = None      # fabricscope.agent.procmaps.MapsCache shared by the uprobe probes
    environments: object = None    # fabricscope.agent.procmaps.Environments shared by every /proc reader
    pods: object = None            # fabricscope.agent.kube.resolver.PodResolver; None outside Kubernetes
    nic_bins: object = None        # fabricscope.agent.probes.nic.history.BinHistory, set by the nic probe


#: the poll interval the BPF ring buffers' default sizes were chosen for
RINGBUF_BASE_INTERVAL_S = 0.2


def ringbuf_pages(ctx: "ProbeContext", base_pages: int) -> int:
    """Pages for a BPF ring buffer that holds `base_pages` worth of events per 0.2 s
    of poll interval: the buffer must outlast one interval (a power of two)."""
    interval = float(getattr(ctx.config, "poll_interval_s", RINGBUF_BASE_INTERVAL_S) or 0)
    need = base_pages * max(1.0, interval / RINGBUF_BASE_INTERVAL_S)
    return 1 << max(0, math.ceil(math.log2(need)))


def effective_poll_interval(configured: float, probes) -> float:
    """The configured interval, or less where an attached probe needs draining sooner
    (Probe.max_poll_interval_s, e.g. the NIC rings on a host with many CPUs)."""
    limits = [p.max_poll_interval_s for p in probes if p.max_poll_interval_s]
    return min([configured, *limits])


class Probe(abc.ABC):
    #: name used in config `probes:` and in metrics labels
    name: str = ""
    #: what it needs beyond root's uid (fabricscope.agent.kernel.check_capabilities)
    capabilities: tuple[Capability, ...] = ()
    #: set by attach() when what the probe holds in the kernel must be drained more often
    #: than the configured poll interval (None: any interval will do)
    max_poll_interval_s: float | None = None

    def __init__(self, ctx: ProbeContext):
        self.ctx = ctx

    @abc.abstractmethod
    def attach(self) -> None:
        """Load and attach. Raise ProbeUnavailable when this host cannot support it."""

    @abc.abstractmethod
    def poll(self) -> list[Record]:
        """Drain what happened since the last call into Records (without the `node` tag)."""

    def detach(self) -> None:
        """Release kernel resources. Must be safe to call twice and after a failed attach.

        Records still held in the kernel at detach time (an open window) are drained
        here and handed out by one more poll(), which the pipeline makes after detach."""

    def stats(self) -> dict[str, int]:
        """Self-observation counters (events lost in the kernel, decode errors, ...)."""
        return {}
