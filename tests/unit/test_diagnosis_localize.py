"""Binary tomography over a job's connection matrix (diagnosis/localize.py): the cases
its docstring names, on hand-built cells."""

from __future__ import annotations

import pytest

from fabricscope.diagnosis.localize import PortRates
from fabricscope.diagnosis.evidence import CellKey, CellTotals
from fabricscope.diagnosis.localize import (BadCell, Place, _plausible_side, candidates, locate, path,
                                told_apart)

STORAGE = "198.18.0.254:9000"
TWO_TORS = {"node0": "tor0", "node1": "tor0", "node2": "tor1", "node3": "tor1"}.get


def one_tor(node):
    return None


def cell(src: int, dst: int | str) -> CellTotals:
    """Node src's flows to node dst (an int) or to a peer outside the job (a str)."""
    peer = dst if isinstance(dst, str) else f"198.18.0.{dst + 1}"
    peer_node = None if isinstance(dst, str) else f"node{dst}"
    return CellTotals(CellKey(f"node{src}", f"198.18.0.{src + 1}", peer, str(src)), peer_node,
                      bytes_acked=10_000_000)


def ring(n: int) -> list[tuple[int, int]]:
    return [(k, (k - 1) % n) for k in range(n)]


def split(hops, lossy=(), delayed=()):
    """(bad cells, clean cells) of the hops (pairs), the bad ones as named."""
    bad, clean = [], []
    for hop in hops:
        c = cell(*hop)
        if hop in lossy or hop in delayed:
            bad.append(BadCell(c, hop in lossy, hop in delayed))
        else:
            clean.append(c)
    return bad, clean


def test_path_of_a_transfer():
    assert path("node0", "node1", one_tor) == {("out", "node0"), ("in", "node1")}
    assert path("node0", "node1", TWO_TORS) == {("out", "node0"), ("in", "node1")}
    assert path("node0", "node3", TWO_TORS) == {("out", "node0"), ("in", "node3"),
                                                ("up", "tor0"), ("down", "tor1")}
    # a peer outside the job sits behind the spine: through the sender's ToR uplink
    assert path("node1", None, TWO_TORS, STORAGE) == {("out", "node1"), ("up", "tor0"),
                                                      ("ext", STORAGE)}
    assert path("node1", None, one_tor, STORAGE) == {("out", "node1"), ("ext", STORAGE)}


@pytest.mark.parametrize("k", [0, 1, 2])
def test_a_lossy_port_in_a_ring_of_three_places_its_node(k):
    # node k's port drops both ways: its own hop k -> k-1 and the hop into it, k+1 -> k
    hops = ring(3)
    bad, clean = split(hops, lossy={(k, (k - 1) % 3), ((k + 1) % 3, k)})
    found, unexplained = locate(bad, clean, one_tor)
    assert unexplained == []
    assert [f.place for f in found] == [Place("node", f"node{k}")]
    assert {b.src for b in found[0].cells} == {f"node{k}", f"node{(k + 1) % 3}"}
    assert found[0].contradicting == [] and found[0].alternatives == []
    assert found[0].place.as_dict() == {"node": f"node{k}"}


def test_a_single_lossy_cell_goes_to_the_port_the_frames_leave_through():
    bad, clean = split(ring(3), lossy={(1, 0)})
    assert candidates(bad, one_tor) == [Place("node", "node0"), Place("node", "node1")]
    found, unexplained = locate(bad, clean, one_tor)
    # node0 and node1 explain the cell equally; the clean hops through them (2 -> 1
    # into node1, 0 -> 2 out of node0) cross the other direction of each port, which
    # a one-way drop leaves clean; a drop independent of load dies on the cable the
    # frames leave through
    assert [f.place for f in found] == [Place("node", "node1")]
    assert found[0].alternatives == [Place("node", "node0")]
    assert found[0].contradicting == []
    assert unexplained == []


def test_clean_cells_through_a_place_count_against_it():
    # the same lossy cell; now node1 also reads from the store without loss
    bad, clean = split(ring(3), lossy={(1, 0)})
    clean.append(cell(1, STORAGE))
    found, _ = locate(bad, clean, one_tor)
    assert found[0].place == Place("node", "node0")
    assert found[0].alternatives == []          # no longer a tie: node1 has 2 clean hops


