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
             steps_from_ns: int | None = None, heartbeat_from_ns: int | None = None,
             heartbeats: bool = True) -> JobEvidence:
        """The job's evidence of [t0, t1) (steps and phases from steps_from_ns). Each
        node's latest window is looked up from heartbeat_from_ns (default: two minutes
        back) unless `heartbeats` is False: then the windows read say it (a live tick
        that knows the older ones)."""
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
        self._heartbeats(ev, nodes, _span(hb_from, t1_ns), heartbeats)
        return ev

    def _cells(self, ev: JobEvidence, job: str, span: str) -> None:
        keys: dict[int, tuple[CellKey, list[int]]] = {}   # per series: its key, sum columns
        for tags, second, rows, col in _per_second(self.store.series(
                f"SELECT {', '.join(CELL_FIELDS)} FROM tcp_flow WHERE job = {quote(job)} "
                f"AND {span} GROUP BY node, saddr, daddr, rank")):
            known = keys.get(id(tags))
            if known is None:
                known = keys[id(tags)] = (
                    CellKey(tags.get("node", ""), tags.get("saddr", ""), tags.get("daddr", ""),
                            tags.get("rank", "")), [col[f] for f in CELL_SUMS])
                ev.addr_node.setdefault(known[0].addr, known[0].node)
            key, sums = known
            if len(rows) == 1:         # one flow to the peer: its window is the second
                v = rows[0]
                total = [int(v[i] or 0) for i in sums]
                p50, p90 = v[col["rtt_p50_us"]], v[col["rtt_p90_us"]]
                p50, p90 = (None if p50 is None else float(p50)), \
                    (None if p90 is None else float(p90))
            else:
                total = [_sum(rows, i) for i in sums]
                p50, p90 = _median(rows, col["rtt_p50_us"]), _median(rows, col["rtt_p90_us"])
            ev.cells.setdefault(key, {})[second] = CellSecond(*total[:5], p50, p90, total[5])

    def _nodes(self, ev: JobEvidence, nodes: str, span: str) -> None:
        fields: dict[tuple[str, int], dict] = {}     # (node, second) -> NodeSecond's fields

        def table(node: str, second: int) -> dict:
            return fields.setdefault((node, second), {})

        for tags, second, rows, col in _per_second(self.store.series(
                "SELECT segs_out, retrans_segs, timeouts, bytes_out FROM tcp_node "
                f"WHERE node =~ {nodes} AND {span} GROUP BY node")):
            ev.last_seen_ns[tags["node"]] = max(ev.last_seen_ns.get(tags["node"], 0),
                                                rows[-1][0])
            table(tags["node"], second).update(
                (name, _sum(rows, col[name]))
                for name in ("segs_out", "retrans_segs", "timeouts", "bytes_out"))
        for tags, second, rows, col in _per_second(self.store.series(
                "SELECT peak_util, hot_bins, bursts FROM nic_window WHERE node =~ "
                f"{nodes} AND {span} GROUP BY node, direction")):
            s = table(tags["node"], second)
            util = float(_max(rows, col["peak_util"]) or 0.0)
            peak = "tx_peak_util" if tags.get("direction") == "tx" else "rx_peak_util"
            s[peak] = max(s.get(peak, 0.0), util)
            s["hot_bins"] = s.get("hot_bins", 0) + _sum(rows, col["hot_bins"])
            s["bursts"] = s.get("bursts", 0) + _sum(rows, col["bursts"])
        for tags, second, rows, col in _per_second(self.store.series(
                "SELECT drops, backlog_bytes FROM nic_qdisc WHERE node =~ "
                f"{nodes} AND {span} GROUP BY node")):
            s = table(tags["node"], second)
            s["qdisc_drops"] = _sum(rows, col["drops"])
            s["qdisc_backlog_bytes"] = int(_max(rows, col["backlog_bytes"]) or 0)
        for (node, second), values in fields.items():
            ev.nodes.setdefault(node, {})[second] = NodeSecond(**values)

    def _steps(self, ev: JobEvidence, job: str, span: str) -> None:
        for tags, columns, values in self.store.series(
                "SELECT seconds, sync_seconds, compute_seconds, retrans_segs, "
                f"sync_retrans_segs FROM gloo_step WHERE job = {quote(job)} AND {span} "
                "GROUP BY rank, node"):
            rank, node = tags.get("rank") or "-", tags.get("node") or ""
            ev.node_of_rank.setdefault(rank, node)
            table = ev.steps.setdefault(rank, {})
            i = _columns(columns, "time", "seconds", "sync_seconds", "compute_seconds",
                         "retrans_segs", "sync_retrans_segs")
            for v in values:
                if v[i[2]] is None:       # the agent writes every field of a step at once:
                    continue              # a row without sync_seconds is one being written
                time_ns = v[i[0]]
                table[time_ns] = Step(rank, node, int(time_ns), v[i[1]], float(v[i[2]]),
                                      v[i[3]], int(v[i[4]] or 0), int(v[i[5]] or 0))

    def _phases(self, ev: JobEvidence, job: str, span: str) -> None:
        for tags, columns, values in self.store.series(
                "SELECT seconds, bytes, peer FROM gloo_phase WHERE "
                f"job = {quote(job)} AND (phase = 'data_load' OR phase = 'checkpoint') "
                f"AND {span} GROUP BY rank, node, phase"):
            rank, phase, node = tags.get("rank") or "-", tags.get("phase"), \
                tags.get("node") or ""
            table = ev.phases.setdefault(rank, {})
            i = _columns(columns, "time", "seconds", "bytes", "peer")
            for v in values:
                time_ns = v[i[0]]
                table[(time_ns, phase)] = Phase(rank, node, int(time_ns), phase,
                                                float(v[i[1]] or 0.0), int(v[i[2]] or 0),
                                                v[i[3]] or "")

    def _heartbeats(self, ev: JobEvidence, nodes: str, span: str, latest: bool) -> None:
        if latest:
            for r in self.store.query(f"SELECT last(seconds) FROM tcp_node WHERE node =~ "
                                      f"{nodes} AND {span} GROUP BY node"):
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


def _per_second(series) -> list[tuple[dict, int, list[list], dict[str, int]]]:
    """Series of a query as (tags, UNIX second, that second's rows of values, column
    index by name), in the order InfluxQL gives GROUP BY time(1s) rows: series by
    series, seconds in time order (a series' rows come in time order)."""
    out = []
    for tags, columns, values in series:
        col = {name: i for i, name in enumerate(columns)}
        current, rows = None, []
        for v in values:
            second = v[0] // SECOND
            if second != current:
                if rows:
                    out.append((tags, current, rows, col))
                current, rows = second, []
            rows.append(v)
        if rows:
            out.append((tags, current, rows, col))
    return out


def _columns(columns: list[str], *names: str) -> list[int]:
    """Where each named column is (InfluxDB names every selected field, null or not)."""
    return [columns.index(n) for n in names]


def _sum(rows: list[list], i: int) -> int:
    return int(sum(v[i] for v in rows if v[i] is not None))


def _max(rows: list[list], i: int):
    values = [v[i] for v in rows if v[i] is not None]
    return max(values) if values else None


def _median(rows: list[list], i: int) -> float | None:
    values = sorted(v[i] for v in rows if v[i] is not None)
    if not values:
        return None
    mid = len(values) // 2
    if len(values) % 2:
        return float(values[mid])
    lo, hi = values[mid - 1], values[mid]
    return float(lo + (hi - lo) / 2)
