"""One rank of `fabricscope lab train` (started by lab/training.py, one per node).

    ip netns exec <netns> python -m fabricscope.lab.train_worker --steps K --model-mb M --batch B
        [--data-server ADDR:PORT [--data-bytes N] [--checkpoint-every K]] [--io-log PATH]
        [--kind ddp|fsdp|moe|pipeline|serve [knobs]]

--kind ddp (the default) is the DDP rank described below; the other kinds run in
lab/workloads/ (one module each) with their knobs (--layers, --experts-per-rank,
--skew, --hot-rank, --micro-batches, --slow-stage, --stage-skew, --rate, --serve-mode).

Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GLOO_SOCKET_IFNAME and
FABRICSCOPE_MARKERS_DIR from the environment. Trains a plain MLP of about M MiB
of float32 parameters with DistributedDataParallel over gloo, one CPU thread.
Every step: fabricscope.markers.step(n) first, then forward, backward (the
gradient allreduce), optimizer step; rank 0 prints {"step": n, "seconds": s} on
stdout. After the last step: markers.done(). Exits when its launcher dies.

With --data-server (a fabricscope.lab.dataserver, playing remote storage) the rank keeps two
persistent connections to it, opened after init_process_group, one for the
dataset and one for checkpoints (as a job reading shards from one store and writing
checkpoints to another would; on one connection a checkpoint and the next step's
read can run together without a pause): every step, right
after markers.step(n), it GETs N bytes (data loading); after opt.step() of every
step with (n + 1) % K == 0 it PUTs torch.save(model.state_dict()) (a checkpoint).
--io-log PATH gets one JSON line per transfer, the ground truth for the agent's
phase inference: {"kind": "data_load"|"checkpoint", "step", "rank", "start_ns",
"end_ns", "bytes"}; start_ns/end_ns (time.time_ns()) bracket the network transfer
only (the checkpoint is serialized before start_ns).
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import sys
import threading
import time


#: written to the rank's log once every rank passed the final barrier (lab/training.py)
TRAINED = "fabricscope-lab: all ranks trained; tearing down"


def exit_with_parent() -> None:
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


class _Storage:
    """The rank's traffic to the data server, and its ground-truth log (both optional)."""

    def __init__(self, args, rank: int):
        from fabricscope.lab.dataserver import DataClient
        self.rank, self.data_bytes = rank, args.data_bytes
        self.client = DataClient(args.data_server) if args.data_server else None
        self.writer = DataClient(args.data_server) if args.data_server and \
            args.checkpoint_every else None
        self.log = open(args.io_log, "a") if args.io_log else None

    def load_data(self, step: int) -> None:
        if self.client is not None and self.data_bytes:
            self._timed("data_load", step, lambda: self.client.get(self.data_bytes))

    def checkpoint(self, step: int, payload: bytes) -> None:
        if self.writer is None:
            return
        acked = self._timed("checkpoint", step, lambda: self.writer.put(payload))
        if acked != len(payload):
            raise RuntimeError(f"data server acknowledged {acked} of {len(payload)} "
                               f"checkpoint bytes at step {step}")

    def _timed(self, kind: str, step: int, transfer) -> int:
        start_ns = time.time_ns()
        count = transfer()
        end_ns = time.time_ns()
        if self.log is not None:
            self.log.write(json.dumps({"kind": kind, "step": step, "rank": self.rank,
                                       "start_ns": start_ns, "end_ns": end_ns,
                                       "bytes": count}) + "\n")
            self.log.flush()
        return count

    def close(self) -> None:
        for client in (self.client, self.writer):
            if client is not None:
                client.close()
        if self.log is not None:
            self.log.close()


