"""A synthetic job's records as an NCCL job's agents would write them: the same job as
tests/unit/test_diagnosis_evidence.py's SynthJob (its tcp_flow and tcp_node records
unchanged: the tcp probes tag NCCL's socket flows with job and rank as gloo's), its
steps as nccl_step, and with `profiled` each step's collectives as the profiler plugin's
ncclprof_collective records (GPU-clock kernel windows whose union is the step's grad
sync). RAS status polls (nccl_ras_comm, nccl_ras_rank) come from `ras_poll`.

A stand-in for the agents of a GPU cluster, which cannot run here: every record is
validated against fabricscope.schema, as the collector validates them.
"""

from __future__ import annotations

from fabricscope.diagnosis.evidence import SECOND, JobEvidence
from fabricscope.records import Record
from fabricscope.schema import validate
from tests.unit.test_diagnosis_evidence import to_records

COMM = "0x7c1f0e3b9a52d4e1"            # the job's world communicator (a hash, as NCCL logs it)
GPU_CLOCK0 = 4_200_000_000_000         # a GPU globaltimer reading at the job's first second
BUCKETS = 2                            # gradient AllReduce buckets per step
BUCKET_BYTES = 25 << 20


def nccl_records(ev: JobEvidence, profiled: bool = True, with_gloo: bool = False) -> list[Record]:
    """The job's records with nccl_step steps (and ncclprof_collective where
    `profiled`); `with_gloo` keeps gloo's records beside them (a job whose CPU groups
    run gloo too)."""
    out = [r for r in to_records(ev)
           if with_gloo or not r.measurement.startswith("gloo_")]
    t0 = min((t for table in ev.steps.values() for t in table), default=0)
    for rank, steps in ev.steps.items():
        for i, s in enumerate(sorted(steps.values(), key=lambda s: s.time_ns)):
            tags = {"node": s.node, "job": ev.job, "rank": rank}
            out.append(Record("nccl_step", s.time_ns, dict(tags), {
                "step": i, "seconds": s.seconds, "collectives": BUCKETS,
                "bytes": BUCKETS * BUCKET_BYTES, "calls_seconds": 0.01, "pid": 4000 + int(rank)}))
            if profiled:
                out += _collectives(tags, s.time_ns, s.time_ns - t0, s.sync_seconds, int(rank))
    for r in out:
        validate(r)
    return out


def _collectives(tags: dict, t_ns: int, gpu_offset_ns: int, sync_s: float,
                 rank: int) -> list[Record]:
    """The step's bucket AllReduces, enqueued 10 and 20 ms into it; their kernel
    windows (GPU clock) overlap by a fifth of the grad sync and together span it."""
    sync_ns = int(sync_s * SECOND)
    g0 = GPU_CLOCK0 + gpu_offset_ns
    windows = [(g0, g0 + sync_ns * 3 // 5), (g0 + sync_ns * 2 // 5, g0 + sync_ns)]
    out = []
    for i, (start, end) in enumerate(windows):
        out.append(Record("ncclprof_collective", t_ns + (i + 1) * SECOND // 100, {
            **tags, "op": "AllReduce", "kind": "coll", "comm": COMM, "algo": "RING",
            "proto": "SIMPLE"}, {
            "seq": i, "comm_rank": rank, "peer": -1, "count": BUCKET_BYTES // 4,
            "bytes": BUCKET_BYTES, "datatype": "ncclFloat32", "nchannels": 2,
            "enqueue_seconds": 0.0001, "kernel_seconds": (end - start) / SECOND,
            "kernel_start_ns": start, "kernel_end_ns": end, "kernel_clock": "gpu",
            "proxy_ops": 4, "net_sent_bytes": BUCKET_BYTES, "net_recv_bytes": BUCKET_BYTES,
            "incomplete": False, "pid": 4000 + rank}))
    return out


def ras_poll(job: str, time_ns: int, nranks: int, troubled: dict[str, str],
             node: str = "node0") -> list[Record]:
    """One RAS status poll of the job's world communicator: `troubled` maps a rank to
    its state (dead, unresponsive, ...), the others answered."""
    tags = {"node": node, "job": job, "comm": COMM}
    out = [Record("nccl_ras_rank", time_ns, {**tags, "rank": rank, "state": state},
                  {"host": f"198.18.0.{int(rank) + 1}", "pid": 4000 + int(rank),
                   "cuda_dev": 0})
           for rank, state in troubled.items()]
    missing = len(troubled)
    out.append(Record("nccl_ras_comm", time_ns, tags, {
        "nranks": nranks, "ranks_seen": nranks - missing, "missing": missing,
        "unresponsive": sum(s == "unresponsive" for s in troubled.values()),
        "dead": sum(s == "dead" for s in troubled.values()), "errors": 0,
        "healthy": not troubled, "collection_seconds": 5.2 if troubled else 0.01,
        "timeouts": missing}))
    for r in out:
        validate(r)
    return out
