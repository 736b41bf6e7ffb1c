"""The fabric as a graph for Grafana's node graph panel (topology_node / topology_edge).

Vertices: the spine, each ToR, each node of the job; edges: each node's port to
its ToR, each ToR's uplink to the spine, and the job's ring hops (a node to the
peer it sends its gradient share to). Health is 1, or 0 at the place of an
open warning or critical finding (its port, its uplink, its node); the main
numbers are retransmit ratios and RTTs of the last seconds.
"""

from __future__ import annotations

from fabricscope.diagnosis.evidence import SECOND
from fabricscope.diagnosis.finding import Finding, severity_rank
from fabricscope.diagnosis.snapshot import Snapshot
from fabricscope.records import Record


def graph_records(snap: Snapshot, findings: list[Finding], tor_of, now_ns: int) -> list[Record]:
    job = snap.job
    bad_nodes = {f.place["node"]: f.cause for f in findings
                 if f.open and severity_rank(f.severity) >= 1 and f.place.get("node")}
    bad_tors = {f.place["tor"]: f.cause for f in findings
                if f.open and severity_rank(f.severity) >= 1 and f.place.get("tor")
                and not f.place.get("node")}
    nodes = sorted(set(snap.evidence.node_of_rank.values()))
    rank_of = {n: r for r, n in snap.evidence.node_of_rank.items()}
    tors = sorted({tor_of(n) or "tor0" for n in nodes})
    out = [_vertex(job, "spine", "spine", "spine", "", 1.0, "ok", "", "", now_ns)]
    for tor in tors:
        out.append(_vertex(job, tor, "tor", tor, "", 0.0 if tor in bad_tors else 1.0,
                           bad_tors.get(tor, "ok"), "", "", now_ns))
        out.append(_edge(job, tor, "spine", "uplink", 0.0 if tor in bad_tors else 1.0, "",
                         0.0, 0.0, None, now_ns))
    for node in nodes:
        t = snap.nodes.get(node)
        ratio = t.retrans_ratio if t else 0.0
        health = 0.0 if node in bad_nodes else 1.0
        out.append(_vertex(job, node, "node", node, f"rank {rank_of.get(node, '-')} on "
                           f"{tor_of(node) or 'tor0'}", health, bad_nodes.get(node, "ok"),
                           f"{ratio:.2%} resent", "", now_ns))
        out.append(_edge(job, node, tor_of(node) or "tor0", "port", health,
                         f"{ratio:.2%} resent", (t.bytes_out / max(1, t.seconds)) if t else 0.0,
                         ratio, None, now_ns))
    seconds = max(1, snap.window.end_s - snap.window.start_s)
    for c in snap.data_cells:
        if c.peer_node not in nodes:
            continue
        bad = c in snap.lossy or c in snap.delayed
        out.append(_edge(job, c.key.node, c.peer_node, "ring", 0.0 if bad else 1.0,
                         f"{c.loss_ratio:.2%} resent", c.bytes_acked / seconds, c.loss_ratio,
                         c.rtt_p90_us, now_ns))
    return out


def _vertex(job, vid, kind, title, subtitle, health, status, main, second, now_ns) -> Record:
    return Record("topology_node", now_ns, {"id": vid, "kind": kind, "job": job},
                  {"title": title, "subtitle": subtitle, "health": float(health),
                   "status": status, "mainstat": main, "secondarystat": second})


def _edge(job, src, dst, kind, health, main, bps, ratio, rtt, now_ns) -> Record:
    fields = {"health": float(health), "mainstat": main, "bytes_per_s": float(bps),
              "retrans_ratio": float(ratio)}
    if rtt is not None:
        fields["rtt_p90_us"] = float(rtt)
    return Record("topology_edge", now_ns, {"id": f"{src}->{dst}", "source": src,
                                            "target": dst, "kind": kind, "job": job}, fields)


GRAPH_EVERY_NS = 5 * SECOND
