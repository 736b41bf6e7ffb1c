"""What a lab is, as its state file records it: Lab, LabTor, LabNode, and plan()
(pure: the Lab that `up` would build, touching nothing). fabricscope.lab.topology builds and
removes labs and re-exports these names; lab/__init__.py documents the JSON."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
from dataclasses import dataclass, field

from fabricscope.errors import UserError
from fabricscope.topology import Topology
from fabricscope.lab import naming


@dataclass
class LabNode:
    """One node: a network namespace with one NIC plugged into its ToR's bridge."""

    index: int
    name: str            # node name for agents and the collector: "node<I>"
    netns: str           # network namespace name (`ip netns exec <netns> ...`)
    ifname: str          # the node's NIC, inside the netns
    port: str            # its switch port: the ToR-side veth, in the root namespace
    address: str         # the NIC's IPv4 address, no prefix
    mac: str             # the NIC's MAC
    port_mac: str        # the switch port's MAC
    dir: str             # per-node state directory (train.log)
    markers_dir: str     # FABRICSCOPE_MARKERS_DIR for training processes on this node
    tor: str = "tor0"    # the ToR it hangs off (LabTor.name)
    cgroup: str = ""     # its CPU cgroup (fabricscope.lab.cgroups; "" where the host has none)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class LabTor:
    """A top-of-rack switch: a bridge, and with several ToRs its uplink to the spine."""

    index: int
    name: str            # "tor<K>", as in the topology file
    bridge: str          # its Linux bridge (root namespace)
    uplink: str          # ToR-side end of the uplink veth ("" with one ToR: no spine)
    spine_port: str      # spine-side end of the uplink ("" with one ToR)
    nodes: list[int] = field(default_factory=list)   # indices of the nodes on it


@dataclass
class Lab:
    """A lab as recorded in its state file (see lab/__init__.py for the JSON)."""

    name: str
    bridge: str                        # the bridge holding the gateway: tor0's, or the spine
    gateway: str
    subnet: str
    prefixlen: int
    link_rate_bps: int | None
    nodes: list[LabNode]
    nft_table: str = ""
    dir: str = ""
    link_shaped: bool = False          # link rate applied as TBF (else recorded only)
    wire_frames: bool = False          # gso_max_segs 1 on every veth (see up())
    faults: dict[int, dict] = field(default_factory=dict)   # node index -> {"loss","shape","cpu"}
    created: float = 0.0
    # the process whose `running_lab` block owns the lab (0: `lab up`, kept until
    # `lab down`): a lab whose owner died without tearing it down is an orphan
    owner_pid: int = 0
    tors: list[LabTor] = field(default_factory=list)
    spine: str = ""                    # the spine bridge ("" with one ToR)
    topology_path: str = ""            # <dir>/topology.yaml: node -> ToR, for the collector
    uplink_faults: dict[str, dict] = field(default_factory=dict)   # ToR -> {"loss", "shape"}
    storage_fault: dict = field(default_factory=dict)   # {"rate_bps", "delay_s"} of the data server

    def node(self, index) -> LabNode:
        if isinstance(index, bool) or not isinstance(index, int) \
                or not 0 <= index < len(self.nodes):
            raise UserError(f"lab {self.name!r} has no node {index!r}",
                            f"give a node index between 0 and {len(self.nodes) - 1}")
        return self.nodes[index]

    def uplink(self, tor: str) -> LabTor:
        """The ToR named `tor` (e.g. 'tor0'), which must have an uplink."""
        if not self.spine:
            raise UserError(f"lab {self.name!r} has one ToR and no uplinks",
                            f"recreate it with `fabricscope lab up --name {self.name} --nodes "
                            f"{len(self.nodes)} --tors 2` (or more)")
        for t in self.tors:
            if t.name == tor:
                return t
        raise UserError(f"lab {self.name!r} has no ToR {tor!r}",
                        f"give one of {', '.join(t.name for t in self.tors)}")

    @property
    def world_size(self) -> int:
        return len(self.nodes)

    def topology(self) -> Topology:
        return Topology(tors=tuple(t.name for t in self.tors),
                        nodes={n.name: n.tor for n in self.nodes})

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["faults"] = {str(k): v for k, v in sorted(self.faults.items())}
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Lab":
        data = dict(data)
        data["nodes"] = [LabNode(**n) for n in data["nodes"]]
        data["faults"] = {int(k): v for k, v in (data.get("faults") or {}).items()}
        data["tors"] = [LabTor(**t) for t in data.get("tors") or []] or [
            LabTor(0, naming.tor_name(0), data["bridge"], "", "",
                   [n.index for n in data["nodes"]])]      # a state file from before ToRs
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self) -> None:
        os.makedirs(naming.state_dir(), exist_ok=True)
        path = naming.state_file(self.name)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as fh:
            json.dump(self.to_dict(), fh, indent=1)
            fh.write("\n")
        os.replace(tmp, path)      # a new inode: readers (the data server) see every change


def plan(name: str, nodes: int, subnet, link_rate_bps: int | None = None, tors: int = 1) -> Lab:
    """The Lab that `up` would build on `subnet` (pure: touches nothing). With
    tors > 1 the nodes hang off that many ToR bridges in contiguous blocks, and
    each ToR's uplink joins a spine bridge that holds the gateway."""
    naming.check_name(name)
    naming.check_nodes(nodes)
    naming.check_tors(tors, nodes)
    net = ipaddress.ip_network(subnet)
    several = tors > 1
    racks = [LabTor(index=k, name=naming.tor_name(k),
                    bridge=naming.tor_bridge_name(name, k, tors),
                    uplink=naming.uplink_name(name, k) if several else "",
                    spine_port=naming.uplink_peer_name(name, k) if several else "",
                    nodes=block)
             for k, block in enumerate(naming.tor_blocks(nodes, tors))]
    tor_of = {i: rack.name for rack in racks for i in rack.nodes}
    members = [LabNode(index=i, name=naming.node_name(name, i), netns=naming.netns_name(name, i),
                       ifname=naming.node_ifname(name, i), port=naming.port_name(name, i),
                       address=naming.node_address(net, i), mac=naming.mac(name, i, "node"),
                       port_mac=naming.mac(name, i, "port"), dir=naming.node_dir(name, i),
                       markers_dir=naming.markers_dir(name, i), tor=tor_of[i])
               for i in range(nodes)]
    spine = naming.spine_name(name) if several else ""
    return Lab(name=name, bridge=spine or racks[0].bridge, gateway=naming.gateway_address(net),
               subnet=str(net), prefixlen=net.prefixlen, link_rate_bps=link_rate_bps,
               nodes=members, nft_table=naming.nft_table(name), dir=naming.lab_dir(name),
               tors=racks, spine=spine, topology_path=naming.topology_path(name))
