"""Probe registry: config name -> "module:Class", found by discovery, imported when enabled.

Each probe family is one package under agent/probes/ (nic, tcp, gloo, nccl) whose
`__init__` declares, without importing anything heavy,

    PROBES = {"nic": "fabricscope.agent.probes.nic.probe:NicProbe"}
    INCLUDES = {}          # optional: probe -> probes it includes (one BPF object)

and agent/sources/ (user-space sources: markers, synthetic) declares the same.
Adding a family is one BPF file in bpf/, one package here and one schema module
in fabricscope/measurements/; this registry finds the package by itself.
"""

from __future__ import annotations

import importlib
import pkgutil

#: packages whose subpackages are probe families, and packages that declare PROBES themselves
FAMILY_ROOTS = ("fabricscope.agent.probes",)
SOURCE_PACKAGES = ("fabricscope.agent.sources",)


def _discover() -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    registry: dict[str, str] = {}
    includes: dict[str, tuple[str, ...]] = {}
    modules = list(SOURCE_PACKAGES)
    for root in FAMILY_ROOTS:
        path = importlib.import_module(root).__path__
        modules += [f"{root}.{m.name}" for m in sorted(pkgutil.iter_modules(path),
                                                        key=lambda m: m.name) if m.ispkg]
    for name in modules:
        module = importlib.import_module(name)
        for probe, target in getattr(module, "PROBES", {}).items():
            if probe in registry:
                raise RuntimeError(f"probe {probe!r} declared by {registry[probe]} and {target}")
            registry[probe] = target
        includes.update(getattr(module, "INCLUDES", {}))
    return registry, includes


REGISTRY, INCLUDES = _discover()
#: INCLUDES: probe -> probes it includes (one BPF object does both); not enabled together


def load_class(name: str):
    module, _, cls = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), cls)
