"""Where a network fault sits: binary tomography over the job's connection matrix.

A cell is one node's flows to one peer (diagnosis/evidence.py). Each directed
transfer src -> dst crosses elements of the fabric: src's port (out), the
uplink of src's ToR (up) and the downlink of dst's ToR (down) when the two ToRs
differ, and dst's port (in). A *lossy* cell implicates the elements of its data
path; a *delayed* one (RTT inflated) those of its data path and of its ACKs'
path back, because a standing queue in either direction lengthens the RTT.

A place is a node's port (both directions) or a ToR's uplink (both). A place
explains a bad cell when one of its elements lies on the cell's implicated paths
(a cell both lossy and delayed: its data path, where one element explains both);
clean cells that carried data through the elements a place's bad cells implicate
count against it, unless its loss comes with a queue (`_queue`). The place that
explains the most lossy cells wins, then the one that explains most of the loss
of the last seconds (lossy cells this window lacks), then, for a queue, one that
can hold it (`_may_queue`: not a node's port its lossy cells only leave through,
where the queue would be the node's own NIC's), then, for a queue, a place whose
element in front of a node (its port, its ToR's downlink) paces what the node
receives through it (detect_network.port_rates: a narrowed link caps all that
crosses it, a queue upstream does not), then one not shown to pass traffic at
full rate (one whose every such element lets the nodes behind it receive at
their usual peak needs converging senders to overflow, which the ring's one hop
into a node is not), then the most bad cells,
then the one fewer clean cells contradict, then the place already named by an
open finding: a dropped frame died on its own data path, while a delay lies on
either direction's path or in a busy host that answers late, so loss places a
fault first and delay only among places the loss cannot tell apart; remaining
ties go to the place where such a fault can physically sit (`_plausible_side`: a
queue at a switch egress toward the receiver, a drop on the cable the frames
leave through; a ToR's uplink queues its rack's outgoing traffic), then to a
node's port for a drop at random and to a ToR's uplink for a queue. Several
faults are found greedily: the best place takes its cells and the recent loss
it explains (a frame died at one place), the rest are explained again. This is
how a bad row or column of the matrix points to a node and a block crossing
two ToRs to an uplink; with two ToRs, tor0's uplink and tor1's downlink lie in
series on every cross path, and the sending ToR is named (documented in
docs/DIAGNOSIS.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fabricscope.diagnosis.evidence import CellTotals


@dataclass(frozen=True)
class Place:
    kind: str             # "node" or "tor"
    name: str

    def as_dict(self) -> dict:
        if self.kind == "tor":
            return {"tor": self.name, "interface": "uplink"}
        if self.kind == "peer":
            return {"peer": self.name}
        return {"node": self.name}


@dataclass
class BadCell:
    cell: CellTotals
    lossy: bool
    delayed: bool
    timed: bool = True        # its delay was judged (a floor and RTT samples): see _cause
    #: its loss was seen by the node receiving from a peer outside the job (holes in
    #: what it received): the frames died on their way from the peer into the node
    inbound: bool = False

    @property
    def src(self) -> str | None:
        return None if self.inbound else self.cell.key.node

    @property
    def dst(self) -> str | None:
        return self.cell.key.node if self.inbound else self.cell.peer_node


@dataclass(frozen=True)
class Hops:
    """The fabric elements each bad hop of a place implicates (`implicated`), and
    those of its lossy hops apart. A dropped frame died on its own data path, while
    a delay may be a busy host's that answers late; so where a place has lossy hops,
    they are its evidence (`evidence`), and its delayed-only ones count only for a
    place named on delay alone."""

    all: frozenset = frozenset()
    lossy: frozenset = frozenset()

    def __or__(self, other: "Hops") -> "Hops":
        return Hops(self.all | other.all, self.lossy | other.lossy)

    @property
    def evidence(self) -> frozenset:
        return self.lossy or self.all


@dataclass
class Located:
    place: Place
    cells: list[BadCell]                      # the bad cells it explains
    contradicting: list[CellTotals] = field(default_factory=list)
    alternatives: list[Place] = field(default_factory=list)   # places that tied with it
    #: the elements each bad cell it explains implicates, this window's and the recent
    #: loss' (by which the engine tells when one place explains all of another's hops)
    hops: Hops = Hops()


@dataclass(frozen=True)
class PortRates:
    """Fabric elements (path's (kind, name): a node's port toward it `in`, a ToR's
    downlink `down`) judged by the NIC peaks of the nodes they feed
    (detect_network.port_rates). `narrowed`: the node behind a port, or two nodes or
    more behind a downlink and no other, received at most narrowed_share of its
    usual peak (the element paces all that crosses it); `kept`: a node behind it
    received at least kept_share of its usual peak in every second judged (the
    element passes traffic at full rate, so a queue there needs senders converging
    on it, not a narrowed link). Elements with no witness traffic are in neither."""

    narrowed: frozenset = frozenset()
    kept: frozenset = frozenset()


def path(src: str, dst: str | None, tor_of, peer: str = "") -> set[tuple[str, str]]:
    """Elements a transfer src -> dst crosses: (kind, name) with kind out/up/down/in;
    to a peer outside the job (dst None: storage, the collector), src's port, its
    ToR's uplink (outside hosts sit behind the spine) and the peer itself (ext)."""
    out = {("out", src)}
    if dst is None:
        if tor_of(src) is not None:
            out.add(("up", tor_of(src)))
        if peer:
            out.add(("ext", peer))
        return out
    out.add(("in", dst))
    a, b = tor_of(src), tor_of(dst)
    if a is not None and b is not None and a != b:
        out |= {("up", a), ("down", b)}
    return out


