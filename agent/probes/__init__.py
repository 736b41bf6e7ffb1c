"""Probe registry: config name -> "module:Class", imported only when enabled."""

from __future__ import annotations

import importlib

REGISTRY: dict[str, str] = {
    "tcp_retransmit": "agent.probes.tcp_retransmit:TcpRetransmitProbe",
    "markers": "agent.sources.markers:MarkersSource",
    "nccl": "agent.probes.nccl:NcclProbe",
    "nccl_log": "agent.sources.nccl_log:NcclLogSource",
    "nic": "agent.probes.nic:NicProbe",
    "synthetic": "agent.sources.synthetic:SyntheticSource",   # load generator (tests, benches)
    "gloo": "agent.probes.gloo:GlooProbe",
}


def load_class(name: str):
    module, _, cls = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), cls)
