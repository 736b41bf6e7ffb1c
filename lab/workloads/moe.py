"""Mixture-of-experts training: expert layers whose tokens travel by all-to-all.

Each rank holds `experts_per_rank` experts (Linear(width, width); model_mb is their
parameter MiB per rank) of every MoE layer, and a replica of the layer's router. A layer routes each of the rank's
tokens to one expert, exchanges the per-rank token counts (all_to_all_single of
int64), dispatches the tokens to the experts' ranks (all_to_all_single with those
splits: gloo's alltoallv), runs the local experts, and returns the results by the
reverse all-to-all; the backward pass repeats both exchanges for the gradients.
The routers are replicated, so their gradients are averaged with one AllReduce per
step, as a data-parallel MoE job does for its dense parameters.

Routing skew: the expert of a token is drawn with probability proportional to
(e + 1) ** -skew over the experts e (Zipf-like; 0 = uniform, 1.2 makes expert 0
take about a third of the tokens of 6). A learned router's load is data dependent
and cannot be set to a wanted skew; the draw stands in for it while the router's
gate value (its softmax at the drawn expert) still scales each output, so the
router learns and its gradients are real. `hot_rank` rotates the experts over the
ranks so that the most drawn experts sit on that rank (0: expert 0 on rank 0).
"""

from __future__ import annotations

import time


def zipf_weights(n_experts: int, skew: float) -> list[float]:
    """Routing probabilities of the experts: (e + 1) ** -skew, normalised."""
    raw = [(e + 1) ** -skew for e in range(n_experts)]
    total = sum(raw)
    return [w / total for w in raw]


def build(width: int, layers: int, experts_per_rank: int, world: int):
    """The MoE layers (torch modules): (routers, local experts) per layer."""
    from torch import nn
    n_experts = experts_per_rank * world
    return nn.ModuleList(
        nn.ModuleDict({"router": nn.Linear(width, n_experts),
                       "experts": nn.ModuleList(nn.Linear(width, width)
                                                for _ in range(experts_per_rank))})
        for _ in range(layers))


def exchange(x, out_splits: list[int], in_splits: list[int]):
    """all_to_all_single of the rows of x, differentiable: the gradient goes back by
    the reverse exchange (torch.distributed.nn's version of this is deprecated)."""
    import torch
    import torch.distributed as dist

    class _Exchange(torch.autograd.Function):
        @staticmethod
        def forward(ctx, rows):
            out = rows.new_empty((sum(out_splits), *rows.shape[1:]))
            dist.all_to_all_single(out, rows.contiguous(), out_splits, in_splits)
            return out

        @staticmethod
        def backward(ctx, grad):
            back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
            dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits)
            return back

    return _Exchange.apply(x)


def moe_layer(layer, x, probs, experts_per_rank: int, gen, hot_rank: int = 0):
    """One MoE layer over this rank's tokens x [tokens, width]; returns x + gated output."""
    import torch
    import torch.distributed as dist
    world = dist.get_world_size()
    gates = torch.softmax(layer["router"](x), dim=1)
    drawn = torch.multinomial(probs, x.shape[0], replacement=True, generator=gen)
    # expert e of the draw lives at e + hot_rank x experts_per_rank: the hot ones there
    choice = (drawn + hot_rank * experts_per_rank) % (experts_per_rank * world)
    order = torch.argsort(choice)
    dest = choice[order] // experts_per_rank
    send = torch.bincount(dest, minlength=world)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)                       # the splits of the exchange
    send_splits, recv_splits = send.tolist(), recv.tolist()
    local_ids = torch.empty(sum(recv_splits), dtype=torch.int64)
    dist.all_to_all_single(local_ids, (choice[order] % experts_per_rank).contiguous(),
                           recv_splits, send_splits)
    arrived = exchange(x[order], recv_splits, send_splits)             # dispatch
    out = torch.zeros_like(arrived)
    # every expert runs, on no rows too: a rank that received no token must still put
    # its combine exchange into the graph, or its backward pass skips the exchange's
    # gradient all-to-all that the other ranks wait in
    for e, expert in enumerate(layer["experts"]):
        rows = (local_ids == e).nonzero().squeeze(1)
        out = out.index_put((rows,), expert(arrived[rows]))
    back = exchange(out, send_splits, recv_splits)                     # combine
    combined = torch.empty_like(back).index_put((order,), back)
    return x + gates.gather(1, choice[:, None]) * combined


def average_gradients(params, world: int) -> None:
    """One AllReduce over the replicated parameters' gradients, then / world."""
    import torch
    import torch.distributed as dist
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad) / world)
        offset += p.numel()


def run(args) -> int:
    import torch
    import torch.nn.functional as F

    from fabricscope import markers
    from fabricscope.lab.workloads.common import emit, finish, start, width_for

    rank, world = start(args, f"MoE {args.layers} layers x {args.experts_per_rank} experts "
                              f"per rank, skew {args.skew:g} hot on rank {args.hot_rank}, batch {args.batch}, "
                              f"{args.steps} steps")
    width = width_for(args.model_mb, args.layers * args.experts_per_rank)
    layers = build(width, args.layers, args.experts_per_rank, world)
    routers = [p for layer in layers for p in layer["router"].parameters()]
    opt = torch.optim.SGD(layers.parameters(), lr=1e-4)
    probs = torch.tensor(zipf_weights(args.experts_per_rank * world, args.skew))
    gen = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(args.batch, width, generator=gen)
    y = torch.randn(args.batch, width, generator=gen)
    for n in range(args.steps):
        markers.step(n)
        began = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        h = x
        for layer in layers:
            h = moe_layer(layer, h, probs, args.experts_per_rank, gen, args.hot_rank)
        F.mse_loss(h, y).backward()              # the combine and dispatch exchanges again
        average_gradients(routers, world)
        opt.step()
        emit(rank, {"step": n, "seconds": round(time.perf_counter() - began, 6)})
    return finish()