def test_prefer_breaks_a_tie_toward_the_place_already_named():
    bad, clean = split(ring(3), lossy={(1, 0)})
    found, _ = locate(bad, clean, one_tor, prefer=frozenset({Place("node", "node0")}))
    assert found[0].place == Place("node", "node0")
    assert found[0].alternatives == [Place("node", "node1")]
    # prefer never outweighs the cells: a place that explains more wins regardless
    bad, clean = split(ring(3), lossy={(1, 0), (2, 1)})
    found, _ = locate(bad, clean, one_tor, prefer=frozenset({Place("node", "node0")}))
    assert found[0].place == Place("node", "node1")


def test_a_queueing_tor_uplink_places_the_tor_not_a_node():
    # 4 nodes, 2 per ToR; tor0's uplink queues and overflows: 0 -> 3 crosses it (lossy
    # and delayed), and 2 -> 1's ACKs (1 -> 2) queue in it (delayed only)
    bad, clean = split(ring(4), lossy={(0, 3)}, delayed={(0, 3), (2, 1)})
    found, unexplained = locate(bad, clean, TWO_TORS)
    assert unexplained == []
    assert found[0].place == Place("tor", "tor0")
    assert found[0].place.as_dict() == {"tor": "tor0", "interface": "uplink"}
    assert {(b.src, b.dst) for b in found[0].cells} == {("node0", "node3"), ("node2", "node1")}
    # tor1's downlink lies in series on both cross paths: the sending ToR is named
    assert found[0].alternatives == [Place("tor", "tor1")]
    assert len(found) == 1


def test_storage_hops_place_the_senders_uplink():
    # tor0's uplink drops: the cross-rack hop 0 -> 3 and both tor0 nodes' reads of the
    # store lose frames; the tor1 nodes' reads and the hop into tor0 (2 -> 1) are clean
    hops = ring(4) + [(k, STORAGE) for k in range(4)]
    bad, clean = split(hops, lossy={(0, 3), (0, STORAGE), (1, STORAGE)})
    found, unexplained = locate(bad, clean, TWO_TORS)
    assert found[0].place == Place("tor", "tor0")
    assert len(found[0].cells) == 3 and unexplained == []
    # 2 -> 1 crosses tor0's uplink the other way (down), which the loss leaves clean
    assert found[0].contradicting == []


def test_recent_loss_and_a_queue_tell_the_uplink_from_the_ports():
    """tor0's uplink queues and overflows under the ring's bursts: this window shows only
    0 -> 3, lossy and delayed, which node0's and node3's ports and tor1's downlink
    explain as well. node0's checkpoint lost frames through the uplink a few seconds
    ago (`recent`), and node1's went through clean between the bursts: no
    contradiction of a queue. The uplink and node0's port are left, and a switch
    queues at its egress, onto the uplink, not at the ingress from node0: node0's
    port, whose lossy hops all leave node0, is no alternative for a queue."""
    hops = ring(4) + [(1, STORAGE)]
    bad, clean = split(hops, lossy={(0, 3)}, delayed={(0, 3)})
    recent = [BadCell(cell(0, STORAGE), True, False, timed=False)]
    found, _ = locate(bad, clean, TWO_TORS)
    # one window alone: node3's port (the egress toward the receiver) and the uplink
    # tie, and the guess for a queue is the uplink, where a rack's traffic converges
    assert found[0].place == Place("tor", "tor0")
    assert Place("node", "node3") in found[0].alternatives
    found, _ = locate(bad, clean, TWO_TORS, recent=recent)
    assert found[0].place == Place("tor", "tor0")
    assert found[0].contradicting == []
    assert found[0].alternatives == []
    # a drop at random is contradicted by the clean checkpoint through the same uplink
    bad = [BadCell(cell(0, 3), True, False)]
    found, _ = locate(bad, clean, TWO_TORS, recent=recent)
    assert found[0].place == Place("node", "node0")