def path_in(node: str, peer: str, tor_of) -> set[tuple[str, str]]:
    """Elements a transfer from a peer outside the job into `node` crosses (a read):
    the peer itself (ext), the downlink of node's ToR (outside hosts sit behind the
    spine) and node's port (in)."""
    tor = tor_of(node)
    return {("in", node), ("ext", peer)} | ({("down", tor)} if tor is not None else set())


_KIND_OF = {"out": "node", "in": "node", "up": "tor", "down": "tor", "ext": "peer"}


def elements(place: Place) -> set[tuple[str, str]]:
    if place.kind == "node":
        return {("out", place.name), ("in", place.name)}
    if place.kind == "peer":
        return {("ext", place.name)}
    return {("up", place.name), ("down", place.name)}


def implicated(bad: BadCell, tor_of) -> set[tuple[str, str]]:
    """A lossy cell's data path (frames die where they travel; one element there also
    explains its delay, if any); a delayed cell's data path and its ACKs' path back;
    an inbound lossy cell the way from its outside peer into its node."""
    if bad.inbound:
        return path_in(bad.cell.key.node, bad.cell.key.peer, tor_of)
    fwd = path(bad.src, bad.dst, tor_of, bad.cell.key.peer)
    if bad.delayed and not bad.lossy and bad.dst is not None:
        return fwd | path(bad.dst, bad.src, tor_of)
    return fwd


def candidates(bad: list[BadCell], tor_of) -> list[Place]:
    places: set[Place] = set()
    for b in bad:
        for kind, name in implicated(b, tor_of):
            places.add(Place(_KIND_OF[kind], name))
    return sorted(places, key=lambda p: (p.kind, p.name))


def locate(bad: list[BadCell], clean: list[CellTotals], tor_of, max_places: int = 3,
           prefer: frozenset = frozenset(), recent: list[BadCell] = (),
           rates: PortRates = PortRates()) -> tuple[list[Located], list[BadCell]]:
    """The places that explain the bad cells, greedily (at most max_places), and the
    cells none of them explains. The caller names causes only when the places
    explain enough of the bad cells (thresholds.place_explains). `prefer`: places
    already named (open findings) win ties, so that a window in which only part of
    a fault's hops show does not move the finding to a neighbour. `recent`: lossy
    cells of the last seconds that this window does not hold; they rank the places
    that explain this window's loss equally (the flow that tells a node's port from
    its ToR's uplink, another node's or a checkpoint's through the uplink, crosses
    it only now and then), and are explained by no place of their own. `rates`
    (PortRates): the elements in front of nodes that pace what
    crosses them (`narrowed`: a queue there is where its lossy hops meet it) and
    those that pass traffic at full rate (`kept`: no narrowed link to queue at)."""
    narrowed, kept = rates.narrowed, rates.kept
    remaining = list(bad)
    found: list[Located] = []
    clean_paths = [(c, path(c.key.node, c.peer_node, tor_of, c.key.peer)) for c in clean]
    recent_paths = [(b, frozenset(implicated(b, tor_of))) for b in recent]
    implicated_of = {id(b): frozenset(implicated(b, tor_of)) for b in bad}
    while remaining and len(found) < max_places:
        scored = []
        for place in candidates(remaining, tor_of):
            els = elements(place)
            mine = [b for b in remaining if implicated_of[id(b)] & els]
            queue = _queue(mine)
            # a clean cell contradicts the place where it crossed an element the bad
            # cells implicate: faults and queues are one-directional as often as not
            used = set().union(*(implicated_of[id(b)] & els for b in mine))
            against = [] if queue else \
                [c for c, elements_on_path in clean_paths if elements_on_path & used]
            before = [(b, p) for b, p in recent_paths if p & els]
            sides = sum(_plausible_side(place, b, tor_of) for b in mine + [b for b, _ in before])
            # the last guess: a drop at random at a node's port (there are many more
            # of them than uplinks), a queue at a ToR's uplink (where a rack's traffic
            # converges, oversubscribed; one sender cannot overfill a node's port)
            guess = place.kind == ("tor" if queue else "node")
            # a queue's loss places it only where a queue can sit (_may_queue): a busy
            # host's delayed hop into node0 must not win node0's port a queue whose
            # lossy hops only leave node0 (it took tor0's named uplink over so, replayed)
            holds = not queue or _may_queue(place, mine + [b for b, _ in before])
            # where the lossy hops could queue at the place: a port or downlink in
            # front of a node that receives far less than its usual peak paces all
            # that crosses it, so the queue is there, not upstream on the same hops
            # (a ToR's uplink); one through which nodes receive at their usual peak
            # is no narrowed link
            queued_at = {e for b in mine if b.lossy
                         for e in implicated_of[id(b)] & els if e[0] != "out"} \
                if queue else set()
            narrow = bool(queued_at & narrowed)
            full_rate = bool(queued_at) and queued_at <= kept
            lossy = sum(b.lossy for b in mine)
            # a queue delays all that crosses it, so every bad hop is its evidence; a
            # drop independent of load delays nothing, so a lossy place without a queue
            # is placed by its lossy hops alone (the ring's other hops, held back by the
            # lossy one, and busy hosts' hops run late without saying where frames die)
            support = len(mine) if queue or not lossy else lossy
            scored.append(((lossy, len(before), holds, support, narrow, not full_rate,
                            -len(against), place in prefer, sides, guess),
                           place, mine, against, before))
        scored.sort(key=lambda s: s[0], reverse=True)
        best_key, place, mine, against, before = scored[0]
        # the places that explain the hops as well and, for a queue, can hold it (a
        # queue on tor0's uplink, whose loss a checkpoint of node0's shared, waited
        # for node0's port to be told apart from it)
        queued = _queue(mine)
        ties = [s[1] for s in scored[1:] if s[0][:7] == best_key[:7]
                and (not queued or _may_queue(s[1], s[2] + [b for b, _ in s[4]]))]
        recent_hops = frozenset(p for _, p in before)        # lossy cells, all of them
        hops = Hops(frozenset(implicated_of[id(b)] for b in mine) | recent_hops,
                    frozenset(implicated_of[id(b)] for b in mine if b.lossy) | recent_hops)
        found.append(Located(place, mine, against, ties, hops))
        remaining = [b for b in remaining if b not in mine]
        # the recent loss the place explains is its evidence, not another place's: a
        # frame died at one place
        recent_paths = [(b, p) for b, p in recent_paths if not p & elements(place)]
    return found, remaining


