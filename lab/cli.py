"""`fabricscope lab ...`: build labs, inject faults, run DDP, run commands on nodes.

    fabricscope lab up    --name NAME --nodes N [--tors K] [--link-rate RATE]
                          [--no-link-shaping] [--wire-frames] [--json]
    fabricscope lab down  --name NAME | --all
    fabricscope lab list  [--json]
    fabricscope lab fault --name NAME (--node I | --uplink TOR) loss|shape ...,
                          --node I cpu PCT, storage ..., clear     (lab/cli_faults.py)
    fabricscope lab train --name NAME --steps K [--model-mb M] [--batch B] [--json-summary]
        [--data-mb D] [--checkpoint-every N]     (reads/checkpoints via a data server)
        [--kind ddp|fsdp|moe|pipeline] [--layers L] [--experts-per-rank E] [--skew S]
        [--hot-rank R]
        [--micro-batches M] [--slow-stage K --stage-skew X]
    fabricscope lab serve --name NAME --requests N [--rate R] [--mode moe|pipeline] ...
    fabricscope lab exec  --name NAME --node I -- CMD...

torch is imported only by the ranks that `lab train` starts, never here.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import sys
import time

from fabricscope.errors import UserError
from fabricscope.lab.cli_faults import add_fault_parsers, cmd_clear, cmd_fault_loss, cmd_fault_shape
from fabricscope.lab.cli_faults import describe_faults
from fabricscope.lab.workloads import TRAIN_KINDS, ServeMode

__all__ = ["add_arguments", "cmd_clear", "cmd_fault_loss", "cmd_fault_shape", "register"]

log = logging.getLogger("lab")


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "lab", help="network lab: N namespaces on a bridge, faults, DDP training",
        description="A small training cluster on one kernel: network namespaces on a Linux "
                    "bridge, nftables loss and TBF faults, PyTorch DDP over gloo. Needs root.")
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="lab_command", metavar="LAB_COMMAND", required=True)

    p = sub.add_parser("up", help="create a lab (clears a stale lab of the same name first)")
    p.add_argument("--name", required=True, help="lab name (1-32 of [A-Za-z0-9_-])")
    p.add_argument("--nodes", type=int, required=True, help="number of nodes")
    p.add_argument("--tors", type=int, default=1,
                   help="top-of-rack switches (default 1: one bridge); K > 1: K leaf bridges "
                        "under a spine, nodes in contiguous blocks (the first N mod K ToRs take "
                        "one node more)")
    p.add_argument("--link-rate", metavar="RATE",
                   help="link speed, e.g. 1gbit: recorded, and applied as TBF on both ends of "
                        "every link (default: unshaped veths, link rate unknown)")
    p.add_argument("--no-link-shaping", dest="shape_links", action="store_false",
                   help="record --link-rate only, do not shape")
    p.add_argument("--wire-frames", action="store_true",
                   help="one TCP segment per skb on every veth, so loss and shaping act per wire "
                        "frame (default: GSO skbs of up to 64 KB; ~10x less CPU)")
    p.add_argument("--json", action="store_true", help="print the lab as JSON")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("down", help="remove a lab (idempotent)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--name", help="lab name")
    g.add_argument("--all", action="store_true", help="remove every fabricscope lab")
    p.set_defaults(func=cmd_down)

    p = sub.add_parser("list", help="list labs")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=cmd_list)

    add_fault_parsers(sub)

    p = sub.add_parser("train", help="run PyTorch DDP (gloo), one rank per node")
    p.add_argument("--name", required=True, help="lab name")
    p.add_argument("--steps", type=int, required=True, help="training steps")
    p.add_argument("--model-mb", type=float, default=8.0, help="MLP parameter MiB (default 8)")
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step (default 32)")
    p.add_argument("--master-port", type=int, help="rank 0's rendezvous port (default: random)")
    p.add_argument("--timeout-s", type=float, help="end every rank after this long")
    p.add_argument("--json-summary", action="store_true",
                   help="after the step lines, print one JSON summary line")
    p.add_argument("--data-mb", type=float, default=0.0,
                   help="MiB each rank reads per step from a data server the command starts on "
                        "the lab's gateway for the run (default 0: none)")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="write a checkpoint (the model's state_dict) to that data server after "
                        "every N-th step (default 0: never)")
    add_kind_flags(p, serve=False)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("serve", help="serve inference requests (Poisson arrivals), one rank "
                                     "per node; one JSON line of latency per request")
    p.add_argument("--name", required=True, help="lab name")
    p.add_argument("--requests", type=int, required=True, help="requests to serve")
    p.add_argument("--rate", type=float, default=20.0,
                   help="mean arrivals per second (Poisson; default 20)")
    p.add_argument("--mode", choices=[m.value for m in ServeMode], default=ServeMode.MOE.value,
                   help="moe: all-to-all per MoE layer; pipeline: stage to stage (default moe)")
    p.add_argument("--model-mb", type=float, default=2.0,
                   help="parameter MiB (moe: experts per rank; pipeline: all stages)")
    p.add_argument("--batch", type=int, default=32, help="tokens per request per rank")
    p.add_argument("--master-port", type=int, help="rank 0's rendezvous port (default: random)")
    p.add_argument("--timeout-s", type=float, help="end every rank after this long")
    add_kind_flags(p, serve=True)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("exec", help="run a command in a node's network namespace")
    p.add_argument("--name", required=True, help="lab name")
    p.add_argument("--node", type=int, required=True, help="node index (0-based)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD...",
                   help="command and arguments")
    p.set_defaults(func=cmd_exec)


def add_kind_flags(p: argparse.ArgumentParser, serve: bool) -> None:
    """The knobs of lab/workloads/ (train: with --kind; serve: those of its modes)."""
    if not serve:
        p.add_argument("--kind", choices=[k.value for k in TRAIN_KINDS], default="ddp",
                       help="ddp (default), fsdp (FSDP2 sharding), moe (all-to-all experts) "
                            "or pipeline (one stage per rank, send/recv)")
        p.add_argument("--micro-batches", type=int, help="pipeline: micro-batches per step "
                                                         "(default 4)")
        p.add_argument("--slow-stage", type=int, help="pipeline: the stage with more layers")
        p.add_argument("--stage-skew", type=float,
                       help="pipeline: the slow stage's layers x this (e.g. 2.0)")
    p.add_argument("--layers", type=int, help="fsdp: layers; moe: MoE layers; pipeline: "
                                              "layers per stage (default 4)")
    p.add_argument("--experts-per-rank", type=int, help="moe: experts on each rank (default 2)")
    p.add_argument("--skew", type=float, help="moe: Zipf exponent of the routing, 0 = uniform "
                                              "(default 0)")
    p.add_argument("--hot-rank", type=int, help="moe: the rank holding the most routed "
                                                "experts (default 0)")


_KNOBS = ("layers", "experts_per_rank", "skew", "hot_rank", "micro_batches", "slow_stage",
          "stage_skew")


def kind_knobs(args) -> dict:
    """The knobs given on the command line (None: the worker's default)."""
    return {k: getattr(args, k) for k in _KNOBS if getattr(args, k, None) is not None}


# -- commands ---------------------------------------------------------------------------

def cmd_up(args) -> int:
    from fabricscope.lab.topology import up
    from fabricscope.lab.units import format_rate
    start = time.monotonic()
    lab = up(args.name, args.nodes, link_rate=args.link_rate, shape_links=args.shape_links,
             wire_frames=args.wire_frames, tors=args.tors)
    took = time.monotonic() - start
    if args.json:
        print(json.dumps(lab.to_dict()))
        return 0
    shaped = " (shaped)" if lab.link_shaped else (" (recorded only)" if lab.link_rate_bps else "")
    where = f"{len(lab.tors)} ToRs under spine" if lab.spine else "bridge"
    print(f"lab {lab.name}: {len(lab.nodes)} nodes on {where} {lab.bridge}, subnet {lab.subnet}, "
          f"gateway {lab.gateway}, link rate {format_rate(lab.link_rate_bps)}{shaped}"
          f"{', wire frames' if lab.wire_frames else ''}; "
          f"up in {took:.2f} s")
    if lab.spine:
        print(f"  spine {lab.spine}")
        for t in lab.tors:
            print(f"  {t.name}: bridge {t.bridge}, uplink {t.uplink} == {t.spine_port}, "
                  f"nodes {', '.join(str(i) for i in t.nodes)}")
    for n in lab.nodes:
        print(f"  node {n.index} {n.name}: netns {n.netns}, nic {n.ifname} {n.address} {n.mac}, "
              f"switch port {n.port} on {n.tor}, markers {n.markers_dir}")
    print(f"  topology {lab.topology_path}")
    return 0


def cmd_down(args) -> int:
    from fabricscope.lab.topology import down, down_all
    if args.all:
        names = down_all()
        print(f"removed {len(names)} lab(s)" + (": " + ", ".join(names) if names else ""))
    else:
        found = down(args.name)
        print(f"lab {args.name} is down" + ("" if found else " (there was nothing to remove)"))
    return 0


def cmd_list(args) -> int:
    from fabricscope.lab.topology import list_labs
    from fabricscope.lab.units import format_rate
    labs = list_labs()
    if args.json:
        print(json.dumps([lab.to_dict() for lab in labs]))
        return 0
    if not labs:
        print("no labs")
        return 0
    print(f"{'NAME':<20} {'NODES':>5} {'TORS':>4} {'SUBNET':<18} {'BRIDGE':<11} {'LINK':<8} "
          "FAULTS")
    for lab in labs:
        print(f"{lab.name:<20} {len(lab.nodes):>5} {len(lab.tors):>4} {lab.subnet:<18} "
              f"{lab.bridge:<11} {format_rate(lab.link_rate_bps):<8} {describe_faults(lab) or '-'}")
    return 0


_TRAIN_PID = [0]


def _sigterm_to_interrupt(signum, frame):
    if os.getpid() != _TRAIN_PID[0]:     # a forked child inherits the handler: just die
        os._exit(128 + signum)
    raise KeyboardInterrupt


def cmd_train(args) -> int:
    import contextlib

    from fabricscope.lab.dataserver import running_dataserver
    from fabricscope.lab.topology import load
    from fabricscope.lab.training import start_training
    if args.data_mb < 0 or args.checkpoint_every < 0:
        raise UserError("--data-mb and --checkpoint-every must be 0 or more",
                        "e.g. --data-mb 1 --checkpoint-every 10")
    lab = load(args.name)
    _TRAIN_PID[0] = os.getpid()
    previous = signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
    started = time.monotonic()
    io = args.data_mb > 0 or args.checkpoint_every > 0
    knobs = kind_knobs(args)
    kind_kw = dict(kind=args.kind, knobs=knobs) if args.kind != "ddp" or knobs else {}
    try:
        with (running_dataserver(lab, None) if io else contextlib.nullcontext()) as server:
            kw = dict(data_server=server, data_bytes=int(args.data_mb * 2**20),
                      checkpoint_every=args.checkpoint_every) if io else {}
            with start_training(lab, args.steps, model_mb=args.model_mb, batch=args.batch,
                                master_port=args.master_port, timeout_s=args.timeout_s,
                                **kw, **kind_kw) as run:
                for item in run.steps():
                    print(json.dumps(item), flush=True)
                code = run.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code != 0:
        print(f"fabricscope: error: training failed: {run.error}", file=sys.stderr)
        return 1
    if len(run.records) != args.steps:
        print(f"fabricscope: error: training failed: rank 0 reported {len(run.records)} of "
              f"{args.steps} steps (log: {run.log_paths[0]})", file=sys.stderr)
        return 1
    if args.json_summary:
        secs = [r["seconds"] for r in run.records]
        print(json.dumps({"summary": True, "steps": len(secs), "ranks": lab.world_size,
                          "model_mb": args.model_mb, "batch": args.batch,
                          "seconds_total": round(sum(secs), 6),
                          "seconds_mean": round(statistics.fmean(secs), 6),
                          "seconds_median": round(statistics.median(secs), 6),
                          "seconds_max": round(max(secs), 6),
                          "wall_seconds": round(time.monotonic() - started, 3)}), flush=True)
    return 0


def cmd_serve(args) -> int:
    from fabricscope.lab.topology import load
    from fabricscope.lab.training import start_training
    lab = load(args.name)
    knobs = {**kind_knobs(args), "rate": args.rate, "serve_mode": args.mode}
    _TRAIN_PID[0] = os.getpid()
    previous = signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
    try:
        with start_training(lab, args.requests, model_mb=args.model_mb, batch=args.batch,
                            master_port=args.master_port, timeout_s=args.timeout_s,
                            kind="serve", knobs=knobs) as run:
            for item in run.steps():
                print(json.dumps(item), flush=True)
            code = run.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code != 0:
        print(f"fabricscope: error: serving failed: {run.error}", file=sys.stderr)
        return 1
    if len(run.records) != args.requests:
        print(f"fabricscope: error: serving failed: rank 0 answered {len(run.records)} of "
              f"{args.requests} requests (log: {run.log_paths[0]})", file=sys.stderr)
        return 1
    return 0


def cmd_exec(args) -> int:
    from fabricscope.lab import exec_argv, exec_env
    from fabricscope.lab.topology import load, require_root
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UserError("no command given", "put the command after --, e.g. -- ip addr")
    lab = load(args.name)
    node = lab.node(args.node)
    require_root("`lab exec`")
    argv = exec_argv(node, cmd)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], argv, exec_env(lab, node))
    except FileNotFoundError:
        raise UserError("the ip command is missing", "install iproute2 (make setup)") from None
