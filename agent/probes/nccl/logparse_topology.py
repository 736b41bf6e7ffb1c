"""Topology and communicator lines of NCCL_DEBUG=INFO into facts.

Format strings by release (NVIDIA/nccl):
- transport/{net,p2p,shm}.cc: "Channel %02d : %d[%lx] -> %d[%lx] [send] via NET/%s/%d..."
  up to 2.17 (the bracket is the GPU's PCI bus id, hex); "Channel %02d/%d : %d[%d] ->
  %d[%d] ..." from 2.18 (the bracket is the NVML device). A bracket of four or more
  characters, or with a hex letter, is a bus id (a bus id is bus << 12 | device,
  so >= 0x1000 for any GPU); a shorter decimal one is a device.
- graph/rings.cc: "Channel %02d/%02d :" then " %d" per rank in ring order.
- init.cc: "Ring %02d : %d -> %d -> %d"; "Trees" then per channel " [%d] %d/%d/%d->%d->%d"
  (2.8+) or " [%d] %d/%d/%d->%d->%d|%d->%d->%d/%d/%d" (2.7, up tree | down tree).
- graph/connect.cc: "Tree %d : %d -> %d -> %d/%d/%d" (up -> rank -> down).
- init.cc: "comm %p rank %d nranks %d cudaDev %d [nvmlDev %d] busId %lx [commId 0x%llx]
  - Init START|COMPLETE" (nvmlDev, commId from 2.18; split children print parent,
  childCount, color, key), "... - Destroy|Abort COMPLETE", and (2.19+) "comm %p rank
  %d nRanks %d nNodes %d localRanks %d localRank %d MNNVL %d".
- enqueue.cc: "%s: opCount %lx sendbuff %p recvbuff %p count %zu datatype %d op %d
  root %d comm %p [nranks=%d] stream %p".
"""

from __future__ import annotations

import re

from fabricscope.agent.probes.nccl.logparse_facts import (
    Channel, Coll, Comm, CommEvent, CommShape, Direction, Ring, RingOrder, Tree, TreeHalf)
from fabricscope.agent.probes.nccl.logparse_prefix import Garbled, to_int, to_u64

_CHANNEL = re.compile(
    r"^Channel (?P<ch>\d+)(?:/(?P<conn>\d+))? : (?P<sr>\d+)\[(?P<sd>-?[0-9a-fA-F]+)\] -> "
    r"(?P<dr>\d+)\[(?P<dd>-?[0-9a-fA-F]+)\](?: \[(?P<dir>send|receive)\])? via (?P<via>\S.*)$")
_NET_VIA = re.compile(r"^NET/(?P<net>.+?)/(?P<dev>\d+)(?:\((?P<proxy>\d+)\))?(?P<flags>(?:/\w+)*)$")
_RING_ORDER = re.compile(
    r"^Channel (?P<ch>\d+)/(?P<n>\d+) :(?P<order>(?: +\d+)+)(?P<more> *\.\.\.)?$")
_RING = re.compile(r"^Ring (?P<ch>\d+) : (?P<prev>-?\d+) -> (?P<rank>\d+) -> (?P<next>-?\d+)$")
_TREE = re.compile(r"^Tree (?P<ch>\d+) : (?P<up>-?\d+) -> (?P<rank>\d+) -> "
                   r"(?P<d0>-?\d+)/(?P<d1>-?\d+)/(?P<d2>-?\d+)$")
_TREES_ITEM = re.compile(
    r" \[(?P<ch>\d+)\] (?P<d0>-?\d+)/(?P<d1>-?\d+)/(?P<d2>-?\d+)->(?P<rank>\d+)->(?P<up>-?\d+)"
    r"(?:\|(?P<dup>-?\d+)->(?P<drank>\d+)->(?P<e0>-?\d+)/(?P<e1>-?\d+)/(?P<e2>-?\d+))?")
_COMM = re.compile(
    r"^(?:\[Rank \d+\] )?(?:(?P<func>nccl\w+) )?comm (?P<comm>\S+) rank (?P<rank>\d+) "
    r"nranks (?P<nranks>\d+) cudaDev (?P<cd>-?\d+) (?:nvmlDev (?P<nd>-?\d+) )?"
    r"busId (?P<bus>[0-9a-fA-F]+)(?: parent (?P<parent>\S+)(?: (?:splitCount|childCount) \d+)?"
    r" color (?P<color>-?\d+) key (?P<key>-?\d+))?(?: commId 0x(?P<cid>[0-9a-fA-F]+))?"
    r" ?- (?P<what>Init START|Init COMPLETE|Destroy COMPLETE|Abort COMPLETE)$")
_COMM_SHAPE = re.compile(
    r"^comm (?P<comm>\S+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+) "
    r"localRanks (?P<lranks>\d+) localRank (?P<lrank>\d+) MNNVL (?P<mnnvl>-?\d+)$")
_COLL = re.compile(
    r"^(?P<op>\w+): opCount (?P<opc>[0-9a-f]+) sendbuff (?P<sb>\S+) recvbuff (?P<rb>\S+) "
    r"count (?P<count>\d+) datatype (?P<dt>-?\d+) op (?P<redop>-?\d+) root (?P<root>-?\d+) "
    r"comm (?P<comm>\S+)(?: \[nranks=(?P<nranks>\d+)\])? stream (?P<stream>\S+)$")

