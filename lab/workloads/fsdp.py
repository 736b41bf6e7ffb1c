"""FSDP2 (ZeRO-3-like) training: every Linear layer sharded across the ranks.

Each layer is its own `fully_shard` unit (reshard_after_forward, the default), so a
step all-gathers each layer's parameters before its forward, again before its
backward (they were freed after the forward), and reduce-scatters its gradients:
per layer AllGather, AllGather, ReduceScatter, as ZeRO-3 does. ProcessGroupGloo
runs a ReduceScatter as an AllReduce of the whole buffer followed by a local copy
of this rank's chunk, so on gloo's wire (and in the gloo probe) the third
collective is an AllReduce of the layer's full gradient.
"""

from __future__ import annotations

import time


def run(args) -> int:
    import torch
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from fabricscope import markers
    from fabricscope.lab.workloads.common import emit, finish, mlp, start, width_for

    width = width_for(args.model_mb, args.layers)
    model = mlp(width, args.layers)
    rank, world = start(args, f"FSDP2 MLP {args.layers}x{width}, batch {args.batch}, "
                              f"{args.steps} steps")
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(args.batch, width, generator=gen)
    y = torch.randn(args.batch, width, generator=gen)
    for n in range(args.steps):
        markers.step(n)
        began = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()       # AllGather, AllGather, ReduceScatter per layer
        opt.step()
        emit(rank, {"step": n, "seconds": round(time.perf_counter() - began, 6)})
    return finish()
