"""Create, load and remove labs: N network namespaces on one Linux bridge.

    root namespace                                     node I (netns fs-<name>-n<I>)
    bridge fs<h6>br 198.18.K.254/24 -- port fs<h6>p<I> == veth == fs<h6>n<I> 198.18.K.(I+1)/24

The bridge is the top-of-rack switch (STP off, no forwarding delay: ports forward
as soon as they are up, like edge ports); its address is the gateway, so the root
namespace (collector, InfluxDB) and every node reach each other. Nodes get no
default route: lab traffic cannot leave the subnet. The lab is IPv4 only: IPv6
is disabled on the bridge, the ports and in the nodes, so no DAD/MLD chatter
shows up in the agents' counters. RPS on every veth keeps each flow in order.

By default the veths pass GSO skbs (up to 64 KB) as a host hands them to a NIC
doing TSO, so a loss rule drops whole GSO bursts: 2 % loss is 2 % of skbs, about
2 % of bytes, but in bursts. `wire_frames` limits every veth to one segment per
skb: loss and TBF then act per wire frame, as on a real switch, at ~10x the CPU.

State lives in $FABRICSCOPE_LAB_DIR/<name>.json (default /run/fabricscope/labs);
every change holds an exclusive flock on $FABRICSCOPE_LAB_DIR/.lock, so
concurrent `lab up`s pick distinct subnets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import ipaddress
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field

from fabricscope.errors import UserError
from lab import naming, nft, nsops, tc
from lab.units import parse_rate

log = logging.getLogger(__name__)

NO_IPV6 = {"net/ipv6/conf/all/disable_ipv6": "1", "net/ipv6/conf/default/disable_ipv6": "1"}


@dataclass
class LabNode:
    """One node: a network namespace with one NIC plugged into the lab's bridge."""

    index: int
    name: str            # node name for agents and the collector: "node<I>"
    netns: str           # network namespace name (`ip netns exec <netns> ...`)
    ifname: str          # the node's NIC, inside the netns
    port: str            # its switch port: the bridge-side veth, in the root namespace
    address: str         # the NIC's IPv4 address, no prefix
    mac: str             # the NIC's MAC
    port_mac: str        # the switch port's MAC
    dir: str             # per-node state directory (train.log)
    markers_dir: str     # FABRICSCOPE_MARKERS_DIR for training processes on this node

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Lab:
    """A lab as recorded in its state file (see lab/__init__.py for the JSON)."""

    name: str
    bridge: str
    gateway: str
    subnet: str
    prefixlen: int
    link_rate_bps: int | None
    nodes: list[LabNode]
    nft_table: str = ""
    dir: str = ""
    link_shaped: bool = False          # link rate applied as TBF (else recorded only)
    wire_frames: bool = False          # gso_max_segs 1 on every veth (see up())
    faults: dict[int, dict] = field(default_factory=dict)   # node index -> {"loss":..,"shape":..}
    created: float = 0.0
    # the process whose `running_lab` block owns the lab (0: `lab up`, kept until
    # `lab down`): a lab whose owner died without tearing it down is an orphan
    owner_pid: int = 0

    def node(self, index) -> LabNode:
        if isinstance(index, bool) or not isinstance(index, int) \
                or not 0 <= index < len(self.nodes):
            raise UserError(f"lab {self.name!r} has no node {index!r}",
                            f"give a node index between 0 and {len(self.nodes) - 1}")
        return self.nodes[index]

    @property
    def world_size(self) -> int:
        return len(self.nodes)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["faults"] = {str(k): v for k, v in sorted(self.faults.items())}
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Lab":
        data = dict(data)
        data["nodes"] = [LabNode(**n) for n in data["nodes"]]
        data["faults"] = {int(k): v for k, v in (data.get("faults") or {}).items()}
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self) -> None:
        os.makedirs(naming.state_dir(), exist_ok=True)
        path = naming.state_file(self.name)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as fh:
            json.dump(self.to_dict(), fh, indent=1)
            fh.write("\n")
        os.replace(tmp, path)


