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
            f"SELECT {', '.join(CELL_FIELDS)} FROM tcp_flow WHERE job = {quote(job)} AND "
            f"{span} GROUP BY node, saddr, daddr, rank")
        for tags, second, rs in _per_second(rows):
            key = CellKey(tags.get("node", ""), tags.get("saddr", ""), tags.get("daddr", ""),
                          tags.get("rank", ""))
            ev.addr_node.setdefault(key.addr, key.node)
            total = {f: _sum(rs, f) for f in CELL_SUMS}
            ev.cells.setdefault(key, {})[second] = CellSecond(
                total["bytes_acked"], total["bytes_received"], total["retrans_segs"],
                total["retrans_bytes"], total["timeouts"], _median(rs, "rtt_p50_us"),
                _median(rs, "rtt_p90_us"), total["rtt_samples"])

    def _nodes(self, ev: JobEvidence, nodes: str, span: str) -> None:
        def table(node: str, second: int) -> NodeSecond:
            return ev.nodes.setdefault(node, {}).setdefault(second, NodeSecond())

        for tags, second, rs in _per_second(self.store.query(
                "SELECT segs_out, retrans_segs, timeouts, bytes_out FROM tcp_node "
                f"WHERE node =~ {nodes} AND {span} GROUP BY node")):
            s = table(tags["node"], second)
            s.segs_out, s.retrans_segs = _sum(rs, "segs_out"), _sum(rs, "retrans_segs")
            s.timeouts, s.bytes_out = _sum(rs, "timeouts"), _sum(rs, "bytes_out")
        for tags, second, rs in _per_second(self.store.query(
                "SELECT peak_util, hot_bins, bursts FROM nic_window WHERE node =~ "
                f"{nodes} AND {span} GROUP BY node, direction")):
            s = table(tags["node"], second)
            util = float(_max(rs, "peak_util") or 0.0)
            if tags.get("direction") == "tx":
                s.tx_peak_util = max(s.tx_peak_util, util)
            else:
                s.rx_peak_util = max(s.rx_peak_util, util)
            s.hot_bins += _sum(rs, "hot_bins")
            s.bursts += _sum(rs, "bursts")
        for tags, second, rs in _per_second(self.store.query(
                "SELECT drops, backlog_bytes FROM nic_qdisc WHERE node =~ "
                f"{nodes} AND {span} GROUP BY node")):
            s = table(tags["node"], second)
            s.qdisc_drops, s.qdisc_backlog_bytes = _sum(rs, "drops"), \
                int(_max(rs, "backlog_bytes") or 0)

    def _steps(self, ev: JobEvidence, job: str, span: str) -> None:
        for r in _in_time_order(self.store.query(
                "SELECT seconds, sync_seconds, compute_seconds, retrans_segs, "
                f"sync_retrans_segs FROM gloo_step WHERE job = {quote(job)} AND {span} "
                "GROUP BY rank, node")):
            rank, node = r["_tags"].get("rank") or "-", r["_tags"].get("node") or ""
            ev.node_of_rank.setdefault(rank, node)
            ev.steps.setdefault(rank, {})[r["time"]] = Step(
                rank, node, int(r["time"]), r.get("seconds"), float(r["sync_seconds"] or 0.0),
                r.get("compute_seconds"), int(r.get("retrans_segs") or 0),
                int(r.get("sync_retrans_segs") or 0))

    def _phases(self, ev: JobEvidence, job: str, span: str) -> None:
        for r in _in_time_order(self.store.query(
                "SELECT seconds, bytes, peer FROM gloo_phase WHERE "
                f"job = {quote(job)} AND (phase = 'data_load' OR phase = 'checkpoint') "
                f"AND {span} GROUP BY rank, node, phase")):
            tags = r["_tags"]
            rank, phase = tags.get("rank") or "-", tags.get("phase")
            ev.phases.setdefault(rank, {})[(r["time"], phase)] = Phase(
                rank, tags.get("node") or "", int(r["time"]), phase,
                float(r["seconds"] or 0.0), int(r.get("bytes") or 0), r.get("peer") or "")

    def _heartbeats(self, ev: JobEvidence, nodes: str, span: str) -> None:
        for r in self.store.query(f"SELECT last(seconds) FROM tcp_node WHERE node =~ {nodes} "
                                  f"AND {span} GROUP BY node"):
            ev.last_seen_ns[r["_tags"]["node"]] = int(r["time"])
        for r in self.store.query(f"SELECT max(records) AS records FROM agent_loss WHERE "
                                  f"node =~ {nodes} AND {span} GROUP BY node"):
            ev.lost_records[r["_tags"]["node"]] = int(r["records"] or 0)


# Per-second tables are summed here from the raw points, not by InfluxQL's
# GROUP BY time(1s): InfluxDB 1.x builds one cursor per series, field and aggregate
# for that, which made the cells' query cost influxd ~8x a plain read of the same
# points (measured with bench/diagnosis_cost.py's fleet). The sums, maxima and
# medians are InfluxQL's: nulls left out, and an even count's median is
# lo + (hi - lo) / 2 as InfluxDB computes it.
CELL_SUMS = ("bytes_acked", "bytes_received", "retrans_segs", "retrans_bytes", "timeouts",
             "rtt_samples")
CELL_FIELDS = CELL_SUMS + ("rtt_p50_us", "rtt_p90_us")


def _per_second(rows: list[dict]) -> list[tuple[dict, int, list[dict]]]:
    """Rows of a query grouped by tags, as (tags, UNIX second, rows), in the order
    InfluxQL gives GROUP BY time(1s) rows: series by series, seconds in time order."""
    out: dict[tuple, tuple[dict, int, list[dict]]] = {}
    for r in rows:
        second = r["time"] // SECOND
        key = (tuple(sorted(r["_tags"].items())), second)
        if key not in out:
            out[key] = (r["_tags"], second, [])
        out[key][2].append(r)
    return list(out.values())


def _sum(rows: list[dict], name: str) -> int:
    return int(sum(r[name] for r in rows if r.get(name) is not None))


def _max(rows: list[dict], name: str):
    values = [r[name] for r in rows if r.get(name) is not None]
    return max(values) if values else None


def _median(rows: list[dict], name: str) -> float | None:
    values = sorted(r[name] for r in rows if r.get(name) is not None)
    if not values:
        return None
    mid = len(values) // 2
    if len(values) % 2:
        return float(values[mid])
    lo, hi = values[mid - 1], values[mid]
    return float(lo + (hi - lo) / 2)


def _in_time_order(rows: list[dict]) -> list[dict]:
    """Rows of series grouped by tags in the order of one ungrouped series: by time."""
    return sorted(rows, key=lambda r: r["time"])
