"""`fabricscope lab fault ...` and `lab clear`: the faults' command line (lab/faults.py).

    fabricscope lab fault --name NAME --node I loss PCT [--direction both|tx|rx]
    fabricscope lab fault --name NAME --node I shape --rate R --burst B [--limit L | --latency T]
    fabricscope lab fault --name NAME --node I delay T      (every frame toward the node, e.g. 5ms)
    fabricscope lab fault --name NAME --node I cpu PCT      (the node's ranks get PCT % of a CPU)
    fabricscope lab fault --name NAME --uplink TOR loss PCT [--direction both|up|down]
    fabricscope lab fault --name NAME --uplink TOR shape --rate R --burst B [--limit L |
                          --latency T] [--direction up|down|both]
    fabricscope lab fault --name NAME storage [--rate R] [--delay T]     (the data server)
    fabricscope lab fault --name NAME storage clear
    fabricscope lab fault --name NAME [--node I | --uplink TOR] clear
    fabricscope lab clear --name NAME [--node I | --uplink TOR]

Loss acts both ways by default; an uplink's shaper on "up" (frames leaving the
ToR toward the spine, where a rack's traffic aggregates). `clear` without --node
or --uplink removes every fault of the lab.
"""

from __future__ import annotations

import argparse

from fabricscope.errors import UserError

NODE_DIRECTIONS = ("both", "tx", "rx")
UPLINK_DIRECTIONS = ("up", "down", "both")


def add_fault_parsers(sub) -> None:
    p = sub.add_parser("fault", help="inject or clear a fault: a node's switch port or CPU, a "
                                     "ToR's uplink, the storage")
    p.add_argument("--name", required=True, help="lab name")
    _add_target(p)
    fsub = p.add_subparsers(dest="fault_kind", metavar="FAULT", required=True)
    f = fsub.add_parser("loss", help="drop PCT%% of frames at random (nftables)")
    f.add_argument("pct", metavar="PCT", help="loss percent, e.g. 2 or 0.5 (0 removes)")
    f.add_argument("--direction", choices=sorted(set(NODE_DIRECTIONS + UPLINK_DIRECTIONS)),
                   default="both",
                   help="node: tx (frames it sends), rx (frames sent to it); uplink: up "
                        "(ToR -> spine), down; both (default): each way independently")
    f.set_defaults(func=cmd_fault_loss)
    f = fsub.add_parser("shape", help="TBF on the switch port (egress toward the node) or on "
                                      "the uplink")
    f.add_argument("--rate", required=True, help="e.g. 100mbit")
    f.add_argument("--burst", required=True, help="bucket size, e.g. 32kb")
    g = f.add_mutually_exclusive_group()
    g.add_argument("--limit", help="queue size in bytes, e.g. 64kb (default: burst + 2 ms at rate)")
    g.add_argument("--latency", help="queue size as time at the rate, e.g. 5ms")
    f.add_argument("--direction", choices=UPLINK_DIRECTIONS,
                   help="uplink only: up (ToR -> spine, default), down, both")
    f.set_defaults(func=cmd_fault_shape)
    f = fsub.add_parser("delay", help="every frame the switch port sends toward the node waits "
                                      "T, none dropped (a user-space stage; 0 removes it)")
    f.add_argument("delay", metavar="T", help="e.g. 5ms (0 removes it)")
    f.set_defaults(func=cmd_fault_delay)
    f = fsub.add_parser("cpu", help="the node's training ranks get PCT%% of one CPU (cgroup quota)")
    f.add_argument("pct", metavar="PCT", help="percent of one CPU, e.g. 30 (up to 100 x CPUs)")
    f.set_defaults(func=cmd_fault_cpu)
    f = fsub.add_parser("storage", help="slow the lab's data server: a rate and/or a delay")
    f.add_argument("action", nargs="?", choices=["clear"], help="clear: fast storage again")
    f.add_argument("--rate", help="payload rate, e.g. 20mbit")
    f.add_argument("--delay", help="added before every reply, e.g. 50ms")
    f.set_defaults(func=cmd_fault_storage)
    f = fsub.add_parser("clear", help="remove the node's or the uplink's faults (every fault of "
                                      "the lab without --node or --uplink)")
    f.set_defaults(func=cmd_clear)

    p = sub.add_parser("clear", help="remove faults of a node, an uplink, or the whole lab")
    p.add_argument("--name", required=True, help="lab name")
    _add_target(p)
    p.set_defaults(func=cmd_clear)


def _add_target(parser: argparse.ArgumentParser) -> None:
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--node", type=int, help="node index (0-based)")
    g.add_argument("--uplink", metavar="TOR", help="a ToR's uplink to the spine, e.g. tor0")


def _number(text: str, what: str, example: str) -> float:
    try:
        return float(str(text).strip().rstrip("%"))
    except ValueError:
        raise UserError(f"{what} {text!r} is not a number", f"give a percentage, e.g. {example}") \
            from None


def _need_node(args, fault: str = "this fault") -> int:
    if args.node is None:
        raise UserError(f"{fault} needs a node", "give --node I (0-based) before the fault name")
    return args.node


def _direction(args, allowed: tuple[str, ...], default: str, target: str) -> str:
    direction = args.direction or default
    if direction not in allowed:
        raise UserError(f"direction {direction!r} does not apply to {target}",
                        f"give --direction {' or '.join(allowed)}")
    return direction


