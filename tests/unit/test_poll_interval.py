"""How often the agent polls: the configured interval, shortened where a probe needs
it, and BPF ring buffers sized to outlast one interval."""

from __future__ import annotations

from types import SimpleNamespace

from fabricscope.agent.config import AgentConfig
from fabricscope.agent.probes.base import effective_poll_interval, ringbuf_pages


def _ctx(interval: float) -> SimpleNamespace:
    return SimpleNamespace(config=SimpleNamespace(poll_interval_s=interval))


def test_ring_buffers_grow_with_the_poll_interval_in_powers_of_two():
    assert ringbuf_pages(_ctx(0.2), 64) == 64
    assert ringbuf_pages(_ctx(0.1), 64) == 64          # never below the base
    assert ringbuf_pages(_ctx(1.0), 64) == 512         # 5 x 64 = 320 -> 512
    assert ringbuf_pages(_ctx(1.0), 16) == 128
    assert ringbuf_pages(_ctx(AgentConfig().poll_interval_s), 16) == 128  # the default, 1.0 s


def test_a_probe_can_only_shorten_the_interval():
    probes = [SimpleNamespace(max_poll_interval_s=None),
              SimpleNamespace(max_poll_interval_s=0.2048)]
    assert effective_poll_interval(1.0, probes) == 0.2048
    assert effective_poll_interval(0.1, probes) == 0.1
    assert effective_poll_interval(1.0, probes[:1]) == 1.0
    assert effective_poll_interval(1.0, []) == 1.0