def test_a_hop_its_host_delays_does_not_win_a_queue_the_place_cannot_hold():
    """tor0's uplink queues: 0 -> 3 lossy and delayed, node0's checkpoint lost frames
    through it a few seconds ago. node0's busy host then delays the hop into it
    (1 -> 0). node0's port explains one more bad hop than the uplink, but the queue's
    lossy hops all leave node0, and a queue on a node's way out is its NIC's: the
    uplink keeps the queue, and 1 -> 0 is left to a place of its own."""
    hops = ring(4) + [(1, STORAGE)]
    bad, clean = split(hops, lossy={(0, 3)}, delayed={(0, 3), (1, 0)})
    recent = [BadCell(cell(0, STORAGE), True, False, timed=False)]
    found, _ = locate(bad, clean, TWO_TORS, recent=recent)
    assert found[0].place == Place("tor", "tor0")
    assert {(b.src, b.dst) for b in found[0].cells} == {("node0", "node3")}


def test_a_queue_into_a_narrowed_node_is_at_its_port():
    """0 -> 3 lossy and delayed fits node3's port and tor0's uplink alike; where node3's
    port paces all node3 receives, it holds the queue. A narrowed sender's port
    (node0's, its `out` no switch queue) says nothing about it."""
    bad, clean = split(ring(4), lossy={(0, 3)}, delayed={(0, 3)})
    found, _ = locate(bad, clean, TWO_TORS, rates=PortRates(frozenset({("in", "node3")})))
    assert found[0].place == Place("node", "node3") and found[0].alternatives == []
    found, _ = locate(bad, clean, TWO_TORS, rates=PortRates(frozenset({("in", "node0")})))
    assert found[0].place == Place("tor", "tor0")
    assert Place("node", "node3") in found[0].alternatives


@pytest.mark.parametrize("kept, named, alternatives", [
    # node3 receives its reads at line rate through its port and tor1's downlink:
    # neither is a narrowed link, and one hop at line rate cannot overfill them
    ({("in", "node3"), ("down", "tor1")}, Place("tor", "tor0"), []),
    # nothing shown about tor1's downlink: it stays in series with tor0's uplink
    ({("in", "node3")}, Place("tor", "tor0"), [Place("tor", "tor1")]),
    # nothing known: node3's port and tor1's downlink tie with the uplink
    (set(), Place("tor", "tor0"), [Place("node", "node3"), Place("tor", "tor1")])],
    ids=["both-kept", "port-kept", "unknown"])
def test_a_queue_behind_elements_at_full_rate_is_upstream(kept, named, alternatives):
    """0 -> 3 lossy and delayed crosses tor0's uplink, tor1's downlink and node3's
    port. An element through which node3 (or its rack) receives at its usual peak
    passes traffic at full rate: a queue there needs senders converging on it, which
    the ring's one hop into node3 is not, so it does not tie with the uplink."""
    bad, clean = split(ring(4), lossy={(0, 3)}, delayed={(0, 3)})
    found, _ = locate(bad, clean, TWO_TORS, rates=PortRates(kept=frozenset(kept)))
    assert found[0].place == named
    assert sorted(found[0].alternatives, key=str) == sorted(alternatives, key=str)


def test_a_store_every_node_loses_to_is_the_peer():
    hops = ring(4) + [(k, STORAGE) for k in range(4)]
    bad, clean = split(hops, lossy={(k, STORAGE) for k in range(4)})
    found, unexplained = locate(bad, clean, TWO_TORS)
    assert [f.place for f in found] == [Place("peer", STORAGE)]
    assert found[0].place.as_dict() == {"peer": STORAGE}
    assert len(found[0].cells) == 4 and unexplained == []


def test_loss_places_a_fault_before_delay_does():
    """Node2's port drops both ways (3 -> 2 and 2 -> 1 lossy) while node3's slow host
    delays the hop into it (0 -> 3). node3 explains as many bad hops, one lossy and one
    delayed, and more of them on their plausible side; but a frame dies on its own data
    path, a delay can be a host answering late: the place of both losses wins, and
    node3's delay stays unexplained by a second place of loss."""
    hops = ring(4)
    bad, clean = split(hops, lossy={(3, 2), (2, 1)}, delayed={(0, 3)})
    found, unexplained = locate(bad, clean, one_tor)
    assert found[0].place == Place("node", "node2")
    assert sorted((b.src, b.dst) for b in found[0].cells) == [("node2", "node1"),
                                                              ("node3", "node2")]
    assert [b.lossy for f in found[1:] for b in f.cells] == [False]


