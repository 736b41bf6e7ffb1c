"""The network lab: a small training cluster on one kernel (`fabricscope lab ...`).

N nodes, each a network namespace with one NIC (a veth), plugged into one
Linux bridge that plays the top-of-rack switch, or into K such ToR bridges
joined by uplinks (veths) to a spine bridge (leaf-spine, `--tors K`). Addresses
come from 198.18.0.0/15, one free /24 per lab (labs coexist); nodes get .1, .2,
...; the bridge above every node (the only ToR, or the spine) gets .254 (the
gateway), so the root namespace (collector, InfluxDB, data server) and every
node reach each other. Faults: on a node's switch port (the ToR-side veth) or a
ToR's uplink, random loss with nftables and a shallow TBF shaper; on a node's
CPU, a cgroup quota for its training ranks (a straggler); on the data server, a
rate and a per-request delay (slow storage). The workload is real PyTorch DDP
over gloo, one rank per node. Needs root; tests: tests/kernel/test_lab.py,
tests/kernel/test_lab_faults.py.

Nodes have no default route (lab traffic cannot leave the subnet) and no IPv6;
RPS on every veth keeps each flow on one CPU so veths do not reorder it. Measured
on the 2-core dev VM (load from other work): `lab up` of 3 nodes 0.26 s (5 nodes
on 2 ToRs, link-shaped: 0.76 s); 20 DDP steps of the default 8 MiB model over 3
ranks 1.0-1.4 s of step time (6-14 s wall, mostly torch imports), 1.4-3.0 s with
2 % loss on node 1 (node 1: ~2800-3800 retransmitted segments); with wire_frames
9.4 s and 22.6 s. A 4 MiB model with 1 MiB read per step: median step 0.027 s;
node 1 at 25 % of a CPU 0.046 s; storage at 50mbit 0.22 s.

Python API (stable; other components import it)
-----------------------------------------------

    from fabricscope.lab.topology import Lab, LabNode, up, down, load
        up(name, nodes, link_rate=None, shape_links=True, wire_frames=False, tors=1) -> Lab
            Builds the lab (first clearing a stale lab of the same name). link_rate:
            '1gbit' or bit/s; recorded as link_rate_bps and, with shape_links,
            applied as TBF on both ends of every link (uplinks too). Default: no
            shaping. wire_frames: one segment per skb on every veth (gso_max_segs 1),
            so loss and TBF act per wire frame; default GSO skbs (loss drops GSO
            bursts). tors: 1..nodes ToRs; nodes in contiguous blocks, the first
            nodes % tors ToRs one node larger. Writes Lab.topology_path.
        down(name) -> bool        idempotent; also ends processes left in its netns
        load(name) -> Lab         from the state file; UserError if there is none
        list_labs() -> [Lab]; down_all() -> [name]
    from fabricscope.lab.faults import loss, shape, cpu, loss_uplink, shape_uplink, storage, clear
        loss(lab, node_index, pct, direction="both")   nft random drop on the node's
            switch port; "tx": frames the node sends, "rx": frames sent to it, "both";
            pct may be fractional (0.01 resolution); 0 removes
        shape(lab, node_index, rate, burst, limit=None, latency=None)  TBF on the port
            (egress toward the node); default limit: burst + 2 ms at the rate
        cpu(lab, node_index, pct) -> {"pct", "quota_us", "period_us"}   the node's
            training ranks get pct % of one CPU (cgroup CFS quota; 1 <= pct <= 100 x CPUs)
        loss_uplink(lab, "tor0", pct, direction="both"); shape_uplink(lab, "tor0", rate,
            burst, limit=None, latency=None, direction="up") -> params   the same on a
            ToR's uplink: "up" ToR -> spine, "down" spine -> ToR, "both"
        storage(lab, rate=None, delay=None) -> StorageFault   slow the data server
            ('20mbit', '50ms'); neither: fast again; the running server picks it up
        clear(lab, node_index=None, uplink=None)   one node's or one uplink's faults;
            neither: every fault of the lab (nodes, uplinks, storage)
        drops(lab, node_index) -> {"tx": n, "rx": n}   packets the loss rules dropped
        uplink_drops(lab, "tor0") -> {"up": n, "down": n}
        port_qdisc(lab, node_index), uplink_qdisc(lab, "tor0", direction="up") ->
            {"kind": "tbf", "rate_bps": ..., "bytes": ..., "overlimits": ..., ...}
    from fabricscope.lab.training import start_training, TrainingRun
        start_training(lab, steps, model_mb=8, extra_env=None, batch=32,
                       master_port=None, timeout_s=None) -> TrainingRun
        TrainingRun: .steps() yields rank 0's {"step": n, "seconds": s} as they come;
            .wait(timeout=None) -> returncode (0: every rank succeeded); .error (one
            line, when a rank failed); .terminate(); .poll(); .records; .log_paths;
            `with start_training(...) as run:` ends every rank on exit.
    from fabricscope.lab.running import running_lab
        with running_lab(name=None, nodes=2, link_rate=None, shape_links=True,
                         wire_frames=False, tors=1) as lab: ...   (name=None: a fresh unique name)
            up() then always down(), also on exceptions, KeyboardInterrupt, SIGTERM.
    lab.exec_argv(node, argv) -> ["ip", "netns", "exec", node.netns, *argv]
    lab.exec_env(lab, node, base=None) -> env for commands run on a node (see below)

Lab fields: name, bridge (the bridge with the gateway: the only ToR's, or the
spine), gateway (its IP), subnet ("198.18.K.0/24"), prefixlen, link_rate_bps (int
or None), nodes, nft_table, dir, link_shaped, wire_frames, faults ({node index:
{"loss": {...}, "shape": {...}, "cpu": {...}}}), created, owner_pid (the
running_lab process that owns it, 0 for `lab up`; running_lab removes labs whose
owner is gone before it makes its own: down_orphans()), tors, spine ("" with one
ToR), topology_path (<dir>/topology.yaml), uplink_faults ({"tor<K>": {"loss",
"shape"}}), storage_fault ({"rate_bps", "delay_s"}, {} for none).
LabTor fields: index, name ("tor<K>", as in the topology file), bridge, uplink
(ToR-side veth end, "" with one ToR), spine_port (spine-side end), nodes (indices).
LabNode fields: index, name ("node<I>", for agents/collector), netns,
ifname (node-side NIC, inside netns), port (ToR-side veth, root netns),
address (no prefix), mac, port_mac, dir, markers_dir
($FABRICSCOPE_LAB_DIR/<lab>/node<I>/markers, default dir /run/fabricscope/labs),
tor ("tor<K>"), cgroup (its CPU cgroup's path, "" where the host has none).

`lab up --json` prints Lab.to_dict(): {name, bridge, gateway, subnet, prefixlen,
link_rate_bps, nodes: [{index, name, netns, ifname, port, address, mac, port_mac,
dir, markers_dir, tor, cgroup}], nft_table, dir, link_shaped, wire_frames, faults,
created, owner_pid, tors: [{index, name, bridge, uplink, spine_port, nodes}],
spine, topology_path, uplink_faults, storage_fault}.

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
