"""What every workload rank does the same way: one CPU thread, the gloo process group,
its step lines on stdout, and the orderly end that lab/training.py recognises."""

from __future__ import annotations

import datetime
import json
import math
import sys


def start(args, what: str):
    """Set torch up for one CPU thread and join the gloo group; returns (rank, world)."""
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(0)                         # same initial weights on every rank
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank}/{world}: {what}", file=sys.stderr, flush=True)
    return rank, world


def emit(rank: int, line: dict) -> None:
    """Rank 0's JSON line on stdout (lab/training.py reads them as the run's records)."""
    if rank == 0:
        print(json.dumps(line), flush=True)


def finish() -> int:
    """markers.done(), then the final barrier and TRAINED (see fabricscope.lab.train_worker)."""
    import torch.distributed as dist

    from fabricscope import markers
    from fabricscope.lab.train_worker import TRAINED
    markers.done()
    dist.barrier()
    print(TRAINED, file=sys.stderr, flush=True)
    dist.destroy_process_group()
    return 0


def width_for(model_mb: float, layers: int) -> int:
    """Width w of `layers` square Linear layers whose float32 parameters, (w^2 + w) x 4
    bytes each, take about model_mb MiB in all (at least 8)."""
    per_layer = model_mb * 2**20 / layers / 4
    return max(8, int(round((-1 + math.sqrt(1 + 4 * per_layer)) / 2)))


def mlp(width: int, layers: int):
    """`layers` Linear(width, width) with a ReLU between each two."""
    from torch import nn
    blocks = []
    for i in range(layers):
        blocks.append(nn.Linear(width, width))
        if i < layers - 1:
            blocks.append(nn.ReLU())
    return nn.Sequential(*blocks)
