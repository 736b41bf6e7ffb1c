"""Network causes: lossy_link, buffer_saturation, straggler_network, microburst.

The evidence is the job's connection matrix over the last seconds (cells: one
node's flows to one peer). A cell is *lossy* when it resent a share of its
payload above thresholds.loss_ratio, *delayed* when its RTT (the median of its
seconds, weighted by RTT samples) stands well above the job's floor. The places
that explain the bad cells come from diagnosis/localize.py; at each place:
- loss with the RTT at its floor: the frames die independent of load, there is
  no queue in front of the drop: lossy_link;
- loss together with inflated RTT: a queue fills and overflows under the
  synchronized bursts: buffer_saturation; so too loss that spares other
  traffic through the same place (its clean hops carried enough to have lost
  their share, and did not): a link that drops at random drops from every flow
  through it, a shallow buffer only from what arrives while it overflows;
- inflated RTT without loss, and the ring's collectives stretched: a slow link
  (a deep queue, a degraded rate) holds the ring back: straggler_network.
Bursts at line rate with neither loss nor queueing are `microburst`, info only.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from fabricscope.diagnosis.candidate import Candidate, RuledOut
from fabricscope.diagnosis.causes import Cause
from fabricscope.diagnosis.evidence import CellTotals, weighted_median
from fabricscope.diagnosis.finding import Evidence
from fabricscope.diagnosis.localize import BadCell, Located, PortRates, locate, told_apart
from fabricscope.diagnosis.snapshot import Snapshot, read_rates, resends_as_lossy, rtt_inflated

MIN_RTO_S = 0.2           # Linux's minimum retransmission timeout (TCP_RTO_MIN)
#: a second of a fault follows another within this many seconds (port_rates)
ONSET_LOOKBACK_S = 2


def bad_cells(snap: Snapshot) -> list[BadCell]:
    """The hops of the window that resent (lossy) or queued (delayed). A hop that lost
    nothing is bad only where its delay also stands out from its own usual RTT
    (_delay_stands_out); a lossy hop is delayed where its loss came with a queue
    (_queued_when_lossy)."""
    lossy = {id(c) for c in snap.lossy}
    delayed = {id(c) for c in snap.delayed}
    timed = {id(c) for c in snap.timed}
    out = []
    for c in snap.cells:
        if id(c) in lossy:
            queued = _queued_when_lossy(snap, c) if id(c) in timed else None
            out.append(BadCell(c, True, id(c) in delayed if queued is None else queued,
                               id(c) in timed))
        elif id(c) in delayed and _delay_stands_out(snap, c):
            out.append(BadCell(c, False, True, id(c) in timed))
    return out


def _queued_when_lossy(snap: Snapshot, c: CellTotals) -> bool | None:
    """Whether the hop's RTT stood inflated over the floor in the seconds in which it
    resent (its median there, weighted by RTT samples): a buffer delays the frames
    of the seconds it drops in, while a link that drops at random delays none. Over
    the whole window, a second before the loss began (a fault's onset: many samples,
    a short queue) outweighed the seconds of loss and hid their queue. None where no
    second of the window resent as a lossy one does on its own, or none was timed:
    the window's judgement stands."""
    t, floor = snap.thresholds, snap.rtt_floor_us
    if floor is None:
        return None
    per_second = _lossy_second_segs(t)
    table = snap.evidence.cells.get(c.key, {})
    pairs = [(sec.rtt_p50_us, sec.rtt_samples)
             for sec in map(table.get, range(snap.window.start_s, snap.window.end_s))
             if sec is not None and sec.rtt_p50_us is not None and sec.rtt_samples
             and sec.bytes_acked and resends_as_lossy(sec, t, per_second)]
    rtt = weighted_median(pairs) if pairs else None
    return None if rtt is None else rtt_inflated(rtt, floor, t)


