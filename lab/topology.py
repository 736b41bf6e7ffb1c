"""Create, load and remove labs: N network namespaces on one or K Linux bridges.

One ToR (default), as `lab up --nodes N`:

    root namespace                                     node I (netns fs-<name>-n<I>)
    bridge fs<h6>br 198.18.K.254/24 -- port fs<h6>p<I> == veth == fs<h6>n<I> 198.18.K.(I+1)/24

Leaf-spine, `lab up --nodes N --tors K` (K > 1):

    spine fs<h6>sp 198.18.K.254/24 -- us<K> == uplink veth == ut<K> -- ToR bridge fs<h6>t<K>
        ToR K bridge -- port fs<h6>p<I> == veth == node I, for the nodes of ToR K

A bridge is a switch (STP off: one L2 subnet shaped as a tree has no loop; no
forwarding delay: ports forward as soon as they are up, like edge ports). Nodes
hang off the ToRs in contiguous blocks (fabricscope.lab.naming.tor_blocks). The gateway
address is on the bridge above every node (the only ToR, else the spine), so the
root namespace (collector, InfluxDB, the data server) sits behind the spine and
reaches every node, and cross-ToR traffic crosses two uplinks. Nodes get no
default route: lab traffic cannot leave the subnet. The lab is IPv4 only: IPv6
is disabled on the bridges, ports, uplinks and in the nodes, so no DAD/MLD
chatter shows up in the agents' counters. RPS on every veth keeps each flow in
order. With a shaped link rate, TBF sits on both ends of every link, uplinks too.

By default the veths pass GSO skbs (up to 64 KB) as a host hands them to a NIC
doing TSO, so a loss rule drops whole GSO bursts: 2 % loss is 2 % of skbs, about
2 % of bytes, but in bursts. `wire_frames` limits every veth (uplinks too) to
one segment per skb: loss and TBF then act per wire frame, as on a real switch,
at ~10x the CPU.

`lab up` also writes <lab dir>/topology.yaml (node -> ToR, the format production
generates from node labels; fabricscope/topology.py reads it) and makes one CPU
cgroup per node (fabricscope.lab.cgroups) for the CPU fault. Teardown removes all of it,
found by the lab's derived names, so it also works without the state file.

State lives in $FABRICSCOPE_LAB_DIR/<name>.json (default /run/fabricscope/labs);
every change holds an exclusive flock on $FABRICSCOPE_LAB_DIR/.lock, so
concurrent `lab up`s pick distinct subnets.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import time

from fabricscope.errors import UserError
from fabricscope.topology import write_topology
from fabricscope.lab import cgroups, links, naming, nft, nsops, tc
from fabricscope.lab.model import Lab, LabNode, LabTor, plan
from fabricscope.lab.units import parse_rate

log = logging.getLogger(__name__)

NO_IPV6 = {"net/ipv6/conf/all/disable_ipv6": "1", "net/ipv6/conf/default/disable_ipv6": "1"}


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
       wire_frames: bool = False, owner_pid: int = 0, tors: int = 1) -> Lab:
    """Create lab `name` with `nodes` nodes (clearing a stale lab of that name first).

    link_rate: '1gbit', bit/s as int, or None. It is recorded as the nodes' link
    speed and, with shape_links (default), applied as TBF on both ends of every
    link (switch port egress and node NIC egress, both ends of every uplink).
    wire_frames: one TCP segment per skb on every veth (gso_max_segs 1), so loss
    and shaping act per wire frame as on a real switch; costs about 10x the CPU
    per byte. tors: 1 (one bridge) or K leaf bridges under a spine. Returns the Lab."""
    from pyroute2 import IPRoute, NetlinkError

    naming.check_name(name)
    naming.check_nodes(nodes)
    naming.check_tors(tors, nodes)
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
        lab = plan(name, nodes, naming.allocate_subnet(used), rate, tors=tors)
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
        bridges = {}
        for tor in lab.tors:
            mac = (naming.mac(lab.name, tor.index, "tor") if lab.spine
                   else naming.mac(lab.name, 0, "bridge"))
            bridges[tor.name] = links.add_bridge(ipr, tor.bridge, mac)
        if lab.spine:
            spine = links.add_bridge(ipr, lab.spine, naming.mac(lab.name, 0, "bridge"))
            for tor in lab.tors:
                _add_uplink(ipr, lab, tor, bridges[tor.name], spine, link_tbf)
        ipr.addr("add", index=ipr.link_lookup(ifname=lab.bridge)[0], address=lab.gateway,
                 prefixlen=lab.prefixlen)
        for node in lab.nodes:
            _add_node(ipr, lab, node, bridges[node.tor], link_tbf)
    nft.run(nft.create_table_script(lab.nft_table, [n.port for n in lab.nodes],
                                    [(t.name, t.uplink, t.spine_port) for t in lab.tors
                                     if t.uplink]))
    write_topology(lab.topology(), lab.topology_path)
    for node, path in zip(lab.nodes, cgroups.create(lab.name, len(lab.nodes))):
        node.cgroup = path
    if any(node.cgroup for node in lab.nodes):
        cgroups.expose(lab.name)


def _add_uplink(ipr, lab: Lab, tor: LabTor, tor_bridge: int, spine_bridge: int,
                link_tbf: dict | None) -> None:
    """ToR `tor`'s uplink: a veth from its bridge (end tor.uplink) to the spine's
    (end tor.spine_port), configured like a switch port."""
    tor_end, spine_end = links.add_veth(
        ipr, tor.uplink, naming.mac(lab.name, tor.index, "uplink"),
        tor.spine_port, naming.mac(lab.name, tor.index, "uplink_peer"), lab.wire_frames)
    links.disable_ipv6(tor.spine_port)
    links.plug(ipr, tor_end, tor_bridge)
    links.plug(ipr, spine_end, spine_bridge)
    if link_tbf:
        tc.set_tbf(ipr, tor_end, link_tbf)
        tc.set_tbf(ipr, spine_end, link_tbf)


def _add_node(ipr, lab: Lab, node: LabNode, bridge_index: int, link_tbf: dict | None) -> None:
    from pyroute2 import IPRoute, netns

    netns.create(node.netns)
    nsops.ns_sysctl(node.netns, NO_IPV6)      # before the NIC arrives: it inherits "default"
    port, nic = links.add_veth(ipr, node.port, node.port_mac, node.ifname, node.mac,
                               lab.wire_frames)
    ipr.link("set", index=nic, net_ns_fd=node.netns)
    links.plug(ipr, port, bridge_index)
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

    Also ends processes still running inside the lab's namespaces or its nodes'
    cgroups (SIGTERM, then SIGKILL after 3 s): they would keep the namespaces,
    links and cgroups alive."""
    naming.check_name(name)
    require_root("`lab down`")
    with state_lock():
        return _teardown(name)