COMM_EVENTS = {"Init START": CommEvent.INIT_START, "Init COMPLETE": CommEvent.INIT_COMPLETE,
               "Destroy COMPLETE": CommEvent.DESTROY_COMPLETE,
               "Abort COMPLETE": CommEvent.ABORT_COMPLETE}


def ptr(text: str) -> str:
    """%p as glibc prints it: 0x... or (nil)."""
    return "0x0" if text == "(nil)" else text


def _dev_or_bus(text: str) -> tuple[int | None, str | None]:
    if len(text.lstrip("-")) >= 4 or re.search(r"[a-fA-F]", text):
        return None, text.lower()
    return to_int(text), None


def _transport(via: str) -> str:
    """NET, P2P, SHM, ...: the first part of the path (2.7-2.8 SHM printed prose)."""
    return "SHM" if via.startswith("direct shared memory") else via.split("/", 1)[0]


def channel(msg: str) -> list | None:
    """Channel connection or ring-order facts; None when the line is neither."""
    if m := _CHANNEL.match(msg):
        sd, sbus = _dev_or_bus(m.group("sd"))
        dd, dbus = _dev_or_bus(m.group("dd"))
        via = m.group("via").strip()
        extra: dict = {}
        if net := _NET_VIA.match(via):
            flags = net.group("flags").split("/")
            extra = {"net": net.group("net"), "net_dev": to_int(net.group("dev")),
                     "proxy_rank": to_int(net.group("proxy")) if net.group("proxy") else None,
                     "gdrdma": "GDRDMA" in flags, "shared": "Shared" in flags}
        return [Channel(to_int(m.group("ch")), to_int(m.group("conn")) if m.group("conn") else None,
                        to_int(m.group("sr")), to_int(m.group("dr")), sd, dd, sbus, dbus,
                        Direction(m.group("dir") or "-"), _transport(via), via, **extra)]
    if m := _RING_ORDER.match(msg):
        return [RingOrder(to_int(m.group("ch")), to_int(m.group("n")),
                          tuple(to_int(r) for r in m.group("order").split()),
                          m.group("more") is not None)]
    return None


def ring(msg: str) -> list | None:
    m = _RING.match(msg)
    if not m:
        return None
    return [Ring(to_int(m.group("ch")), to_int(m.group("prev")), to_int(m.group("rank")),
                 to_int(m.group("next")))]


def tree(msg: str) -> list | None:
    m = _TREE.match(msg)
    if not m:
        return None
    return [Tree(to_int(m.group("ch")), TreeHalf.BOTH, to_int(m.group("up")),
                 to_int(m.group("rank")), _three(m, "d"))]


def _three(m: re.Match, prefix: str) -> tuple[int, int, int]:
    return (to_int(m.group(prefix + "0")), to_int(m.group(prefix + "1")),
            to_int(m.group(prefix + "2")))


def trees(msg: str) -> list:
    """Every channel's tree of a "Trees" line; Garbled unless the whole line is read."""
    rest, out = msg[len("Trees"):], []
    for m in _TREES_ITEM.finditer(rest):
        ch, rank = to_int(m.group("ch")), to_int(m.group("rank"))
        if m.group("dup") is None:
            out.append(Tree(ch, TreeHalf.BOTH, to_int(m.group("up")), rank, _three(m, "d")))
        else:
            out.append(Tree(ch, TreeHalf.UP, to_int(m.group("up")), rank, _three(m, "d")))
            out.append(Tree(ch, TreeHalf.DOWN, to_int(m.group("dup")), to_int(m.group("drank")),
                            _three(m, "e")))
    if _TREES_ITEM.sub("", rest).strip():
        raise Garbled("Trees line with text that is no tree")
    return out


def comm(msg: str) -> list | None:
    """Comm facts, None for other lines; Garbled for a comm line that does not read."""
    if m := _COMM_SHAPE.match(msg):
        return [CommShape(ptr(m.group("comm")), *(to_int(m.group(g)) for g in (
            "rank", "nranks", "nnodes", "lranks", "lrank", "mnnvl")))]
    if not msg.endswith(tuple(COMM_EVENTS)) or "comm " not in msg:
        return None
    m = _COMM.match(msg)
    if not m:
        raise Garbled("comm line")
    opt = {"nvml_dev": to_int(m.group("nd")) if m.group("nd") else None,
           "comm_id": to_u64(m.group("cid")) if m.group("cid") else None,
           "func": m.group("func")}
    if m.group("parent"):
        opt.update(parent=ptr(m.group("parent")), color=to_int(m.group("color")),
                   key=to_int(m.group("key")))
    return [Comm(COMM_EVENTS[m.group("what")], ptr(m.group("comm")), to_int(m.group("rank")),
                 to_int(m.group("nranks")), to_int(m.group("cd")), m.group("bus").lower(), **opt)]


def coll(msg: str) -> list | None:
    if not re.match(r"^\w+: opCount ", msg):
        return None
    m = _COLL.match(msg)
    if not m:
        raise Garbled("collective line")
    return [Coll(m.group("op"), to_int(m.group("opc"), 16), ptr(m.group("sb")), ptr(m.group("rb")),
                 to_int(m.group("count")), to_int(m.group("dt")), to_int(m.group("redop")),
                 to_int(m.group("root")), ptr(m.group("comm")),
                 to_int(m.group("nranks")) if m.group("nranks") else None, ptr(m.group("stream")))]