def add_kind_arguments(parser: argparse.ArgumentParser) -> None:
    """--kind and the knobs of the other kinds (lab/workloads/; DDP ignores them)."""
    from fabricscope.lab.workloads import Kind, ServeMode
    parser.add_argument("--kind", choices=[k.value for k in Kind], default=Kind.DDP.value)
    parser.add_argument("--layers", type=int, default=4,
                        help="layers (fsdp), MoE layers (moe, serve), layers per stage "
                             "(pipeline)")
    parser.add_argument("--experts-per-rank", type=int, default=2)
    parser.add_argument("--skew", type=float, default=0.0,
                        help="Zipf exponent of the expert routing (0: uniform)")
    parser.add_argument("--hot-rank", type=int, default=0,
                        help="the rank holding the most routed experts (moe, serve)")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--slow-stage", type=int, default=-1,
                        help="pipeline stage with stage-skew x the layers (-1: none)")
    parser.add_argument("--stage-skew", type=float, default=1.0)
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second (serve)")
    parser.add_argument("--serve-mode", choices=[m.value for m in ServeMode],
                        default=ServeMode.MOE.value)


def kind_problem(args, world: int) -> str | None:
    """Why the flags of a non-DDP kind cannot run on `world` ranks (one line), or None."""
    if args.data_server:
        return f"--data-server runs with --kind ddp only, not {args.kind}"
    if args.layers < 1 or args.experts_per_rank < 1 or args.micro_batches < 1:
        return "--layers, --experts-per-rank and --micro-batches must be 1 or more"
    if not (args.skew >= 0 and args.stage_skew > 0 and args.rate > 0):
        return "--skew must be 0 or more, --stage-skew and --rate more than 0"
    pipelined = args.kind == "pipeline" or (args.kind == "serve"
                                            and args.serve_mode == "pipeline")
    if args.kind == "pipeline" and args.micro_batches > args.batch:
        return f"--micro-batches {args.micro_batches} is more than --batch {args.batch}"
    if pipelined and world < 2:
        return "a pipeline needs 2 or more ranks (one stage per rank)"
    if not 0 <= args.hot_rank < world:
        return f"--hot-rank {args.hot_rank} is not a rank of {world} (give 0 to {world - 1})"
    if not -1 <= args.slow_stage < world:
        return f"--slow-stage {args.slow_stage} is not a stage of {world} (give -1 to {world - 1})"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fabricscope.lab.train_worker")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--model-mb", type=float, default=8.0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--pg-timeout-s", type=float, default=300.0)
    parser.add_argument("--data-server", help="ADDR:PORT of a lab.dataserver")
    parser.add_argument("--data-bytes", type=int, default=0, help="bytes to GET every step")
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="PUT a checkpoint after every K-th step (0: never)")
    parser.add_argument("--io-log", help="append one JSON line per transfer here")
    add_kind_arguments(parser)
    args = parser.parse_args(argv)
    if (args.data_bytes or args.checkpoint_every) and not args.data_server:
        parser.error("--data-bytes and --checkpoint-every need --data-server")
    if args.data_bytes < 0 or args.checkpoint_every < 0:
        parser.error("--data-bytes and --checkpoint-every must be 0 or more")
    if args.kind != "ddp":
        problem = kind_problem(args, int(os.environ.get("WORLD_SIZE") or 1))
        if problem:
            parser.error(problem)
        exit_with_parent()
        from fabricscope.lab.workloads import run
        return run(args)
    exit_with_parent()

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from fabricscope import markers
    from fabricscope.lab.training import mlp_shape, param_bytes

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

    storage = _Storage(args, rank)
    try:
        for n in range(args.steps):
            markers.step(n)
            start = time.perf_counter()
            storage.load_data(n)
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(ddp(x), y)
            loss.backward()                      # DDP allreduces the gradients here
            opt.step()
            if args.checkpoint_every and (n + 1) % args.checkpoint_every == 0:
                buf = io.BytesIO()
                torch.save(model.state_dict(), buf)
                storage.checkpoint(n, buf.getvalue())
            seconds = time.perf_counter() - start
            if rank == 0:
                print(json.dumps({"step": n, "seconds": round(seconds, 6)}), flush=True)
    finally:
        storage.close()
    markers.done()
    dist.barrier()
    # every rank has trained: what follows is teardown (fabricscope.lab.training.TRAINED)
    print(TRAINED, file=sys.stderr, flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