def down_all() -> list[str]:
    """Remove every lab with a state file, then orphaned fabricscope netns, links,
    cgroups, nft tables and lab directories (matched by strict name patterns).
    Returns the names of the labs removed."""
    from pyroute2 import IPRoute

    require_root("`lab down --all`")
    with state_lock():
        removed = []
        for lab in list_labs():
            _teardown(lab.name)
            removed.append(lab.name)
        orphans = [n for n in nsops.netns_names() if naming.NETNS_RE.match(n)]
        orphan_cgroups = [n for n in cgroups.lab_names() if naming.NAME_RE.match(n)]
        nsops.end_pids(nsops.netns_pids(orphans)
                       + [p for n in orphan_cgroups for p in cgroups.lab_pids(n)],
                       "orphaned lab namespaces and cgroups")
        with IPRoute() as ipr:
            links.delete_in_order(ipr, [n for n in _link_names(ipr) if naming.IFNAME_RE.match(n)])
        for ns_name in orphans:
            nsops.remove_netns(ns_name)
        for lab_name in orphan_cgroups:
            cgroups.remove(lab_name)
        for family, table in nft.tables():
            if family == nft.FAMILY and naming.NFT_TABLE_RE.match(table):
                nft.delete_table(table)
        with contextlib.suppress(FileNotFoundError):
            for entry in os.listdir(naming.state_dir()):
                path = os.path.join(naming.state_dir(), entry)
                if os.path.isdir(path) and naming.NAME_RE.match(entry):
                    shutil.rmtree(path, ignore_errors=True)
    return removed


def _link_names(ipr) -> list[str]:
    return [m.get_attr("IFLA_IFNAME") or "" for m in ipr.get_links()]


def _teardown(name: str) -> bool:
    """Remove everything lab `name` may own, found by its derived names (so a lab
    whose state file is lost goes too). True when anything was there."""
    from pyroute2 import IPRoute

    h, prefix = naming.lab_hash(name), f"fs-{name}-n"
    ns_names = [n for n in nsops.netns_names()
                if n.startswith(prefix) and n[len(prefix):].isdigit()]
    nsops.end_pids(nsops.netns_pids(ns_names) + cgroups.lab_pids(name), f"lab {name}")
    with IPRoute() as ipr:
        found = links.delete_in_order(ipr, [n for n in _link_names(ipr)
                                            if n.startswith(f"fs{h}") and naming.IFNAME_RE.match(n)])
        for ns_name in ns_names:
            found |= nsops.remove_netns(ns_name)
    found |= cgroups.remove(name)
    found |= nft.delete_table(naming.nft_table(name))
    if os.path.isdir(naming.lab_dir(name)):
        shutil.rmtree(naming.lab_dir(name), ignore_errors=True)
        found = True
    with contextlib.suppress(FileNotFoundError):
        os.unlink(naming.state_file(name))
        found = True
    return found


__all__ = ["Lab", "LabNode", "LabTor", "down", "down_all", "down_orphans", "list_labs", "load",
           "plan", "require_root", "state_lock", "up"]
