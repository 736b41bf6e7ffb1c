"""Pipeline-parallel training: one stage per rank, GPipe schedule, send and receive.

Stage r holds `layers` Linear(width, width) layers (the slow stage, when given,
round(layers x stage_skew): stages made unequal the way an uneven split of a
model's layers makes them). A step cuts the batch into micro-batches; every
stage runs the forward of each in turn (receiving its input from stage r - 1,
sending its output to r + 1), then the backward in reverse order (receiving the
output's gradient from r + 1, sending the input's gradient to r - 1); the last
stage computes the loss. The optimizer steps once per step. Every transfer is a
point-to-point gloo send/recv: no collective at all.
"""

from __future__ import annotations

import time


def stage_layers(rank: int, layers: int, slow_stage: int, stage_skew: float) -> int:
    """Layers of stage `rank` (slow_stage < 0: every stage equal)."""
    return max(1, round(layers * stage_skew)) if rank == slow_stage else layers


def micro_batches(batch: int, count: int) -> list[int]:
    """Sizes of `count` micro-batches that add up to `batch` (the first ones one larger)."""
    base, extra = divmod(batch, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


def step(stage, sizes, width: int, rank: int, world: int, inputs, targets) -> None:
    """One GPipe step of this stage: all forwards, then all backwards in reverse."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    saved = []
    for m, size in enumerate(sizes):
        if rank == 0:
            x = inputs[m]
        else:
            x = torch.empty(size, width)
            dist.recv(x, rank - 1)
            x.requires_grad_()
        out = stage(x)
        if rank < world - 1:
            dist.send(out.detach(), rank + 1)
        saved.append((x, out))
    for m in reversed(range(len(sizes))):
        x, out = saved[m]
        if rank == world - 1:
            F.mse_loss(out, targets[m]).backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, rank + 1)
            out.backward(grad)
        if rank > 0:
            dist.send(x.grad, rank - 1)


def run(args) -> int:
    import torch

    from fabricscope import markers
    from fabricscope.lab.workloads.common import emit, finish, mlp, start, width_for

    rank, world = start(args, f"pipeline stage of {args.micro_batches} micro-batches, "
                              f"slow stage {args.slow_stage} x{args.stage_skew:g}, "
                              f"batch {args.batch}, {args.steps} steps")
    width = width_for(args.model_mb / world, args.layers)
    stage = mlp(width, stage_layers(rank, args.layers, args.slow_stage, args.stage_skew))
    opt = torch.optim.SGD(stage.parameters(), lr=1e-4)
    sizes = micro_batches(args.batch, args.micro_batches)
    gen = torch.Generator().manual_seed(1000)
    inputs = [torch.randn(s, width, generator=gen) for s in sizes]
    targets = [torch.randn(s, width, generator=gen) for s in sizes]
    for n in range(args.steps):
        markers.step(n)
        began = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        step(stage, sizes, width, rank, world, inputs, targets)
        opt.step()
        emit(rank, {"step": n, "seconds": round(time.perf_counter() - began, 6)})
    return finish()