def told_apart(a: Place, b: Place, nodes, tor_of, outside: list[CellTotals] = ()) -> bool:
    """Whether some transfer between the job's nodes crosses one place and not the
    other, or some of the job's traffic with peers outside it (`outside`: cells of the
    window to a peer that is no node of the job) does. Where none does (with two
    ToRs, one's uplink and the other's downlink lie in series on every path between
    the racks), nothing the job sends can tell the two apart."""
    ways = ways_between(nodes, tor_of)
    for c in outside:
        if c.bytes_acked:          # a write: out of the node, up its rack, to the peer
            ways.append(path(c.key.node, None, tor_of, c.key.peer))
        if c.bytes_received:       # a read: from the peer, down the rack, into the node
            ways.append(path_in(c.key.node, c.key.peer, tor_of))
    return crossed_apart(a, b, ways)


def ways_between(nodes, tor_of) -> list[set[tuple[str, str]]]:
    """The elements of every transfer between two of the nodes, each way."""
    return [path(src, dst, tor_of) for src in nodes for dst in nodes if src != dst]


def crossed_apart(a: Place, b: Place, ways) -> bool:
    """Whether some of the ways (element sets, as `path` gives) crosses one place and
    not the other."""
    ea, eb = elements(a), elements(b)
    return any(bool(on & ea) != bool(on & eb) for on in ways)


def _queue(cells: list[BadCell]) -> bool:
    """The loss comes with a queue: every lossy cell whose delay was judged is delayed.
    A queue overflows under the job's synchronized bursts and lets a lone flow
    through (another node's checkpoint between them), so clean cells through its
    place do not contradict it as they contradict a link that drops at random."""
    timed = [b for b in cells if b.lossy and b.timed]
    return bool(timed) and all(b.delayed for b in timed)


def _may_queue(place: Place, cells: list[BadCell]) -> bool:
    """Whether the queue whose overflow lost these cells' frames can sit at the place:
    not at a node's port whose lossy cells all leave the node. A switch queues at its
    egress, so at a node's port toward the node; a queue on the node's own way out is
    its NIC's, which its qdisc shows (nic_qdisc), not a switch buffer."""
    return place.kind != "node" or any(b.dst == place.name for b in cells if b.lossy)


def _plausible_side(place: Place, bad: BadCell, tor_of) -> int:
    """1 when the place sits where this kind of fault happens on the cell's path.

    Switches queue at their egress ports: toward the receiving node (its port's
    `in`) and onto the uplinks; a node's own `out` is its NIC, whose queue the
    agent sees (nic_qdisc), so a queue there is not a switch buffer. A frame that
    dies independent of load dies on the cable or optic it leaves through: the
    sender's port or the sending ToR's uplink."""
    if place.kind == "peer":
        return 1
    if bad.src is None:     # from outside the job: the way out of its peer is the peer's
        return 0
    if place.kind == "node":
        if bad.delayed:
            return int(bad.dst == place.name)
        return int(bad.src == place.name)
    if bad.lossy:           # dropped on the way out of the rack: the uplink's queue
        return int(tor_of(bad.src) == place.name)
    return int(tor_of(bad.src) == place.name or tor_of(bad.dst) == place.name)
