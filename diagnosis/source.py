"""Reading a job's evidence out of the store: the same InfluxQL for the live engine
(a few trailing seconds each tick) and for `diagnose --recompute` (one window).

Per second and cell (a node's flows to one peer): tcp_flow sums and RTT
medians; per second and node: tcp_node totals, nic_window peaks and bursts,
nic_qdisc drops and backlog; the job's gloo_step and its data_load / checkpoint
gloo_phase rows as they are; each node's latest tcp_node window (its agent's
heartbeat: written every window, zero when idle) and agent_loss.

Which job a flow belongs to comes from the owner tags the agents put on it
(job, rank); the nodes of a job are those its ranks' gloo_step records come
from.
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnosis.evidence import (SECOND, CellKey, CellSecond, JobEvidence, NodeSecond, Phase,
                                Step)
from diagnosis.store import Store, quote, regex_of


@dataclass(frozen=True)
class Members:
    """A job's ranks as the store shows them: rank -> node."""

    job: str
    node_of_rank: dict[str, str]

    @property
    def nodes(self) -> list[str]:
        return sorted(set(self.node_of_rank.values()))


def _span(t0_ns: int, t1_ns: int) -> str:
    return f"time >= {int(t0_ns)} AND time < {int(t1_ns)}"


class StoreSource:
    def __init__(self, store: Store):
        self.store = store

    def jobs(self, t0_ns: int, t1_ns: int) -> dict[str, Members]:
        """The jobs whose ranks reported steps in [t0, t1)."""
        rows = self.store.query(f"SELECT last(sync_seconds) FROM gloo_step WHERE "
                                f"{_span(t0_ns, t1_ns)} GROUP BY job, rank, node")
        out: dict[str, dict[str, str]] = {}
        for r in rows:
            tags = r["_tags"]
            if tags.get("job"):
                out.setdefault(tags["job"], {})[tags.get("rank", "-")] = tags.get("node", "")
        return {job: Members(job, ranks) for job, ranks in out.items()}

    def read(self, members: Members, t0_ns: int, t1_ns: int,
             steps_from_ns: int | None = None, heartbeat_from_ns: int | None = None
             ) -> JobEvidence:
        """The job's evidence of [t0, t1) (steps and phases from steps_from_ns)."""
        ev = JobEvidence(members.job, node_of_rank=dict(members.node_of_rank))
        if not members.nodes:
            return ev
        span = _span(t0_ns, t1_ns)
        nodes = regex_of(members.nodes)
        self._cells(ev, members.job, span)
        self._nodes(ev, nodes, span)
        steps_span = _span(steps_from_ns if steps_from_ns is not None else t0_ns, t1_ns)
        self._steps(ev, members.job, steps_span)
        self._phases(ev, members.job, steps_span)
        hb_from = heartbeat_from_ns if heartbeat_from_ns is not None else t1_ns - 120 * SECOND
        self._heartbeats(ev, nodes, _span(hb_from, t1_ns))
        return ev

    def _cells(self, ev: JobEvidence, job: str, span: str) -> None:
        rows = self.store.query(
            "SELECT sum(bytes_acked) AS bytes_acked, sum(bytes_received) AS bytes_received, "
            "sum(retrans_segs) AS retrans_segs, sum(retrans_bytes) AS retrans_bytes, "
            "sum(timeouts) AS timeouts, median(rtt_p50_us) AS rtt_p50_us, "
            "median(rtt_p90_us) AS rtt_p90_us, sum(rtt_samples) AS rtt_samples "
            f"FROM tcp_flow WHERE job = {quote(job)} AND {span} "
            "GROUP BY time(1s), node, saddr, daddr, rank fill(none)")
        for r in rows:
            t = r["_tags"]
            key = CellKey(t.get("node", ""), t.get("saddr", ""), t.get("daddr", ""),
                          t.get("rank", ""))
            ev.addr_node.setdefault(key.addr, key.node)
            ev.cells.setdefault(key, {})[r["time"] // SECOND] = CellSecond(
                int(r["bytes_acked"] or 0), int(r["bytes_received"] or 0),
                int(r["retrans_segs"] or 0), int(r["retrans_bytes"] or 0),
                int(r["timeouts"] or 0), r["rtt_p50_us"], r["rtt_p90_us"],
                int(r["rtt_samples"] or 0))

    def _nodes(self, ev: JobEvidence, nodes: str, span: str) -> None:
        def table(node: str, t_ns: int) -> NodeSecond:
            return ev.nodes.setdefault(node, {}).setdefault(t_ns // SECOND, NodeSecond())

        for r in self.store.query(
                "SELECT sum(segs_out) AS segs_out, sum(retrans_segs) AS retrans_segs, "
                "sum(timeouts) AS timeouts, sum(bytes_out) AS bytes_out FROM tcp_node "
                f"WHERE node =~ {nodes} AND {span} GROUP BY time(1s), node fill(none)"):
            s = table(r["_tags"]["node"], r["time"])
            s.segs_out, s.retrans_segs = int(r["segs_out"] or 0), int(r["retrans_segs"] or 0)
            s.timeouts, s.bytes_out = int(r["timeouts"] or 0), int(r["bytes_out"] or 0)
        for r in self.store.query(
                "SELECT max(peak_util) AS peak_util, sum(hot_bins) AS hot_bins, "
                f"sum(bursts) AS bursts FROM nic_window WHERE node =~ {nodes} AND {span} "
                "GROUP BY time(1s), node, direction fill(none)"):
            s = table(r["_tags"]["node"], r["time"])
            util = float(r["peak_util"] or 0.0)
            if r["_tags"].get("direction") == "tx":
                s.tx_peak_util = max(s.tx_peak_util, util)
            else:
                s.rx_peak_util = max(s.rx_peak_util, util)
            s.hot_bins += int(r["hot_bins"] or 0)
            s.bursts += int(r["bursts"] or 0)
        for r in self.store.query(
                "SELECT sum(drops) AS drops, max(backlog_bytes) AS backlog FROM nic_qdisc "
                f"WHERE node =~ {nodes} AND {span} GROUP BY time(1s), node fill(none)"):
            s = table(r["_tags"]["node"], r["time"])
            s.qdisc_drops, s.qdisc_backlog_bytes = int(r["drops"] or 0), int(r["backlog"] or 0)

    def _steps(self, ev: JobEvidence, job: str, span: str) -> None:
        for r in self.store.query(
                "SELECT seconds, sync_seconds, compute_seconds, retrans_segs, "
                f"sync_retrans_segs, rank, node FROM gloo_step WHERE job = {quote(job)} "
                f"AND {span}"):
            rank, node = r.get("rank") or "-", r.get("node") or ""
            ev.node_of_rank.setdefault(rank, node)
            ev.steps.setdefault(rank, {})[r["time"]] = Step(
                rank, node, int(r["time"]), r.get("seconds"), float(r["sync_seconds"] or 0.0),
                r.get("compute_seconds"), int(r.get("retrans_segs") or 0),
                int(r.get("sync_retrans_segs") or 0))

    def _phases(self, ev: JobEvidence, job: str, span: str) -> None:
        for r in self.store.query(
                "SELECT seconds, bytes, peer, phase, rank, node FROM gloo_phase WHERE "
                f"job = {quote(job)} AND (phase = 'data_load' OR phase = 'checkpoint') "
                f"AND {span}"):
            rank = r.get("rank") or "-"
            ev.phases.setdefault(rank, {})[(r["time"], r["phase"])] = Phase(
                rank, r.get("node") or "", int(r["time"]), r["phase"],
                float(r["seconds"] or 0.0), int(r.get("bytes") or 0), r.get("peer") or "")

    def _heartbeats(self, ev: JobEvidence, nodes: str, span: str) -> None:
        for r in self.store.query(f"SELECT last(seconds) FROM tcp_node WHERE node =~ {nodes} "
                                  f"AND {span} GROUP BY node"):
            ev.last_seen_ns[r["_tags"]["node"]] = int(r["time"])
        for r in self.store.query(f"SELECT max(records) AS records FROM agent_loss WHERE "
                                  f"node =~ {nodes} AND {span} GROUP BY node"):
            ev.lost_records[r["_tags"]["node"]] = int(r["records"] or 0)