def cmd_fault_loss(args) -> int:
    from fabricscope.lab.faults import loss, loss_uplink
    from fabricscope.lab.topology import load
    pct = _number(args.pct, "loss", "2 or 0.5")
    lab = load(args.name)
    if args.uplink is not None:
        tor = lab.uplink(args.uplink)
        direction = _direction(args, UPLINK_DIRECTIONS, "both", "an uplink")
        loss_uplink(lab, tor.name, pct, direction)
        print(f"lab {lab.name} {tor.name} uplink: " +
              (f"loss {pct:g}% ({direction})" if pct else "no loss"))
        return 0
    node = lab.node(_need_node(args))
    direction = _direction(args, NODE_DIRECTIONS, "both", "a node's port")
    loss(lab, node.index, pct, direction)
    print(f"lab {lab.name} node {node.index}: " +
          (f"loss {pct:g}% ({direction}) on switch port {node.port}" if pct
           else f"no loss on switch port {node.port}"))
    return 0


def cmd_fault_shape(args) -> int:
    from fabricscope.lab.faults import shape, shape_uplink
    from fabricscope.lab.topology import load
    from fabricscope.lab.units import format_rate
    lab = load(args.name)
    if args.uplink is not None:
        tor = lab.uplink(args.uplink)
        p = shape_uplink(lab, tor.name, args.rate, args.burst, limit=args.limit,
                         latency=args.latency, direction=args.direction or "up")
        print(f"lab {lab.name} {tor.name} uplink: tbf rate {format_rate(p['rate_bps'])} burst "
              f"{p['burst']}B limit {p['limit']}B ({p['direction']})")
        return 0
    node = lab.node(_need_node(args))
    if args.direction is not None:
        raise UserError("--direction applies to uplinks only",
                        "a node's shaper is on its switch port (egress toward the node): "
                        "drop --direction")
    p = shape(lab, node.index, args.rate, args.burst, limit=args.limit, latency=args.latency)
    print(f"lab {lab.name} node {node.index}: tbf rate {format_rate(p['rate_bps'])} burst "
          f"{p['burst']}B limit {p['limit']}B on switch port {node.port}")
    return 0


def cmd_fault_delay(args) -> int:
    from fabricscope.lab.faults import delay
    from fabricscope.lab.topology import load
    lab = load(args.name)
    if args.uplink is not None:
        raise UserError("a delay is on a node's switch port", "give --node I instead of --uplink")
    node = lab.node(_need_node(args, "a delay"))
    seconds = delay(lab, node.index, args.delay)
    print(f"lab {lab.name} node {node.index}: " + (
        f"every frame toward the node waits {seconds * 1000:g} ms on switch port {node.port}"
        if seconds else "no delay"))
    return 0


def cmd_fault_cpu(args) -> int:
    from fabricscope.lab.faults import cpu
    from fabricscope.lab.topology import load
    pct = _number(args.pct, "CPU share", "30")
    lab = load(args.name)
    if args.uplink is not None:
        raise UserError("a CPU fault is a node's", "give --node I instead of --uplink")
    node = lab.node(_need_node(args, "a CPU fault"))
    fault = cpu(lab, node.index, pct)
    print(f"lab {lab.name} node {node.index}: training ranks get {pct:g}% of a CPU "
          f"({fault['quota_us']} us per {fault['period_us']} us, cgroup {node.cgroup})")
    return 0


def cmd_fault_storage(args) -> int:
    from fabricscope.lab.faults import storage
    from fabricscope.lab.topology import load
    if args.node is not None or args.uplink is not None:
        raise UserError("the storage fault is the lab's data server's, not a node's or an "
                        "uplink's", "drop --node/--uplink")
    if args.action == "clear" and (args.rate or args.delay):
        raise UserError("`storage clear` takes no --rate or --delay", "give one or the other")
    if args.action is None and args.rate is None and args.delay is None:
        raise UserError("a storage fault needs a rate or a delay",
                        "give --rate 20mbit and/or --delay 50ms, or `storage clear`")
    lab = load(args.name)
    fault = storage(lab, args.rate, args.delay)
    print(f"lab {lab.name} storage: {fault.describe() if fault else 'fast (no fault)'}")
    return 0


def cmd_clear(args) -> int:
    from fabricscope.lab.faults import clear
    from fabricscope.lab.topology import load
    lab = load(args.name)
    if args.node is not None:
        lab.node(args.node)
    if args.uplink is not None:
        lab.uplink(args.uplink)
    clear(lab, args.node, args.uplink)
    which = (f"node {args.node}" if args.node is not None
             else f"{args.uplink} uplink" if args.uplink is not None else "the whole lab")
    print(f"lab {lab.name}: faults cleared on {which}")
    return 0


def describe_faults(lab) -> str:
    """One line of every fault of the lab, for `lab list`."""
    parts = [f"node{i}: {_describe(f)}" for i, f in sorted(lab.faults.items())]
    parts += [f"{t} uplink: {_describe(f)}" for t, f in sorted(lab.uplink_faults.items())]
    if lab.storage_fault:
        from fabricscope.lab.storage_fault import StorageFault
        parts.append(f"storage: {StorageFault.from_dict(lab.storage_fault).describe()}")
    return "; ".join(parts)


def _describe(fault: dict) -> str:
    from fabricscope.lab.units import format_rate
    parts = []
    if "loss" in fault:
        parts.append(f"loss {fault['loss']['pct']:g}% {fault['loss']['direction']}")
    if "shape" in fault:
        s = fault["shape"]
        parts.append(f"shape {format_rate(s['rate_bps'])} burst {s['burst']}B limit {s['limit']}B"
                     + (f" {s['direction']}" if "direction" in s else ""))
    if "delay" in fault:
        parts.append(f"delay {fault['delay']['delay_s'] * 1000:g}ms")
    if "cpu" in fault:
        parts.append(f"cpu {fault['cpu']['pct']:g}%")
    return ", ".join(parts)
