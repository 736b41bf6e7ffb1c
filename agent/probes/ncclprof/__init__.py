"""ncclprof: records of fabricscope's NCCL profiler plugin (profiler/, docs/nccl-profiler.md),
read from its per-process shared-memory rings: layout (the ring's C layout mirrored),
reader (one ring, read incrementally), records (decoded records into Records), probe
(NcclProfProbe: finds the rings, attributes them to jobs, removes a dead process's)."""

PROBES = {"ncclprof": "fabricscope.agent.probes.ncclprof.probe:NcclProfProbe"}