def plan(name: str, nodes: int, subnet, link_rate_bps: int | None = None) -> Lab:
    """The Lab that `up` would build on `subnet` (pure: touches nothing)."""
    naming.check_name(name)
    naming.check_nodes(nodes)
    net = ipaddress.ip_network(subnet)
    members = [LabNode(index=i, name=naming.node_name(name, i), netns=naming.netns_name(name, i),
                       ifname=naming.node_ifname(name, i), port=naming.port_name(name, i),
                       address=naming.node_address(net, i), mac=naming.mac(name, i, "node"),
                       port_mac=naming.mac(name, i, "port"), dir=naming.node_dir(name, i),
                       markers_dir=naming.markers_dir(name, i))
               for i in range(nodes)]
    return Lab(name=name, bridge=naming.bridge_name(name), gateway=naming.gateway_address(net),
               subnet=str(net), prefixlen=net.prefixlen, link_rate_bps=link_rate_bps,
               nodes=members, nft_table=naming.nft_table(name), dir=naming.lab_dir(name))


def require_root(what: str = "lab commands") -> None:
    if os.geteuid() != 0:
        raise UserError(f"{what} needs root (network namespaces, links, nftables)",
                        "run as root, e.g. sudo fabricscope lab ...")


@contextlib.contextmanager
def state_lock():
    """Exclusive lock over all labs' state on this host."""
    os.makedirs(naming.state_dir(), exist_ok=True)
    with open(os.path.join(naming.state_dir(), ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def load(name: str) -> Lab:
    """The lab `name` from its state file; UserError when there is none."""
    naming.check_name(name)
    try:
        with open(naming.state_file(name)) as fh:
            return Lab.from_dict(json.load(fh))
    except FileNotFoundError:
        raise UserError(f"no lab named {name!r}",
                        f"create it with `fabricscope lab up --name {name} --nodes N` "
                        "or see `fabricscope lab list`") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"state file {naming.state_file(name)} is damaged ({exc})",
                        f"remove the lab with `fabricscope lab down --name {name}`") from None


def list_labs() -> list[Lab]:
    """Every lab with a state file, sorted by name (damaged state files are skipped)."""
    out = []
    try:
        entries = sorted(os.listdir(naming.state_dir()))
    except FileNotFoundError:
        return []
    for entry in entries:
        if entry.endswith(".json") and naming.NAME_RE.match(entry[:-5]):
            try:
                out.append(load(entry[:-5]))
            except UserError:
                log.warning("skipping damaged lab state %s", entry)
    return out


def down_orphans() -> list[str]:
    """Remove the labs whose owning process is gone (it died where no teardown runs:
    killed by SIGKILL, or exited from C, as LLVM does on a BPF program it cannot
    build); labs made by `lab up` have no owner and stay. Returns their names."""
    from fabricscope.services import pid_alive
    gone = [lab.name for lab in list_labs() if lab.owner_pid and not pid_alive(lab.owner_pid)]
    for name in gone:
        log.warning("removing lab %s: the process that made it (pid %d) is gone", name,
                    load(name).owner_pid)
        down(name)
    return gone


def _host_networks(ipr) -> list[str]:
    """IPv4 networks the root namespace has an address or a route in (not to reuse)."""
    nets = [f"{m.get_attr('IFA_ADDRESS')}/{m['prefixlen']}" for m in ipr.get_addr(family=2)]
    for msg in ipr.get_routes(family=2, table=254):
        dst = msg.get_attr("RTA_DST")
        if dst:
            nets.append(f"{dst}/{msg['dst_len']}")
    return nets


def up(name: str, nodes: int, link_rate=None, shape_links: bool = True,
       wire_frames: bool = False, owner_pid: int = 0) -> Lab:
    """Create lab `name` with `nodes` nodes (clearing a stale lab of that name first).

    link_rate: '1gbit', bit/s as int, or None. It is recorded as the nodes' link
    speed and, with shape_links (default), applied as TBF on both ends of every
    link (switch port egress and node NIC egress). wire_frames: one TCP segment
    per skb on every veth (gso_max_segs 1), so loss and shaping act per wire frame
    as on a real switch; costs about 10x the CPU per byte. Returns the Lab."""
    from pyroute2 import IPRoute, NetlinkError

    naming.check_name(name)
    naming.check_nodes(nodes)
    rate = parse_rate(link_rate) if link_rate is not None else None
    link_tbf = tc.tbf_params(rate) if (rate is not None and shape_links) else None
    require_root("`lab up`")
    with state_lock():
        for other in list_labs():
            if other.name != name and naming.lab_hash(other.name) == naming.lab_hash(name):
                raise UserError(f"lab name {name!r} hashes like existing lab {other.name!r}",
                                "pick another name")
        _teardown(name)
        with IPRoute() as ipr:
            used = [lab.subnet for lab in list_labs()] + _host_networks(ipr)
        lab = plan(name, nodes, naming.allocate_subnet(used), rate)
        lab.link_shaped = link_tbf is not None
        lab.wire_frames = bool(wire_frames)
        lab.created = time.time()
        lab.owner_pid = owner_pid
        lab.save()                  # first, so a failed `up` is torn down like any lab
        try:
            _build(lab, link_tbf)
        except BaseException as exc:
            _teardown(name)
            if isinstance(exc, NetlinkError):
                raise RuntimeError(f"lab up {name!r} failed: netlink error {exc.code} "
                                   f"({os.strerror(exc.code)})") from exc
            raise
        lab.save()
        return lab


def _build(lab: Lab, link_tbf: dict | None) -> None:
    from pyroute2 import IPRoute

    for node in lab.nodes:
        os.makedirs(node.markers_dir, exist_ok=True)
    with IPRoute() as ipr:
        ipr.link("add", ifname=lab.bridge, kind="bridge", address=naming.mac(lab.name, 0, "bridge"),
                 br_stp_state=0, br_forward_delay=0, br_mcast_snooping=0)
        br = ipr.link_lookup(ifname=lab.bridge)[0]
        nsops.set_sysctl(f"/proc/sys/net/ipv6/conf/{lab.bridge}/disable_ipv6", "1")
        ipr.addr("add", index=br, address=lab.gateway, prefixlen=lab.prefixlen)
        ipr.link("set", index=br, state="up")
        for node in lab.nodes:
            _add_node(ipr, lab, node, br, link_tbf)
    nft.run(nft.create_table_script(lab.nft_table, [n.port for n in lab.nodes]))


def _add_node(ipr, lab: Lab, node: LabNode, bridge_index: int, link_tbf: dict | None) -> None:
    from pyroute2 import IPRoute, netns

    netns.create(node.netns)
    nsops.ns_sysctl(node.netns, NO_IPV6)      # before the NIC arrives: it inherits "default"
    # wire_frames: gso_max_segs 1 hands the veths one wire-sized frame per skb, so nft
    # loss and TBF act per frame instead of per GSO burst of up to 64 KB.
    gso = {"gso_max_segs": 1} if lab.wire_frames else {}
    ipr.link("add", ifname=node.port, kind="veth", address=node.port_mac,
             peer={"ifname": node.ifname, "address": node.mac, **gso}, **gso)
    port, nic = ipr.link_lookup(ifname=node.port)[0], ipr.link_lookup(ifname=node.ifname)[0]
    # RPS keeps each flow on one CPU's backlog: veth hands frames to the backlog of
    # whichever CPU the sender runs on, and a sender migrating between CPUs would
    # reorder its own flow (hundreds of spurious fast retransmits per DDP step).
    # Set while both ends are in the root namespace's sysfs; it survives the move.
    mask = naming.cpu_mask(os.cpu_count() or 1)
    for dev in (node.port, node.ifname):
        nsops.set_sysctl(f"/sys/class/net/{dev}/queues/rx-0/rps_cpus", mask)
    nsops.set_sysctl(f"/proc/sys/net/ipv6/conf/{node.port}/disable_ipv6", "1")
    ipr.link("set", index=nic, net_ns_fd=node.netns)
    ipr.link("set", index=port, master=bridge_index, state="up")
    if link_tbf:
        tc.set_tbf(ipr, port, link_tbf)
    with IPRoute(netns=node.netns) as ns:
        nic = ns.link_lookup(ifname=node.ifname)[0]
        ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
        ns.addr("add", index=nic, address=node.address, prefixlen=lab.prefixlen)
        ns.link("set", index=nic, state="up")
        if link_tbf:
            tc.set_tbf(ns, nic, link_tbf)


def down(name: str) -> bool:
    """Remove lab `name` entirely; idempotent. True when anything was there.

    Also ends processes still running inside the lab's namespaces (SIGTERM, then
    SIGKILL after 3 s): they would keep the namespaces and links alive."""
    naming.check_name(name)
    require_root("`lab down`")
    with state_lock():
        return _teardown(name)


def down_all() -> list[str]:
    """Remove every lab with a state file, then orphaned fabricscope netns, links,
    nft tables and lab directories (matched by strict name patterns). Returns the
    names of the labs removed."""
    from pyroute2 import IPRoute

    require_root("`lab down --all`")
    with state_lock():
        removed = []
        for lab in list_labs():
            _teardown(lab.name)
            removed.append(lab.name)
        orphans = [n for n in nsops.netns_names() if naming.NETNS_RE.match(n)]
        nsops.end_processes(orphans)
        with IPRoute() as ipr:
            links = [m.get_attr("IFLA_IFNAME") or "" for m in ipr.get_links()]
            # ports first (each takes its peer along), then bridges
            for ifname in sorted((n for n in links if naming.IFNAME_RE.match(n)),
                                 key=lambda n: n.endswith("br")):
                _del_link(ipr, ifname)
        for ns_name in orphans:
            nsops.remove_netns(ns_name)
        for family, table in nft.tables():
            if family == nft.FAMILY and naming.NFT_TABLE_RE.match(table):
                nft.delete_table(table)
        with contextlib.suppress(FileNotFoundError):
            for entry in os.listdir(naming.state_dir()):
                path = os.path.join(naming.state_dir(), entry)
                if os.path.isdir(path) and naming.NAME_RE.match(entry):
                    shutil.rmtree(path, ignore_errors=True)
    return removed


def _del_link(ipr, ifname: str) -> bool:
    from pyroute2 import NetlinkError
    idx = ipr.link_lookup(ifname=ifname)
    if not idx:
        return False
    try:
        ipr.link("del", index=idx[0])
    except NetlinkError as exc:
        if exc.code not in (errno.ENODEV, errno.ENOENT):
            raise
        return False
    return True


def _teardown(name: str) -> bool:
    """Remove everything lab `name` may own, found by its derived names (so a lab
    whose state file is lost goes too). True when anything was there."""
    from pyroute2 import IPRoute

    h, prefix = naming.lab_hash(name), f"fs-{name}-n"
    ns_names = [n for n in nsops.netns_names()
                if n.startswith(prefix) and n[len(prefix):].isdigit()]
    found = False
    nsops.end_processes(ns_names)
    with IPRoute() as ipr:
        for msg in ipr.get_links():
            ifname = msg.get_attr("IFLA_IFNAME") or ""
            if ifname.startswith(f"fs{h}p") and ifname[len(f"fs{h}p"):].isdigit():
                found |= _del_link(ipr, ifname)    # deleting the port deletes its peer too
        for ns_name in ns_names:
            found |= nsops.remove_netns(ns_name)
        found |= _del_link(ipr, naming.bridge_name(name))
    found |= nft.delete_table(naming.nft_table(name))
    if os.path.isdir(naming.lab_dir(name)):
        shutil.rmtree(naming.lab_dir(name), ignore_errors=True)
        found = True
    with contextlib.suppress(FileNotFoundError):
        os.unlink(naming.state_file(name))
        found = True
    return found
