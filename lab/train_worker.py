"""One DDP rank of `fabricscope lab train` (started by lab/training.py, one per node).

    ip netns exec <netns> python -m lab.train_worker --steps K --model-mb M --batch B

Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GLOO_SOCKET_IFNAME and
FABRICSCOPE_MARKERS_DIR from the environment. Trains a plain MLP of about M MiB
of float32 parameters with DistributedDataParallel over gloo, one CPU thread.
Every step: fabricscope.markers.step(n) first, then forward, backward (the
gradient allreduce), optimizer step; rank 0 prints {"step": n, "seconds": s} on
stdout. After the last step: markers.done(). Exits when its launcher dies.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import threading
import time


def _exit_with_parent() -> None:
    """Leave when the launcher (FABRICSCOPE_LAB_PARENT) is gone, e.g. SIGKILLed."""
    parent = os.environ.get("FABRICSCOPE_LAB_PARENT")
    if not parent or not parent.isdigit():
        return
    parent_pid = int(parent)

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(143)
            time.sleep(0.5)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.train_worker")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--model-mb", type=float, default=8.0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--pg-timeout-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    _exit_with_parent()

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from fabricscope import markers
    from lab.training import mlp_shape, param_bytes

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(0)                         # same initial weights on every rank
    width, layers = mlp_shape(args.model_mb)
    blocks: list[nn.Module] = []
    for i in range(layers):
        blocks.append(nn.Linear(width, width))
        if i < layers - 1:
            blocks.append(nn.ReLU())
    model = nn.Sequential(*blocks)

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    mib = param_bytes(width, layers) / 2**20
    print(f"rank {rank}/{world}: MLP {layers}x{width}, {mib:.2f} MiB "
          f"of parameters, batch {args.batch}, {args.steps} steps, "
          f"interface {os.environ.get('GLOO_SOCKET_IFNAME', '?')}", file=sys.stderr, flush=True)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(args.batch, width, generator=gen)
    y = torch.randn(args.batch, width, generator=gen)

    for n in range(args.steps):
        markers.step(n)
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(ddp(x), y)
        loss.backward()                          # DDP allreduces the gradients here
        opt.step()
        seconds = time.perf_counter() - start
        if rank == 0:
            print(json.dumps({"step": n, "seconds": round(seconds, 6)}), flush=True)
    markers.done()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