def _lossy_second_segs(t) -> int:
    """Segments one second must resend to count as lossy on its own: loss_min_segs
    spread over the window's seconds."""
    return -(-t.loss_min_segs // t.eval_seconds)


def inbound_holes(snap: Snapshot) -> list[BadCell]:
    """The flows from peers outside the job into a node whose receiver found holes in
    what came (_lost_inbound): only the receiver of such a flow, a read from storage,
    sees what the way in drops. Out of order is also what a path that reorders gives
    (a veth whose sender moved to another CPU does), so they name no place of their
    own: they rank the places that explain the job's lossy hops, as the recent loss
    does (localize.locate's `recent`)."""
    t = snap.thresholds
    return [BadCell(c, True, False, timed=False, inbound=True) for c in snap.cells
            if c.peer_node is None and _lost_inbound(c, t)]


def _lost_inbound(c: CellTotals, t) -> bool:
    """The node's sockets to the peer received at least loss_min_segs packets out of
    order, loss_ratio of the data segments they received or more: each is a segment
    that came after a hole, so a lost frame shows as many of them (the more, the more
    was in flight), and a path that drops at loss_ratio shows at least as many. A
    flow within the job is not judged so: its sender's resends say the same."""
    return c.rx_ooo_pkts >= t.loss_min_segs and \
        c.rx_ooo_pkts >= t.loss_ratio * max(1, c.rx_data_segs)


def _delay_stands_out(snap: Snapshot, c: CellTotals) -> bool:
    """The hop's RTT is rtt_excess_us above its usual one (its median in the job's
    baseline; unknown: the floor's judgement stands). A loaded ring's hops run 1-2 ms
    above the job's idle floor all along, at their hosts' pace (the lab's 2-core
    runs), so they count as delayed against the floor before any fault; such a hop,
    one of a fault's neighbours, then outweighed a fault's hop on the ties between
    the places that explain its loss (a busy node0's hop into it named node0's port
    for tor0's uplink). A lossy hop's own delay is judged against the floor still:
    it says whether its loss came with a queue."""
    usual = snap.usual_rtt_us.get(c.key)
    return usual is None or (c.rtt_p50_us or 0.0) >= usual + snap.thresholds.rtt_excess_us


def port_rates(snap: Snapshot, tor_of, bad: list[BadCell]) -> PortRates:
    """The elements in front of the nodes the lossy hops of `bad` enter: each node's
    port and its ToR's downlink, judged by the node's busiest 100 us bin received in
    each second (nic_window rx), against the node's usual (its baseline's median),
    over the seconds in which those hops showed the fault (_faulty_second), the
    first of a run left out: the window's earlier seconds, and the one a shaper came
    in, passed the port's usual peak.

    Only seconds in which the node received a cell's worth of data that crossed no
    other rack's uplink count (witness traffic): its reads from peers outside the job
    (behind the spine, through its ToR's downlink) and hops from nodes of its own
    rack. Data that crossed another rack's uplink arrives at that uplink's pace, so a
    narrowed uplink would make the node look narrowed (behind a shaped tor0 uplink,
    node3 receives its ring hop at the uplink's rate and its reads at line rate). A
    node's port: its reads and its rack's hops; a ToR's downlink: the reads of every
    node of its rack."""
    ev, t = snap.evidence, snap.thresholds
    seconds = range(snap.window.start_s, snap.window.end_s)
    usual = snap.usual_rx_peak
    showed: dict[str, set] = {}      # node -> the seconds the fault showed on a hop into it
    for b in bad:
        if b.lossy and b.dst is not None:
            table = ev.cells.get(b.cell.key, {})
            usual_rtt = snap.usual_rtt_us.get(b.cell.key, snap.rtt_floor_us)
            showed.setdefault(b.dst, set()).update(
                s for s in range(seconds.start - ONSET_LOOKBACK_S, seconds.stop)
                if s in table and _faulty_second(table[s], usual_rtt, t))
    # not the first second of a run (a hop's flows report about once a second, so a
    # second may go missing in between): the fault began within it, and its busiest
    # bin may have come before (a port shaped mid-second passed that second's peak)
    fault_seconds = {n: {s for s in got if s in seconds and
                         any(s - k in got for k in range(1, ONSET_LOOKBACK_S + 1))}
                     for n, got in showed.items()}
    nodes = set(fault_seconds)
    fed_from_outside: dict[str, set] = {}
    fed_in_rack: dict[str, set] = {}
    job_nodes = set(ev.node_of_rank.values())
    judged = {n for n in nodes if n in usual}
    racks = {tor_of(n) for n in judged} - {None}
    judged |= {n for n in job_nodes if tor_of(n) in racks and n in usual}
    for c in snap.cells:
        if c.peer_node is None and c.key.node in judged:
            into, field_of, into_set = c.key.node, "bytes_received", fed_from_outside
        elif c.peer_node in judged and tor_of(c.key.node) == tor_of(c.peer_node):
            into, field_of, into_set = c.peer_node, "bytes_acked", fed_in_rack
        else:
            continue
        table = ev.cells.get(c.key, {})
        got = into_set.setdefault(into, set())
        got.update(s for s in seconds
                   if s in table and getattr(table[s], field_of) >= t.cell_min_bytes)

    def rate(node: str, fed: set) -> str | None:
        """"narrowed" where the node received at most narrowed_share of its usual peak
        over the seconds `fed` (their median), "kept" where at least kept_share of it
        in every one of them, two at least (a port narrowed within the window has
        passed its usual peak in the seconds before); else None. A second with no
        peak is one whose nic_window has not reached the store yet (the node's second
        is read once its tcp_node is in; the probes ship apart), not an idle port: the
        node received a cell's worth in it. Read as zero, it named node3's port where
        live reads of tor0's shaped uplink came before its peaks."""
        table = ev.nodes.get(node, {})
        shares = [table[s].rx_peak_bps / usual[node] for s in fed
                  if s in table and table[s].rx_peak_bps > 0]
        if not shares:
            return None
        if statistics.median(shares) <= t.narrowed_share:
            return "narrowed"
        return "kept" if len(shares) >= 2 and min(shares) >= t.kept_share else None

    reads = _read_shares(snap, tor_of, job_nodes)
    narrowed, kept = set(), set()
    for node in nodes:
        verdict = _share_verdict(reads.get(("in", node)), t)
        if verdict is None and node in judged:
            verdict = rate(node, (fed_from_outside.get(node, set()) |
                                  fed_in_rack.get(node, set())) & fault_seconds[node])
        if verdict is not None:
            (kept if verdict == "kept" else narrowed).add(("in", node))
    for rack in racks | {tor_of(n) for n in nodes} - {None}:
        verdict = _share_verdict(reads.get(("down", rack)), t)
        if verdict is None:
            faulty = set().union(*(fault_seconds[n] for n in nodes if tor_of(n) == rack))
            verdicts = [v for v in (rate(n, fed_from_outside.get(n, set()) & faulty)
                                    for n in sorted(judged) if tor_of(n) == rack) if v]
            # a downlink paces all its rack receives: one node narrowed is as much
            # its own port's doing
            verdict = "kept" if "kept" in verdicts else "narrowed" if len(verdicts) >= 2 \
                and all(v == "narrowed" for v in verdicts) else None
        if verdict is not None:
            (kept if verdict == "kept" else narrowed).add(("down", rack))
    return PortRates(frozenset(narrowed), frozenset(kept))


def _share_verdict(share: float | None, t) -> str | None:
    if share is None:
        return None
    return "narrowed" if share <= t.narrowed_share else "kept" if share >= t.kept_share \
        else None


def _read_shares(snap: Snapshot, tor_of, job_nodes: set[str]) -> dict[tuple, float]:
    """The rate of the reads into the nodes behind each element, against their usual
    (snapshot.read_rates over the window and the baseline), relative to the same
    share of the job's nodes not behind it: a node's port (`in`) against its
    rack-mates (the other nodes where it has none), a ToR's downlink (`down`) by the
    least slowed node of its rack against the other racks' nodes. Reads cross the
    element in front of the node and nothing of the fabric the job's ring hops
    share, so a narrowed element slows them and a queue upstream of it does not;
    relative, since a slow store slows every node's reads alike. A node without reads
    in the window, or without usual ones, says nothing."""
    usual = snap.usual_read_bps
    now = read_rates(snap.evidence, snap.window.start_ns, snap.window.end_ns)
    shares = {n: now[n] / usual[n] for n in job_nodes if n in now and usual.get(n)}
    if len(shares) < 2:
        return {}
    out: dict[tuple, float] = {}
    for node, share in shares.items():
        # against its rack-mates, whose reads share its ToR's downlink and not its port;
        # a node alone in its rack against every other node
        mates = [v for n, v in shares.items() if n != node and tor_of(n) == tor_of(node)]
        others = mates or [v for n, v in shares.items() if n != node]
        out[("in", node)] = share / statistics.median(others)
    for rack in {tor_of(n) for n in shares} - {None}:
        inside = [v for n, v in shares.items() if tor_of(n) == rack]
        outside = [v for n, v in shares.items() if tor_of(n) != rack]
        # a downlink paces every node of its rack: the least slowed one says how fast
        # it passes reads, and one node alone is as much its own port
        if outside and (len(inside) >= 2 or max(inside) >= statistics.median(outside)):
            out[("down", rack)] = max(inside) / statistics.median(outside)
    return out


def _faulty_second(c, usual_rtt_us: float | None, t) -> bool:
    """One second of a lossy hop in which the fault showed: it resent as a lossy cell
    does (snapshot.resends_as_lossy), or resent anything while its RTT stood
    rtt_excess_us above its usual (a queue that overflows now and then resends a few
    segments a second; a healthy ring's hops resend a few now and then too, at their
    usual RTT)."""
    if resends_as_lossy(c, t):
        return True
    return bool(c.retrans_segs) and usual_rtt_us is not None and \
        c.rtt_p50_us is not None and c.rtt_p50_us >= usual_rtt_us + t.rtt_excess_us


def detect(snap: Snapshot, tor_of, prefer: frozenset = frozenset(),
           stragglers: frozenset = frozenset(), recent: list[BadCell] = (),
           bad: list[BadCell] | None = None) -> tuple[list[Candidate], list[RuledOut]]:
    """`prefer`: places of open network findings; `stragglers`: nodes of ranks that
    compute late (their hosts answer late, which inflates RTTs all around the ring:
    delay alone then proves no slow link); `recent`: lossy cells of the last seconds
    (localize.locate); `bad`: bad_cells(snap), where the caller has them already."""
    bad = bad_cells(snap) if bad is None else bad
    if stragglers:
        # a compute straggler's host answers late: the delay of its own hops is its
        # CPU's, and without loss anywhere no delay proves a slow link
        bad = [b for b in bad if b.lossy or not {b.src, b.dst} & stragglers] \
            if snap.lossy else []
    if not bad:
        return _microbursts(snap), _clean(snap)
    bad_ids = {id(b.cell) for b in bad}
    clean = [c for c in snap.data_cells if id(c) not in bad_ids]
    keys = {b.cell.key for b in bad}
    found, unexplained = locate(bad, clean, tor_of, prefer=prefer,
                                recent=[b for b in recent if b.cell.key not in keys]
                                + inbound_holes(snap),
                                rates=port_rates(snap, tor_of, bad))
    t = snap.thresholds
    explained = sum(len(f.cells) for f in found)
    if explained < t.place_explains * len(bad):
        return [_impaired(snap, bad)], []
    total_retrans = sum(b.cell.retrans_segs for b in bad) or 1
    out = []
    bad_ids = frozenset(id(b.cell) for b in bad)
    for f in found:
        c = _finding(snap, f, sum(b.cell.retrans_segs for b in f.cells) / total_retrans,
                     tor_of, bad_ids)
        if c is not None:
            c.hops = f.hops
            out.append(c)
    return out, []


@dataclass(frozen=True)
class Spared:
    """The traffic a lossy place let through unharmed (see spared)."""

    lossy_ratio: float        # share of the lossy hops' payload resent
    steady_ratio: float       # share of the clean hops' payload resent
    steady_bytes: int         # what the clean hops carried through the place
    expected_episodes: float  # loss episodes they would have met at the lossy hops' rate


#: the most payload one dropped frame takes with it: a segmentation-offload frame (TSO,
#: GSO; a veth or a bridge drops it whole) carries up to 64 KiB
MAX_FRAME_BYTES = 65536


def loss_episodes(c: CellTotals) -> int:
    """The fewest separate drops that explain what a hop resent: one per second in
    which it resent anything, and one per MAX_FRAME_BYTES of what it resent."""
    return max(c.loss_seconds, math.ceil(c.retrans_bytes / MAX_FRAME_BYTES))


def spared(located: Located, t) -> Spared | None:
    """The place's clean hops (`contradicting`: they carried data through the elements
    its lossy hops implicate) met loss in at most spared_share of the episodes the
    lossy hops' rate predicts for their payload, an expectation of at least
    spared_min_episodes; None otherwise. The rate is the lossy hops' episodes
    (loss_episodes: a lower bound, so the expectation errs low) per byte carried."""
    lossy = [b.cell for b in located.cells if b.lossy]
    clean = located.contradicting
    sent = sum(c.bytes_acked + c.retrans_bytes for c in lossy)
    episodes = sum(loss_episodes(c) for c in lossy)
    if not lossy or not clean or not sent or not episodes:
        return None
    steady = sum(c.bytes_acked for c in clean)
    expected = steady * episodes / sent
    met = sum(loss_episodes(c) for c in clean)
    if expected < t.spared_min_episodes or met > t.spared_share * expected:
        return None
    resent = sum(c.retrans_bytes for c in clean)
    return Spared(sum(c.retrans_bytes for c in lossy) / sent,
                  resent / (steady + resent) if steady + resent else 0.0, steady, expected)


def _cause(located: Located, t) -> tuple[str, Spared | None]:
    """Queueing before the drop is what tells an overflowing buffer from a bad link: the
    lossy hops themselves must show the inflated RTT (more than half of them). Only
    hops whose delay was judged vote: a lossy hop to a peer outside the job (a
    checkpoint written to storage through the same queue) has no RTT floor, so its
    RTT proves neither a queue nor its absence. Where no lossy hop could be timed,
    a queue seen on the place's other hops (their ACKs' path) decides. Without a
    queue shown, loss that spared the steady traffic through the place (`spared`)
    is still a buffer's: a queue too shallow to hold the bursts overflows before its
    delay stands out of the hosts' own. A buffer's cause comes with what it spared
    (its finding shows it as evidence, with a queue shown or not)."""
    lossy = [b for b in located.cells if b.lossy]
    if not lossy:
        return Cause.STRAGGLER_NETWORK, None
    timed = [b for b in lossy if b.timed]
    voters = timed or [b for b in located.cells if b.timed]
    queued = [b for b in voters if b.delayed]
    # the queue must be shown, by most of the voters: a busy host delays a hop's RTT
    # now and then by itself, so one of a lossy port's two hops delayed is no queue
    steady = spared(located, t)
    if (voters and 2 * len(queued) > len(voters)) or steady is not None:
        return Cause.BUFFER_SATURATION, steady
    return Cause.LOSSY_LINK, None


def job_loss_ratio(snap: Snapshot) -> float:
    sent = sum(c.bytes_acked + c.retrans_bytes for c in snap.data_cells)
    return sum(c.retrans_bytes for c in snap.data_cells) / sent if sent else 0.0


#: a node's own link stands out when the job's other hops carry less than this share of
#: its hops' extra RTT: its link adds delay to its own hops only, while a fabric whose
#: latency rose adds it to every hop alike (latency_bound's evidence); halfway
STANDS_OUT_SHARE = 0.5


def rise_stands_out(rise_us: float, rest_us: float) -> bool:
    """One node's hops rose in RTT by rise_us (a median above their baseline) and the
    job's other hops by rest_us: the node's own link, where the others rose by less
    than STANDS_OUT_SHARE of it."""
    return rise_us > 0 and rest_us < STANDS_OUT_SHARE * rise_us


def extra_rtt_us(snap: Snapshot, cells) -> tuple[float, int] | None:
    """(the cells' median RTT above their own baseline RTT, the cells that have both):
    what each round trip costs now that it did not while the job ran healthy."""
    extra = [c.rtt_p50_us - snap.usual_rtt_us[c.key] for c in cells
             if c.rtt_p50_us is not None and snap.usual_rtt_us.get(c.key) is not None]
    return (statistics.median(extra), len(extra)) if extra else None


def _stands_out(snap: Snapshot, node: str, bad_ids: set) -> bool:
    """The node's hops are late and the job's hops between two other nodes are not
    (as late): the delay is the node's row and column of the matrix. Judged by their
    RTT above each hop's own baseline RTT where it is known (STANDS_OUT_SHARE), else
    by whether some such hop carried data on time (timed, not among the window's bad
    hops). Where every hop is as late, the job's whole fabric is (its latency rose),
    and one node's link is no better an answer than another's. A job with no such
    hop (two nodes) has nothing to compare with."""
    others = [c for c in snap.data_cells if c.peer_node is not None and
              c.rtt_p50_us is not None and node not in (c.key.node, c.peer_node)]
    if not others:
        return True
    mine = extra_rtt_us(snap, [c for c in snap.data_cells if c.peer_node is not None
                               and node in (c.key.node, c.peer_node)])
    rest = extra_rtt_us(snap, others)
    if mine is not None and rest is not None:
        return rise_stands_out(mine[0], rest[0])
    return any(id(c) not in bad_ids for c in others)


def _finding(snap: Snapshot, located: Located, share: float,
             tor_of=lambda node: None, bad_ids: frozenset = frozenset()) -> Candidate | None:
    t, b = snap.thresholds, snap.baseline
    cause, steady = _cause(located, t)
    sync_added = max(0.0, (snap.sync_s or 0.0) - b.sync_s) if b and snap.sync_s else 0.0
    if cause == Cause.STRAGGLER_NETWORK and not (
            located.place.kind == "node"            # a rank's link; slow storage is input's
            and b and snap.sync_s and snap.sync_s >= b.sync_s * (1 + t.slowdown)
            and not snap.lossy and len(located.cells) >= 2 and not located.contradicting
            and _stands_out(snap, located.place.name, bad_ids)):
        # delay alone is weak evidence: it must stretch the ring, without loss anywhere
        # (then back-pressure of the lossy hop inflates others), on a whole row or
        # column of the matrix that no clean hop through the place contradicts, and
        # that stands out of the rest of the matrix
        return None
    added = sync_added * share
    if snap.step_added_s:
        added = min(added, snap.step_added_s)
    step = snap.step_s or (b.step_s if b else 0.0)
    share_of_step = added / step if step else 0.0
    ratio = job_loss_ratio(snap)
    amplification = ((snap.sync_s / b.sync_s - 1) / ratio) if (b and snap.sync_s and ratio > 0
                                                                and b.sync_s > 0) else None
    cells = [x.cell for x in located.cells]
    lossy = [x.cell for x in located.cells if x.lossy]
    delayed = [x.cell for x in located.cells if x.delayed]
    where = _where(located)
    place = located.place.as_dict()
    ranks = sorted(r for r, n in snap.evidence.node_of_rank.items()
                   if located.place.kind == "node" and n == located.place.name)
    if len(ranks) == 1:
        place["rank"] = ranks[0]
    evidence = _evidence(snap, located, lossy, delayed)
    if amplification is not None:
        evidence.append(Evidence(snap.evidence.step_source().sync, "grad sync slowdown per "
                                 "share of bytes resent (retransmit amplification)",
                                 round(amplification, 1), "x",
                                 snap.window.start_ns, snap.window.end_ns))
    timeouts = sum(c.timeouts for c in cells)
    if timeouts:
        evidence.append(Evidence("tcp_flow", "retransmission timeouts (each stalls its hop "
                                 f">= {MIN_RTO_S * 1000:.0f} ms)", timeouts, "events",
                                 snap.window.start_ns, snap.window.end_ns))
    severity = "critical" if share_of_step >= t.critical_share else "warning"
    if steady is not None:
        evidence.append(Evidence("tcp_flow", f"payload resent on the clean hops through "
                                 f"{where} ({steady.steady_bytes / 1e6:.1f} MB; at the lossy "
                                 f"hops' rate {steady.expected_episodes:.0f} loss episodes)",
                                 round(steady.steady_ratio * 100, 4), "%",
                                 snap.window.start_ns, snap.window.end_ns))
    summary = _summary(cause, where, lossy, delayed, snap, added, share_of_step, steady)
    # a place in series with this one on every path between the job's nodes: no hop of
    # the job can tell them apart, so the finding says which. The lifecycle waits for
    # the ties that something the job sends can tell apart (`told_apart`): its hops, or
    # its checkpoints and reads where it has any; a wait for the others only delays it
    nodes = sorted(set(snap.evidence.node_of_rank.values()))
    series = [p for p in located.alternatives if not told_apart(p, located.place, nodes, tor_of)]
    in_series = [_where(Located(p, [])) for p in series]
    outside = [c for c in snap.cells if c.peer_node is None]
    summary += in_series_note(in_series, all(p.kind == "tor" for p in [located.place, *series]))
    victims = [{"rank": r.rank, "node": r.node,
                "waited_s": round(max(0.0, r.sync - b.sync_s), 3)}
               for r in snap.ranks.values()] if b else []
    return Candidate(
        cause, severity, place, summary, *_bad_span_ns(snap, located),
        evidence=evidence, step_seconds_added=round(added, 4),
        share_of_step=round(share_of_step, 4),
        explained_share=round(min(1.0, added / snap.step_added_s), 3)
        if snap.step_added_s else 0.0,
        retransmit_amplification=round(amplification, 2) if amplification is not None else None,
        victims=victims,
        facts={"loss_ratio": _ratio(lossy), "timeouts": timeouts,
               "rtt_p50_us": _median([c.rtt_p50_us for c in delayed or cells]),
               "rtt_floor_us": snap.rtt_floor_us, "place_kind": located.place.kind,
               "tor": located.place.name if located.place.kind == "tor" else None,
               "bytes_per_s": sum(c.bytes_acked for c in cells) / max(1, snap.window.end_s -
                                                                       snap.window.start_s),
               "alternatives": [p.name for p in located.alternatives],
               "told_apart": [p.name for p in located.alternatives
                              if told_apart(p, located.place, nodes, tor_of, outside)],
               "in_series": in_series})


def in_series_note(places: list[str], between_racks: bool = True) -> str:
    """What a finding says of the places in series with its own ('tor1's uplink'):
    nothing where there are none. `between_racks`: the finding's place and these are
    ToRs' uplinks (one's, and the other's the other way on the same paths); else one
    of them is a node's port (a ToR with one of the job's nodes: every path of the
    node crosses both)."""
    if not places:
        return ""
    verb = "lies" if len(places) == 1 else "lie"
    if between_racks:
        return (f" ({' and '.join(places)}, the other way, {verb} in series with it on "
                "every path between the job's racks: only traffic leaving or entering the "
                "job tells them apart; the rack the lost frames leave is named)")
    return (f" ({' and '.join(places)} {verb} in series with it on every path of the "
            "job's nodes: only traffic leaving or entering the job tells them apart)")


def _bad_span_ns(snap: Snapshot, located: Located) -> tuple[int, int]:
    """From the first second of the window in which one of the place's bad hops resent
    anything (lossy) or carried data with its RTT inflated (delayed) to the end of the
    last such second: where the evidence begins and ends (a fault that stops ends with
    its last bad second, not with the windows that still sum it)."""
    w, ev, t = snap.window, snap.evidence, snap.thresholds
    per_second = _lossy_second_segs(t)
    floor = snap.rtt_floor_us
    bad = []
    for s in range(w.start_s, w.end_s):
        for b in located.cells:
            sec = ev.cells.get(b.cell.key, {}).get(s)
            if sec is None:
                continue
            lossy = resends_as_lossy(sec, t, per_second)
            queued = floor is not None and sec.bytes_acked and sec.rtt_p50_us is not None \
                and rtt_inflated(sec.rtt_p50_us, floor, t)
            if (b.lossy and lossy) or (b.delayed and not b.lossy and queued):
                bad.append(s)
                break
    if not bad:
        return w.start_ns, w.end_ns
    return bad[0] * 1_000_000_000, (bad[-1] + 1) * 1_000_000_000


def _where(located: Located) -> str:
    p = located.place
    if p.kind == "peer":
        return f"the path to {p.name}"
    return f"{p.name}'s uplink" if p.kind == "tor" else f"{p.name}'s port"


def _ratio(cells: list[CellTotals]) -> float:
    sent = sum(c.bytes_acked + c.retrans_bytes for c in cells)
    return sum(c.retrans_bytes for c in cells) / sent if sent else 0.0


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def hop(c: CellTotals) -> str:
    return f"{c.key.node}->{c.peer_node or c.key.peer}"


def _evidence(snap: Snapshot, located: Located, lossy, delayed) -> list[Evidence]:
    w = snap.window
    out = []
    for c in lossy:
        out.append(Evidence("tcp_flow", f"payload resent on {hop(c)}", round(c.loss_ratio * 100, 3),
                            "%", w.start_ns, w.end_ns, [c.key.node]))
    for c in delayed:
        out.append(Evidence("tcp_flow", f"median RTT on {hop(c)} (floor "
                            f"{snap.rtt_floor_us:.0f} us)", round(c.rtt_p50_us or 0), "us",
                            w.start_ns, w.end_ns, [c.key.node]))
    if lossy and not delayed:
        timed = {id(c) for c in snap.timed}
        rtts = [c.rtt_p50_us for c in lossy if id(c) in timed]
        if rtts:
            out.append(Evidence("tcp_flow", "median RTT of the lossy hops: no queue before "
                                "the drop", round(statistics.median(rtts)), "us",
                                w.start_ns, w.end_ns))
    n_bad = len(located.cells)
    out.append(Evidence("tcp_flow", f"bad hops through {_where(located)}", n_bad, "hops",
                        w.start_ns, w.end_ns, sorted({b.cell.key.node for b in located.cells})))
    if located.contradicting:
        out.append(Evidence("tcp_flow", f"clean hops through {_where(located)}",
                            len(located.contradicting), "hops", w.start_ns, w.end_ns))
    if snap.baseline and snap.sync_s:
        out.append(Evidence(snap.evidence.step_source().sync, "grad sync per step (baseline "
                            f"{snap.baseline.sync_s:.3f} s)", round(snap.sync_s, 3), "s",
                            w.start_ns, w.end_ns))
    return out


def _summary(cause, where, lossy, delayed, snap, added, share, steady=None) -> str:
    b = snap.baseline
    cost = (f"; steps {b.step_s:.2f} -> {snap.step_s:.2f} s, {added:.2f} s of each step "
            f"({share:.0%})") if b and snap.step_s else ""
    if cause == Cause.LOSSY_LINK:
        return (f"Lossy link at {where}: {_ratio(lossy):.2%} of the payload on "
                f"{', '.join(hop(c) for c in lossy)} resent with the RTT at its floor "
                f"(drops independent of load){cost}")
    if cause == Cause.BUFFER_SATURATION and steady is not None and not delayed:
        return (f"Buffer saturation at {where}: the drops fall on some of its flows "
                f"({_ratio(lossy):.2%} resent on {', '.join(hop(c) for c in lossy)}) and "
                f"spare the others through it ({steady.steady_ratio:.3%} of "
                f"{steady.steady_bytes / 1e6:.0f} MB resent), as a buffer that overflows "
                f"under bursts does; a link that dropped frames independent of load "
                f"would drop from all of them{cost}")
    if cause == Cause.BUFFER_SATURATION:
        rtt = _median([c.rtt_p50_us for c in delayed])
        return (f"Buffer saturation at {where}: the queue fills under the synchronized "
                f"bursts (RTT {rtt:.0f} us vs floor {snap.rtt_floor_us:.0f} us) and "
                f"overflows ({_ratio(lossy):.2%} resent on "
                f"{', '.join(hop(c) for c in lossy)}){cost}")
    rtt = _median([c.rtt_p50_us for c in delayed])
    return (f"Slow link at {where} holds the ring back: RTT {rtt:.0f} us vs floor "
            f"{snap.rtt_floor_us:.0f} us without loss{cost}")


def _impaired(snap: Snapshot, bad: list[BadCell]) -> Candidate:
    w = snap.window
    hops = ", ".join(hop(b.cell) for b in bad[:6])
    return Candidate(
        Cause.UNEXPLAINED_SLOWDOWN, "warning", {}, f"Network impaired on {len(bad)} hops "
        f"({hops}) that no single port or uplink explains; cause unclear",
        w.start_ns, w.end_ns,
        evidence=[Evidence("tcp_flow", f"{'lossy' if b.lossy else 'delayed'} hop {hop(b.cell)}",
                           round(b.cell.loss_ratio * 100, 3) if b.lossy
                           else round(b.cell.rtt_p50_us or 0), "%" if b.lossy else "us",
                           w.start_ns, w.end_ns, [b.cell.key.node]) for b in bad],
        step_seconds_added=round(snap.step_added_s, 4))


def _microbursts(snap: Snapshot) -> list[Candidate]:
    t, w = snap.thresholds, snap.window
    hot = {n: x for n, x in snap.nodes.items()
           if x.bursts and max(x.tx_peak_util, x.rx_peak_util) >= t.microburst_util
           and x.qdisc_drops == 0}
    if not hot:
        return []
    peak = max(max(x.tx_peak_util, x.rx_peak_util) for x in hot.values())
    bursts = sum(x.bursts for x in hot.values())
    seconds = max(1, w.end_s - w.start_s)
    return [Candidate(
        Cause.MICROBURST, "info", {}, f"Microbursts at {peak:.0%} of line rate on "
        f"{', '.join(sorted(hot))} ({bursts / seconds:.0f}/s) without loss or queueing: "
        "the training's synchronized bursts, normal", w.start_ns, w.end_ns,
        evidence=[Evidence("nic_window", "peak 100 us utilisation", round(peak, 3), "fraction",
                           w.start_ns, w.end_ns, sorted(hot)),
                  Evidence("nic_window", "bursts per second", round(bursts / seconds, 1), "/s",
                           w.start_ns, w.end_ns, sorted(hot))])]


def _clean(snap: Snapshot) -> list[RuledOut]:
    if not snap.data_cells:
        return []
    worst = max(snap.data_cells, key=lambda c: c.loss_ratio)
    out = [RuledOut(Cause.LOSSY_LINK, f"no hop resent more than {worst.loss_ratio:.3%} of its "
                    f"payload (threshold {snap.thresholds.loss_ratio:.1%})")]
    rtts = [c.rtt_p50_us for c in snap.data_cells if c.rtt_p50_us is not None]
    if rtts and snap.rtt_floor_us is not None:
        out.append(RuledOut(Cause.BUFFER_SATURATION, f"RTT medians {min(rtts):.0f}-{max(rtts):.0f}"
                            f" us against a floor of {snap.rtt_floor_us:.0f} us: no standing "
                            "queue, no overflow"))
    return out