def test_two_faults_are_found_one_after_the_other():
    # node0's port and node3's port in a ring of 6: two separate rows/columns
    lossy = {(0, 5), (1, 0), (3, 2), (4, 3)}
    bad, clean = split(ring(6), lossy=lossy)
    found, unexplained = locate(bad, clean, one_tor)
    assert {f.place for f in found} == {Place("node", "node0"), Place("node", "node3")}
    assert sum(len(f.cells) for f in found) == 4 and unexplained == []


def test_loss_a_named_place_explains_is_no_evidence_for_another():
    """node1's port drops both ways (1 -> 0, 2 -> 1) and a read from storage into node1
    found holes (`recent`: the way in crosses tor0's downlink and node1's port). A
    second fault drops 0 -> 3, and a read into node3 found holes too. node1's port
    takes its hops and its read's loss: a frame died at one place, so that read is no
    evidence for tor0's uplink, which 0 -> 3 also crosses; the second place is one
    that node3's read puts behind node3."""
    bad, clean = split(ring(4), lossy={(1, 0), (2, 1), (0, 3)})
    recent = [BadCell(cell(1, STORAGE), True, False, timed=False, inbound=True),
              BadCell(cell(3, STORAGE), True, False, timed=False, inbound=True)]
    found, unexplained = locate(bad, clean, TWO_TORS, recent=recent)
    assert found[0].place == Place("node", "node1") and unexplained == []
    assert found[1].place in (Place("node", "node3"), Place("tor", "tor1"))
    assert {(b.src, b.dst) for b in found[1].cells} == {("node0", "node3")}


def test_plausible_side_of_each_kind_of_fault():
    lossy = BadCell(cell(0, 3), lossy=True, delayed=False)
    queued = BadCell(cell(0, 3), lossy=False, delayed=True)
    # a drop: the sender's port; a queue: the switch egress toward the receiver
    assert _plausible_side(Place("node", "node0"), lossy, TWO_TORS) == 1
    assert _plausible_side(Place("node", "node3"), lossy, TWO_TORS) == 0
    assert _plausible_side(Place("node", "node3"), queued, TWO_TORS) == 1
    assert _plausible_side(Place("node", "node0"), queued, TWO_TORS) == 0
    # on a ToR: a drop leaving the rack is the sending ToR's uplink; a queue either ToR
    assert _plausible_side(Place("tor", "tor0"), lossy, TWO_TORS) == 1
    assert _plausible_side(Place("tor", "tor1"), lossy, TWO_TORS) == 0
    assert _plausible_side(Place("tor", "tor1"), queued, TWO_TORS) == 1


def test_places_in_series_on_every_path_between_the_nodes_cannot_be_told_apart():
    """With two ToRs, tor0's uplink and tor1's downlink lie on every path between the
    racks: no transfer between the job's nodes crosses one and not the other. A node's
    port and its ToR's uplink are told apart by the rack's other node."""
    nodes = ["node0", "node1", "node2", "node3"]
    tor_of = {"node0": "tor0", "node1": "tor0", "node2": "tor1", "node3": "tor1"}.get
    assert not told_apart(Place("tor", "tor0"), Place("tor", "tor1"), nodes, tor_of)
    assert told_apart(Place("tor", "tor0"), Place("node", "node0"), nodes, tor_of)
    assert told_apart(Place("node", "node0"), Place("node", "node3"), nodes, tor_of)
    # a third rack: tor0's uplink carries its paths to tor2 as well, tor1's does not
    three = {**{n: tor_of(n) for n in nodes}, "node4": "tor2"}.get
    assert told_apart(Place("tor", "tor0"), Place("tor", "tor1"), nodes + ["node4"], three)
