"""Inference under random arrivals: `fabricscope lab serve`.

Requests arrive as a Poisson process of rate `rate` per second: the gaps are
exponential, drawn from one seeded generator, so every rank knows the same
schedule without exchanging it; the ranks start the clock together after a
barrier. A request is served when it has arrived and the one before it is done
(one request at a time, so a burst of arrivals queues), and its latency is from
its arrival to its answer, queueing included, as a client would see it. Rank 0
prints one JSON line per request: {"request": n, "arrival_s", "seconds"}.

Modes (ServeMode):
  moe       every rank holds `batch` tokens of the request and the experts of every
            MoE layer (lab/workloads/moe.py, no gradients): per layer a count
            exchange and two all-to-alls.
  pipeline  rank 0 runs stage 0 and sends the activations on; each stage sends to
            the next and the last answers rank 0: send/recv only.

Markers: each request is a `markers.phase("request")` block on every rank, not a
`markers.step(n)`: a step lasts until the next step begins, which would count the
idle gap before the next arrival as part of the request.
"""

from __future__ import annotations

import random
import time

SEED = 4242


def arrivals(rate: float, count: int, seed: int = SEED) -> list[float]:
    """Seconds from the start at which each of `count` requests arrives (Poisson)."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def _moe_forward(layers, x, probs, experts_per_rank, gen, hot_rank: int = 0):
    import torch

    from fabricscope.lab.workloads.moe import moe_layer
    with torch.no_grad():
        for layer in layers:
            x = moe_layer(layer, x, probs, experts_per_rank, gen, hot_rank)
    return x


def _pipeline_request(stage, size: int, width: int, rank: int, world: int, gen) -> None:
    import torch
    import torch.distributed as dist
    with torch.no_grad():
        if rank == 0:
            dist.send(stage(torch.randn(size, width, generator=gen)), 1)
            dist.recv(torch.empty(size, width), world - 1)        # the answer
            return
        x = torch.empty(size, width)
        dist.recv(x, rank - 1)
        dist.send(stage(x), (rank + 1) % world)


def run(args) -> int:
    import torch
    import torch.distributed as dist

    from fabricscope import markers
    from fabricscope.lab.workloads import ServeMode
    from fabricscope.lab.workloads.common import emit, finish, mlp, start, width_for
    from fabricscope.lab.workloads.moe import build, zipf_weights

    mode = ServeMode(args.serve_mode)
    rank, world = start(args, f"serving ({mode.value}) {args.steps} requests at "
                              f"{args.rate:g}/s, {args.batch} tokens each")
    gen = torch.Generator().manual_seed(1000 + rank)
    if mode is ServeMode.MOE:
        width = width_for(args.model_mb, args.layers * args.experts_per_rank)
        layers = build(width, args.layers, args.experts_per_rank, world)
        probs = torch.tensor(zipf_weights(args.experts_per_rank * world, args.skew))
        x = torch.randn(args.batch, width, generator=gen)
    else:
        width = width_for(args.model_mb / world, args.layers)
        stage = mlp(width, args.layers)
    schedule = arrivals(args.rate, args.steps)
    dist.barrier()
    t0 = time.monotonic()
    for n, due in enumerate(schedule):
        time.sleep(max(0.0, t0 + due - time.monotonic()))    # the next request arrives
        with markers.phase("request"):
            if mode is ServeMode.MOE:
                _moe_forward(layers, x, probs, args.experts_per_rank, gen, args.hot_rank)
            else:
                _pipeline_request(stage, args.batch, width, rank, world, gen)
        emit(rank, {"request": n, "arrival_s": round(due, 6),
                    "seconds": round(time.monotonic() - t0 - due, 6)})
    return finish()
