"""The nccl probe family: uprobes on libnccl (bpf/nccl.bpf.c) and NCCL_DEBUG logs.

probe (NcclProbe), layout and records (the events into nccl_call / nccl_comm),
log_source (NcclLogSource: follows NCCL_DEBUG=INFO output), log_tail (file
following), logparse (log lines into records).
"""

PROBES = {"nccl": "fabricscope.agent.probes.nccl.probe:NcclProbe",
          "nccl_log": "fabricscope.agent.probes.nccl.log_source:NcclLogSource"}
