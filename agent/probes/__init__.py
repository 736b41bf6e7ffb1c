"""Probe registry: config name -> "module:Class", imported only when enabled."""

from __future__ import annotations

import importlib

REGISTRY: dict[str, str] = {
    "tcp_retransmit": "agent.probes.tcp_retransmit:TcpRetransmitProbe",
    "markers": "agent.sources.markers:MarkersSource",
}


def load_class(name: str):
    module, _, cls = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), cls)
