"""The network lab: a small training cluster on one kernel (`fabricscope lab ...`).

N nodes, each a network namespace with one NIC (a veth), all plugged into one
Linux bridge that plays the top-of-rack switch. Addresses come from
198.18.0.0/15, one free /24 per lab (labs coexist); nodes get .1, .2, ...; the
bridge gets .254 (the gateway), so the root namespace (collector, InfluxDB) and
every node reach each other. Faults act on a node's switch port (the bridge-side
veth): random loss with nftables, a shallow TBF shaper. The workload is real
PyTorch DDP over gloo, one rank per node. Needs root; tests: tests/kernel/test_lab.py.

Nodes have no default route (lab traffic cannot leave the subnet) and no IPv6;
RPS on every veth keeps each flow on one CPU so veths do not reorder it. Measured
on the 2-core dev VM (load from other work): `lab up` of 3 nodes 0.26 s; 20 DDP
steps of the default 8 MiB model over 3 ranks 1.0-1.4 s of step time (6-14 s wall,
mostly torch imports), 1.4-3.0 s with 2 % loss on node 1 (node 1: ~2800-3800
retransmitted segments); with wire_frames 9.4 s and 22.6 s.

Python API (stable; other components import it)
-----------------------------------------------

    from lab.topology import Lab, LabNode, up, down, load
        up(name, nodes, link_rate=None, shape_links=True, wire_frames=False) -> Lab
            Builds the lab (first clearing a stale lab of the same name). link_rate:
            '1gbit' or bit/s; recorded as link_rate_bps and, with shape_links,
            applied as TBF on both ends of every link. Default: no shaping.
            wire_frames: one segment per skb on every veth (gso_max_segs 1), so loss
            and TBF act per wire frame; default GSO skbs (loss drops GSO bursts).
        down(name) -> bool        idempotent; also ends processes left in its netns
        load(name) -> Lab         from the state file; UserError if there is none
        list_labs() -> [Lab]; down_all() -> [name]
    from lab.faults import loss, shape, clear
        loss(lab, node_index, pct, direction="both")   nft random drop on the node's
            switch port; "tx": frames the node sends, "rx": frames sent to it, "both";
            pct may be fractional (0.01 resolution); 0 removes
        shape(lab, node_index, rate, burst, limit=None, latency=None)  TBF on the port
            (egress toward the node); default limit: burst + 2 ms at the rate
        clear(lab, node_index=None)   all faults of one node, or of every node
        drops(lab, node_index) -> {"tx": n, "rx": n}   packets the loss rules dropped
        port_qdisc(lab, node_index) -> {"kind": "tbf", "rate_bps": ..., ...}
    from lab.training import start_training, TrainingRun
        start_training(lab, steps, model_mb=8, extra_env=None, batch=32,
                       master_port=None, timeout_s=None) -> TrainingRun
        TrainingRun: .steps() yields rank 0's {"step": n, "seconds": s} as they come;
            .wait(timeout=None) -> returncode (0: every rank succeeded); .error (one
            line, when a rank failed); .terminate(); .poll(); .records; .log_paths;
            `with start_training(...) as run:` ends every rank on exit.
    from lab.testing import running_lab
        with running_lab(name=None, nodes=2, link_rate=None, shape_links=True,
                         wire_frames=False) as lab: ...   (name=None: a fresh unique name)
            up() then always down(), also on exceptions, KeyboardInterrupt, SIGTERM.
    lab.exec_argv(node, argv) -> ["ip", "netns", "exec", node.netns, *argv]
    lab.exec_env(lab, node, base=None) -> env for commands run on a node (see below)

Lab fields: name, bridge, gateway (bridge IP), subnet ("198.18.K.0/24"),
prefixlen, link_rate_bps (int or None), nodes, nft_table, dir, link_shaped,
wire_frames, faults ({node index: {"loss": {...}, "shape": {...}}}), created,
owner_pid (the running_lab process that owns it, 0 for `lab up`; running_lab removes
labs whose owner is gone before it makes its own: down_orphans()).
LabNode fields: index, name ("node<I>", for agents/collector), netns,
ifname (node-side NIC, inside netns), port (bridge-side veth, root netns),
address (no prefix), mac, port_mac, dir, markers_dir
($FABRICSCOPE_LAB_DIR/<lab>/node<I>/markers, default dir /run/fabricscope/labs).

`lab up --json` prints Lab.to_dict(): {name, bridge, gateway, subnet, prefixlen,
link_rate_bps, nodes: [{index, name, netns, ifname, port, address, mac, port_mac,
dir, markers_dir}], nft_table, dir, link_shaped, wire_frames, faults, created,
owner_pid}.

`lab exec` runs a command in a node's netns with, unless already set,
FABRICSCOPE_MARKERS_DIR and FABRICSCOPE_AGENT_MARKERS_DIR = the node's markers
dir, FABRICSCOPE_AGENT_NODE = the node's name, FABRICSCOPE_LAB, FABRICSCOPE_LAB_NODE.
"""

from __future__ import annotations

import os


def exec_argv(node, argv) -> list[str]:
    """Command line that runs argv inside node's network namespace."""
    return ["ip", "netns", "exec", node.netns, *[str(a) for a in argv]]


def exec_env(lab, node, base=None) -> dict:
    """Environment for a command run on `node` (agents find the node's markers and name)."""
    env = dict(os.environ if base is None else base)
    for key, value in (("FABRICSCOPE_MARKERS_DIR", node.markers_dir),
                       ("FABRICSCOPE_AGENT_MARKERS_DIR", node.markers_dir),
                       ("FABRICSCOPE_AGENT_NODE", node.name),
                       ("FABRICSCOPE_LAB", lab.name),
                       ("FABRICSCOPE_LAB_NODE", str(node.index))):
        env.setdefault(key, value)
    return env
