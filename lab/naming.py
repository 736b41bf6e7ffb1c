"""Names, addresses and paths of a lab, derived from its name (pure logic, no root).

Everything a lab creates on the host is named from a 6-hex-digit hash of the lab
name, so two labs never collide and a lab can be torn down even without its state
file:

    gateway bridge    fs<h6>br          e.g. fs3f9a0cbr   (one ToR: the ToR, tor0)
    spine bridge      fs<h6>sp          e.g. fs3f9a0csp   (K ToRs, K > 1: holds the gateway)
    ToR K bridge      fs<h6>t<K>        e.g. fs3f9a0ct1   (K ToRs, K > 1)
    uplink K          fs<h6>ut<K> == fs<h6>us<K>          (veth: ToR-side end == spine-side end)
    switch port I     fs<h6>p<I>        e.g. fs3f9a0cp1   (root namespace, ToR-side veth)
    node NIC I        fs<h6>n<I>        e.g. fs3f9a0cn1   (inside the node's netns)
    netns I           fs-<name>-n<I>    e.g. fs-demo-n1
    nft table         bridge fabricscope_<h6>
    state             $FABRICSCOPE_LAB_DIR/<name>.json    (default /run/fabricscope/labs)
    per-node dir      $FABRICSCOPE_LAB_DIR/<name>/node<I>/ (markers/, train.log)
    topology file     $FABRICSCOPE_LAB_DIR/<name>/topology.yaml (fabricscope/topology.py)
    ToR K             tor<K>            (its name in the topology file, for the collector)

Every interface name fits IFNAMSIZ (15 characters) for 64 nodes and ToRs.
Nodes hang off the ToRs in contiguous blocks (tor_blocks): with N nodes on K
ToRs the first N mod K ToRs take one node more than the others.

Addresses come from 198.18.0.0/15 (RFC 2544 benchmarking space): each lab takes
one free /24 (512 of them), nodes get .1, .2, ... and the gateway bridge .254.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re

from fabricscope.errors import UserError

SUPERNET = ipaddress.ip_network("198.18.0.0/15")
PREFIXLEN = 24
GATEWAY_HOST = 254
MAX_NODES = 64            # well below the 253 host addresses of a /24; veths cost CPU
DEFAULT_DIR = "/run/fabricscope/labs"
NFT_FAMILY = "bridge"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
IFNAME_RE = re.compile(r"^fs[0-9a-f]{6}(?:br|sp|t\d+|ut\d+|us\d+|p\d+|n\d+)$")
BRIDGE_RE = re.compile(r"^fs[0-9a-f]{6}(?:br|sp|t\d+)$")
NFT_TABLE_RE = re.compile(r"^fabricscope_[0-9a-f]{6}$")
NETNS_RE = re.compile(r"^fs-[A-Za-z0-9][A-Za-z0-9_-]{0,31}-n\d+$")


def state_dir() -> str:
    """Where lab state lives; FABRICSCOPE_LAB_DIR overrides (tests)."""
    return os.environ.get("FABRICSCOPE_LAB_DIR", DEFAULT_DIR)


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise UserError(f"lab name {name!r} is not valid",
                        "use 1-32 letters, digits, '-' or '_', starting with a letter or digit")
    return name


def check_nodes(nodes) -> int:
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        raise UserError(f"node count {nodes!r} is out of range",
                        f"give --nodes between 1 and {MAX_NODES}")
    return nodes


def check_tors(tors, nodes: int) -> int:
    """A valid ToR count for `nodes` nodes: 1 (one bridge) up to one ToR per node."""
    if isinstance(tors, bool) or not isinstance(tors, int) or not 1 <= tors <= nodes:
        raise UserError(f"ToR count {tors!r} is out of range for {nodes} node(s)",
                        f"give --tors between 1 and {nodes} (the node count)")
    return tors


def tor_blocks(nodes: int, tors: int) -> list[list[int]]:
    """Node indices on each ToR: contiguous blocks, the first `nodes % tors` ToRs
    one node larger (7 nodes on 3 ToRs: [0, 1, 2], [3, 4], [5, 6])."""
    size, extra = divmod(nodes, tors)
    blocks, start = [], 0
    for k in range(tors):
        end = start + size + (1 if k < extra else 0)
        blocks.append(list(range(start, end)))
        start = end
    return blocks


def lab_hash(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()[:6]


def bridge_name(name: str) -> str:
    return f"fs{lab_hash(name)}br"


def spine_name(name: str) -> str:
    return f"fs{lab_hash(name)}sp"


def tor_name(index: int) -> str:
    """The ToR's name for the topology file and the collector: 'tor<K>'."""
    return f"tor{index}"


