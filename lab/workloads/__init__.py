"""The lab's workloads besides DDP: one module per kind of job, each real PyTorch over
gloo (CPU, real sockets), one rank per lab node, started by lab/train_worker.py.

    fsdp.py      ZeRO-3-like sharding with FSDP2 (fully_shard): AllGather + ReduceScatter
                 per layer
    moe.py       expert layers, tokens dispatched and combined with all_to_all_single
    pipeline.py  one stage per rank, GPipe schedule of micro-batches, send/recv
    serve.py     inference under Poisson arrivals (MoE or pipeline), latency per request

DDP stays in lab/train_worker.py. This package imports torch only inside run().
"""

from __future__ import annotations

import enum


class Kind(str, enum.Enum):
    """What `fabricscope lab train --kind` (and `lab serve`) runs."""

    DDP = "ddp"
    FSDP = "fsdp"
    MOE = "moe"
    PIPELINE = "pipeline"
    SERVE = "serve"


class ServeMode(str, enum.Enum):
    """How a served request crosses the ranks."""

    MOE = "moe"              # every rank's experts: all-to-all per MoE layer
    PIPELINE = "pipeline"    # stage to stage, the last stage answers rank 0


TRAIN_KINDS = (Kind.DDP, Kind.FSDP, Kind.MOE, Kind.PIPELINE)


def run(args) -> int:
    """Run the non-DDP kind named by args.kind (lab/train_worker.py's parsed flags)."""
    kind = Kind(args.kind)
    if kind is Kind.FSDP:
        from fabricscope.lab.workloads import fsdp as module
    elif kind is Kind.MOE:
        from fabricscope.lab.workloads import moe as module
    elif kind is Kind.PIPELINE:
        from fabricscope.lab.workloads import pipeline as module
    elif kind is Kind.SERVE:
        from fabricscope.lab.workloads import serve as module
    else:
        raise ValueError(f"{kind.value} runs in lab/train_worker.py, not here")
    return module.run(args)
