"""`fabricscope lab ...`: build labs, inject faults, run DDP, run commands on nodes.

    fabricscope lab up    --name NAME --nodes N [--link-rate RATE] [--no-link-shaping]
                          [--wire-frames] [--json]
    fabricscope lab down  --name NAME | --all
    fabricscope lab list  [--json]
    fabricscope lab fault --name NAME --node I loss PCT [--direction both|tx|rx]
    fabricscope lab fault --name NAME --node I shape --rate R --burst B [--limit L | --latency T]
    fabricscope lab fault --name NAME [--node I] clear    (same: lab clear --name NAME [--node I])
    fabricscope lab train --name NAME --steps K [--model-mb M] [--batch B] [--json-summary]
        [--data-mb D] [--checkpoint-every N]     (reads/checkpoints via a data server)
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

    p = sub.add_parser("fault", help="inject or clear a fault on a node's switch port")
    p.add_argument("--name", required=True, help="lab name")
    p.add_argument("--node", type=int, help="node index (0-based)")
    fsub = p.add_subparsers(dest="fault_kind", metavar="FAULT", required=True)
    f = fsub.add_parser("loss", help="drop PCT%% of frames at random (nftables)")
    f.add_argument("pct", metavar="PCT", help="loss percent, e.g. 2 or 0.5 (0 removes)")
    f.add_argument("--direction", choices=["both", "tx", "rx"], default="both",
                   help="tx: frames the node sends; rx: frames sent to it; both (default)")
    f.set_defaults(func=cmd_fault_loss)
    f = fsub.add_parser("shape", help="TBF on the switch port (egress toward the node)")
    f.add_argument("--rate", required=True, help="e.g. 100mbit")
    f.add_argument("--burst", required=True, help="bucket size, e.g. 32kb")
    g = f.add_mutually_exclusive_group()
    g.add_argument("--limit", help="queue size in bytes, e.g. 64kb (default: burst + 2 ms at rate)")
    g.add_argument("--latency", help="queue size as time at the rate, e.g. 5ms")
    f.set_defaults(func=cmd_fault_shape)
    f = fsub.add_parser("clear", help="remove the node's faults (every node's without --node)")
    f.set_defaults(func=cmd_clear)

    p = sub.add_parser("clear", help="remove faults of a node, or of every node")
    p.add_argument("--name", required=True, help="lab name")
    p.add_argument("--node", type=int, help="node index (default: every node)")
    p.set_defaults(func=cmd_clear)

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
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("exec", help="run a command in a node's network namespace")
    p.add_argument("--name", required=True, help="lab name")
    p.add_argument("--node", type=int, required=True, help="node index (0-based)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD...",
                   help="command and arguments")
    p.set_defaults(func=cmd_exec)


# -- commands ---------------------------------------------------------------------------

def cmd_up(args) -> int:
    from lab.topology import up
    from lab.units import format_rate
    start = time.monotonic()
    lab = up(args.name, args.nodes, link_rate=args.link_rate, shape_links=args.shape_links,
             wire_frames=args.wire_frames)
    took = time.monotonic() - start
    if args.json:
        print(json.dumps(lab.to_dict()))
        return 0
    shaped = " (shaped)" if lab.link_shaped else (" (recorded only)" if lab.link_rate_bps else "")
    print(f"lab {lab.name}: {len(lab.nodes)} nodes on bridge {lab.bridge}, subnet {lab.subnet}, "
          f"gateway {lab.gateway}, link rate {format_rate(lab.link_rate_bps)}{shaped}"
          f"{', wire frames' if lab.wire_frames else ''}; "
          f"up in {took:.2f} s")
    for n in lab.nodes:
        print(f"  node {n.index} {n.name}: netns {n.netns}, nic {n.ifname} {n.address} {n.mac}, "
              f"switch port {n.port}, markers {n.markers_dir}")
    return 0


def cmd_down(args) -> int:
    from lab.topology import down, down_all
    if args.all:
        names = down_all()
        print(f"removed {len(names)} lab(s)" + (": " + ", ".join(names) if names else ""))
    else:
        found = down(args.name)
        print(f"lab {args.name} is down" + ("" if found else " (there was nothing to remove)"))
    return 0


def cmd_list(args) -> int:
    from lab.topology import list_labs
    from lab.units import format_rate
    labs = list_labs()
    if args.json:
        print(json.dumps([lab.to_dict() for lab in labs]))
        return 0
    if not labs:
        print("no labs")
        return 0
    print(f"{'NAME':<20} {'NODES':>5} {'SUBNET':<18} {'BRIDGE':<11} {'LINK':<8} FAULTS")
    for lab in labs:
        faults = "; ".join(f"node{i}: {_describe_fault(f)}" for i, f in sorted(lab.faults.items()))
        print(f"{lab.name:<20} {len(lab.nodes):>5} {lab.subnet:<18} {lab.bridge:<11} "
              f"{format_rate(lab.link_rate_bps):<8} {faults or '-'}")
    return 0


def _describe_fault(fault: dict) -> str:
    from lab.units import format_rate
    parts = []
    if "loss" in fault:
        parts.append(f"loss {fault['loss']['pct']:g}% {fault['loss']['direction']}")
    if "shape" in fault:
        s = fault["shape"]
        parts.append(f"shape {format_rate(s['rate_bps'])} burst {s['burst']}B limit {s['limit']}B")
    return ", ".join(parts)


def _need_node(args) -> int:
    if args.node is None:
        raise UserError("this fault needs a node", "give --node I (0-based) before the fault name")
    return args.node


def cmd_fault_loss(args) -> int:
    from lab.faults import loss
    from lab.topology import load
    text = args.pct.strip().rstrip("%")
    try:
        pct = float(text)
    except ValueError:
        raise UserError(f"loss {args.pct!r} is not a number", "give a percentage, e.g. 2 or 0.5") \
            from None
    lab = load(args.name)
    node = lab.node(_need_node(args))
    loss(lab, node.index, pct, args.direction)
    print(f"lab {lab.name} node {node.index}: " +
          (f"loss {pct:g}% ({args.direction}) on switch port {node.port}" if pct
           else f"no loss on switch port {node.port}"))
    return 0


def cmd_fault_shape(args) -> int:
    from lab.faults import shape
    from lab.topology import load
    from lab.units import format_rate
    lab = load(args.name)
    node = lab.node(_need_node(args))
    p = shape(lab, node.index, args.rate, args.burst, limit=args.limit, latency=args.latency)
    print(f"lab {lab.name} node {node.index}: tbf rate {format_rate(p['rate_bps'])} burst "
          f"{p['burst']}B limit {p['limit']}B on switch port {node.port}")
    return 0


def cmd_clear(args) -> int:
    from lab.faults import clear
    from lab.topology import load
    lab = load(args.name)
    if args.node is not None:
        lab.node(args.node)
    clear(lab, args.node)
    which = f"node {args.node}" if args.node is not None else "every node"
    print(f"lab {lab.name}: faults cleared on {which}")
    return 0


_TRAIN_PID = [0]


def _sigterm_to_interrupt(signum, frame):
    if os.getpid() != _TRAIN_PID[0]:     # a forked child inherits the handler: just die
        os._exit(128 + signum)
    raise KeyboardInterrupt


def cmd_train(args) -> int:
    import contextlib

    from lab.dataserver import running_dataserver
    from lab.topology import load
    from lab.training import start_training
    if args.data_mb < 0 or args.checkpoint_every < 0:
        raise UserError("--data-mb and --checkpoint-every must be 0 or more",
                        "e.g. --data-mb 1 --checkpoint-every 10")
    lab = load(args.name)
    _TRAIN_PID[0] = os.getpid()
    previous = signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
    started = time.monotonic()
    io = args.data_mb > 0 or args.checkpoint_every > 0
    try:
        with (running_dataserver(lab, None) if io else contextlib.nullcontext()) as server:
            kw = dict(data_server=server, data_bytes=int(args.data_mb * 2**20),
                      checkpoint_every=args.checkpoint_every) if io else {}
            with start_training(lab, args.steps, model_mb=args.model_mb, batch=args.batch,
                                master_port=args.master_port, timeout_s=args.timeout_s,
                                **kw) as run:
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


def cmd_exec(args) -> int:
    from lab import exec_argv, exec_env
    from lab.topology import load, require_root
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