def tor_bridge_name(name: str, index: int, tors: int) -> str:
    """ToR `index`'s bridge: the gateway bridge itself when it is the only ToR."""
    return bridge_name(name) if tors == 1 else f"fs{lab_hash(name)}t{index}"


def uplink_name(name: str, index: int) -> str:
    """ToR-side end of ToR `index`'s uplink (its egress: frames toward the spine)."""
    return f"fs{lab_hash(name)}ut{index}"


def uplink_peer_name(name: str, index: int) -> str:
    """Spine-side end of ToR `index`'s uplink (its egress: frames toward the ToR)."""
    return f"fs{lab_hash(name)}us{index}"


def port_name(name: str, index: int) -> str:
    return f"fs{lab_hash(name)}p{index}"


def node_ifname(name: str, index: int) -> str:
    return f"fs{lab_hash(name)}n{index}"


def netns_name(name: str, index: int) -> str:
    return f"fs-{name}-n{index}"


def node_name(name: str, index: int) -> str:
    """The node's name for the agent and the collector: 'node<I>' (unique within a lab;
    run one collector per lab, or give agents --node yourself)."""
    return f"node{index}"


def nft_table(name: str) -> str:
    return f"fabricscope_{lab_hash(name)}"


def mac(name: str, index: int, side: str) -> str:
    """Deterministic locally administered MAC: 02:h:h:h:<side>:<index>.

    side: 'node' (00), 'port' (01), 'uplink' (02: ToR-side end), 'uplink_peer' (03:
    spine-side end), 'tor' (fd: a ToR bridge of several) or 'bridge' (fe, index
    ignored: the gateway bridge)."""
    h = lab_hash(name)
    side_byte = {"node": 0x00, "port": 0x01, "uplink": 0x02, "uplink_peer": 0x03,
                 "tor": 0xFD, "bridge": 0xFE}[side]
    last = 0 if side == "bridge" else index
    return f"02:{h[0:2]}:{h[2:4]}:{h[4:6]}:{side_byte:02x}:{last:02x}"


def cpu_mask(ncpus: int) -> str:
    """sysfs cpumask of CPUs 0..ncpus-1: 32-bit hex groups, comma separated ('3', '1,ffffffff')."""
    value = (1 << max(1, ncpus)) - 1
    groups = []
    while True:
        groups.append(value & 0xFFFFFFFF)
        value >>= 32
        if not value:
            break
    return ",".join([f"{groups[-1]:x}"] + [f"{g:08x}" for g in reversed(groups[:-1])])


def all_subnets() -> list[ipaddress.IPv4Network]:
    return list(SUPERNET.subnets(new_prefix=PREFIXLEN))


def allocate_subnet(used) -> ipaddress.IPv4Network:
    """The first /24 of 198.18.0.0/15 that overlaps none of `used` (networks or strings)."""
    taken = [ipaddress.ip_network(u, strict=False) for u in used]
    for net in all_subnets():
        if not any(net.overlaps(t) for t in taken if t.version == 4):
            return net
    raise UserError("no free /24 left in 198.18.0.0/15 for another lab",
                    "remove labs with `fabricscope lab down --all`")


def node_address(subnet, index: int) -> str:
    return str(ipaddress.ip_network(subnet)[index + 1])


def gateway_address(subnet) -> str:
    return str(ipaddress.ip_network(subnet)[GATEWAY_HOST])


def lab_dir(name: str) -> str:
    return os.path.join(state_dir(), name)


def state_file(name: str) -> str:
    return os.path.join(state_dir(), f"{name}.json")


def node_dir(name: str, index: int) -> str:
    return os.path.join(lab_dir(name), f"node{index}")


def markers_dir(name: str, index: int) -> str:
    return os.path.join(node_dir(name, index), "markers")


def topology_path(name: str) -> str:
    return os.path.join(lab_dir(name), "topology.yaml")
