"""The gloo probe family: uprobes on PyTorch's gloo collectives (bpf/gloo.bpf.c).

probe (GlooProbe), layout (the options structs' offsets, per torch build), procs
(which processes are training ranks), records (events into gloo_collective),
steps (steps and phases inferred from the collective windows).
"""

PROBES = {"gloo": "fabricscope.agent.probes.gloo.probe:GlooProbe"}
