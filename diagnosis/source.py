"""Reading a job's evidence out of the store: the same InfluxQL for the live engine
(a few trailing seconds each tick) and for `diagnose --recompute` (one window).

Per second and cell (a node's flows to one peer): tcp_flow sums and RTT
medians; per second and node: tcp_node totals, nic_window peaks and bursts,
nic_qdisc drops and backlog; the job's gloo_step and its data_load / checkpoint
gloo_phase rows as they are; each node's latest tcp_node window (its agent's
heartbeat: written every window, zero when idle) and agent_loss.

Which job a flow belongs to comes from the owner tags the agents put on it
(job, rank); the nodes of a job are those its ranks' step records come from.

A job's steps have one source (Members.source), gloo's or NCCL's:
- gloo_step (with gloo_progress) wherever it exists: it is the richer, carrying the
  grad sync split, the retransmits inside it, CPU throttling and the steps in
  progress. A job with both gloo_step and nccl_step records (a PyTorch job whose
  CPU groups run gloo beside NCCL) is read from gloo_step only, never twice.
- nccl_step otherwise: the step times of the NCCL calls' pattern. Its grad sync
  comes from the profiler plugin's ncclprof_collective records where the plugin
  runs: the union of the GPU kernel windows of the collectives the rank enqueued
  inside the step. A rank that enters late finds its peers already spinning in the
  kernel, so, as with gloo, the others' sync grows and the late rank's compute
  stands out. Without the plugin a step's grad sync is unknown and read as 0 (its
  source says NCCL), so the causes that need the split stay silent.
The job's RAS polls (nccl_ras_comm, nccl_ras_rank) are read for either source.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, field
from operator import itemgetter
from typing import NamedTuple

from fabricscope.diagnosis.evidence import (SECOND, CellKey, CellSecond, JobEvidence, NodeSecond, Phase,
                                Progress, RasRank, Step, StepSource, update_changed)
from fabricscope.diagnosis.store import Store, quote, regex_of


@dataclass(frozen=True)
class Members:
    """A job's ranks as the store shows them: rank -> node."""

    job: str
    node_of_rank: dict[str, str]
    source: StepSource = StepSource.GLOO     # GLOO or NCCL: where its steps are read from

    @property
    def nodes(self) -> list[str]:
        return sorted(set(self.node_of_rank.values()))


def _span(t0_ns: int, t1_ns: int) -> str:
    return f"time >= {int(t0_ns)} AND time < {int(t1_ns)}"


MAX_GROUPS = 4       # statements per table and read: the later starts, rounded together


@dataclass(frozen=True)
class Starts:
    """Where a read of steps or phases begins: at all_ns, and for the ranks in own_ns
    at a later time of their own (a live tick need not reread what each has already
    reported: diagnosis/live.py)."""

    all_ns: int
    own_ns: dict[str, int] = field(default_factory=dict)

    def wheres(self, tag: str, t1_ns: int, slack_ns: int) -> list[str]:
        """WHERE conditions that together cover the read, one statement each: names
        whose starts lie within slack_ns of the group's first share its start (at
        most MAX_GROUPS groups: the slack doubles until they fit); every other
        series (names without a later start, and series without the tag) from
        all_ns."""
        later = sorted((t, name) for name, t in self.own_ns.items() if t > self.all_ns)
        if not later:
            return [_span(self.all_ns, t1_ns)]
        while True:
            groups: list[tuple[int, list[str]]] = []
            for t, name in later:
                if groups and t - groups[-1][0] <= slack_ns:
                    groups[-1][1].append(name)
                else:
                    groups.append((t, [name]))
            if len(groups) <= MAX_GROUPS:
                break
            slack_ns = max(2 * slack_ns, SECOND // 10)
        rest = f"{tag} !~ {regex_of(name for _, name in later)} AND " \
            f"{_span(self.all_ns, t1_ns)}"
        return [rest] + [f"{tag} =~ {regex_of(names)} AND {_span(t, t1_ns)}"
                         for t, names in groups]


def _starts(at: "int | Starts") -> Starts:
    return at if isinstance(at, Starts) else Starts(int(at))


class StoreSource:
    def __init__(self, store: Store):
        self.store = store

    def jobs(self, t0_ns: int, t1_ns: int) -> dict[str, Members]:
        """The jobs whose ranks reported steps in [t0, t1): from gloo_step, and from
        nccl_step those that have none in gloo_step (one source per job); and the jobs
        with gloo collectives in it but no steps (a served model has none): their
        network and class causes are judged all the same."""
        out = self._members("gloo_step", "sync_seconds", t0_ns, t1_ns, StepSource.GLOO)
        for table, column, source in (("nccl_step", "seconds", StepSource.NCCL),
                                      ("gloo_collective", "seconds", StepSource.GLOO)):
            for job, members in self._members(table, column, t0_ns, t1_ns, source).items():
                out.setdefault(job, members)
        return out

    def _members(self, table: str, field_name: str, t0_ns: int, t1_ns: int,
                 source: StepSource) -> dict[str, Members]:
        rows = self.store.query(f"SELECT last({field_name}) FROM {table} WHERE "
                                f"{_span(t0_ns, t1_ns)} GROUP BY job, rank, node")
        out: dict[str, dict[str, str]] = {}
        for r in rows:
            tags = r["_tags"]
            if tags.get("job"):
                out.setdefault(tags["job"], {})[tags.get("rank", "-")] = tags.get("node", "")
        return {job: Members(job, ranks, source) for job, ranks in out.items()}

    def read(self, members: Members, t0_ns: int, t1_ns: int,
             steps_from: "int | Starts | None" = None, heartbeat_from_ns: int | None = None,
             heartbeats: bool = True, into: JobEvidence | None = None,
             phases_from: "int | Starts | None" = None) -> JobEvidence:
        """The job's evidence of [t0, t1), its cells and nodes in whole seconds (steps
        from steps_from, phases from phases_from, default the steps'; each a time in
        ns or per-rank Starts). Each node's latest window is looked up from
        heartbeat_from_ns (default: two minutes back) unless `heartbeats` is False:
        then the windows read say it (a live tick that knows the older ones).

        `into`: evidence to read into, as JobEvidence.merge would take a fresh read
        (what is read again replaces what was there where it differs, and only
        there): a live tick rereads mostly rows it holds, and leaving those be spares
        building each of them again. A read that fails part-way leaves in `into` the
        rows it had read, which are true; the next read fills in the rest."""
        ev = into if into is not None else JobEvidence(members.job)
        ev.node_of_rank.update(members.node_of_rank)
        if not members.nodes:
            return ev
        # cells and nodes from the start of t0's second: a node's tables stamp their
        # windows at phases of their own within a second (its NIC windows run on the
        # kernel's monotonic clock), and a read from inside a second summed the rows
        # after that point as the whole second, replacing what an earlier read held
        cells = [_span(t0_ns - t0_ns % SECOND, t1_ns)]
        nodes = regex_of(members.nodes)
        self._cells(ev, members.job, cells)
        self._nodes(ev, nodes, cells)
        steps = _starts(steps_from if steps_from is not None else t0_ns)
        step_wheres = steps.wheres("rank", t1_ns, SECOND // 2)
        if members.source is StepSource.GLOO:
            self._steps(ev, members, step_wheres)
            self._progress(ev, members.job, step_wheres)
        else:
            self._nccl_steps(ev, members, step_wheres)
        self._ras(ev, members.job, cells[0])
        self._phases(ev, members.job, _starts(phases_from if phases_from is not None
                                              else steps).wheres("rank", t1_ns, SECOND // 2))
        hb_from = heartbeat_from_ns if heartbeat_from_ns is not None else t1_ns - 120 * SECOND
        self._heartbeats(ev, nodes, _span(hb_from, t1_ns), heartbeats)
        return ev

    def _series(self, select: str, wheres: list[str], group_by: str):
        """The answers of one statement per WHERE condition, asked in one request."""
        return self.store.series("; ".join(f"{select} AND {where} GROUP BY {group_by}"
                                           for where in wheres))

    def _cells(self, ev: JobEvidence, job: str, wheres: list[str]) -> None:
        addr_node: dict[str, str] = {}
        for tags, columns, values in self._series(
                f"SELECT {', '.join(CellSecond._fields)} FROM tcp_flow WHERE "
                f"job = {quote(job)}", wheres, "node, saddr, daddr, rank"):
            key = CellKey(tags.get("node", ""), tags.get("saddr", ""), tags.get("daddr", ""),
                          tags.get("rank", ""))
            addr_node.setdefault(key.addr, key.node)
            update_changed(ev.cells.setdefault(key, {}), _per_second(
                values, _picker(columns, CellSecond._fields), _combine_cells), CellSecond)
        ev.addr_node.update(addr_node)

    def _nodes(self, ev: JobEvidence, nodes: str, wheres: list[str]) -> None:
        tcp: dict[str, dict[int, tuple]] = {}     # node -> second -> tcp_node's fields
        nic: dict[tuple[str, str], dict[int, tuple]] = {}   # (node, direction) -> ...
        qdisc: dict[str, dict[int, tuple]] = {}
        for tags, columns, values in self._series(
                f"SELECT {', '.join(_TCP_NODE)} FROM tcp_node WHERE node =~ {nodes}",
                wheres, "node"):
            node = tags["node"]
            if values:
                ev.last_seen_ns[node] = max(ev.last_seen_ns.get(node, 0), values[-1][0])
            tcp[node] = _per_second(values, _picker(columns, _TCP_NODE), _combine_sums)
        for tags, columns, values in self._series(
                f"SELECT {', '.join(_NIC)} FROM nic_window WHERE node =~ {nodes}",
                wheres, "node, direction"):
            nic[(tags["node"], "tx" if tags.get("direction") == "tx" else "rx")] = \
                _per_second(values, _picker(columns, _NIC), _combine_nic)
        for tags, columns, values in self._series(
                f"SELECT drops, backlog_bytes FROM nic_qdisc WHERE node =~ {nodes}",
                wheres, "node"):
            qdisc[tags["node"]] = _per_second(
                values, _picker(columns, ("drops", "backlog_bytes")), _combine_qdisc)
        empty: dict = {}
        for node in set(tcp) | {n for n, _ in nic} | set(qdisc):
            t, tx, rx, q = (tcp.get(node, empty), nic.get((node, "tx"), empty),
                            nic.get((node, "rx"), empty), qdisc.get(node, empty))
            seconds: dict[int, tuple] = {}
            for second in t.keys() | tx.keys() | rx.keys() | q.keys():
                util_tx, hot_tx, bursts_tx, bps_tx = tx.get(second, _NIC_ZERO)
                util_rx, hot_rx, bursts_rx, bps_rx = rx.get(second, _NIC_ZERO)
                seconds[second] = (*t.get(second, _TCP_ZERO), max(0.0, float(util_tx)),
                                   max(0.0, float(util_rx)), hot_tx + hot_rx,
                                   bursts_tx + bursts_rx, *q.get(second, _QDISC_ZERO),
                                   max(0.0, float(bps_tx)), max(0.0, float(bps_rx)))
            update_changed(ev.nodes.setdefault(node, {}), seconds, NodeSecond)

    def _steps(self, ev: JobEvidence, members: Members, wheres: list[str]) -> None:
        node_of_rank: dict[str, str] = {}
        for tags, columns, values in self._series(
                "SELECT seconds, sync_seconds, compute_seconds, retrans_segs, "
                "sync_retrans_segs, throttled_seconds, cpu_limit, cpu_limit_held FROM "
                f"gloo_step WHERE job = {quote(members.job)}", wheres, "rank, node"):
            rank, node = tags.get("rank") or "-", tags.get("node") or ""
            node_of_rank.setdefault(rank, node)
            table, added = ev.steps.setdefault(rank, {}), []
            pick = _picker(columns, ("time", "seconds", "sync_seconds", "compute_seconds",
                                     "retrans_segs", "sync_retrans_segs", "throttled_seconds",
                                     "cpu_limit", "cpu_limit_held"))
            for v in values:
                fields = pick(v)
                time_ns, seconds, sync, compute, retrans, sync_retrans, throttled, limit, \
                    held = fields
                if sync is None:          # the agent writes every field of a step at once:
                    continue              # a row without sync_seconds is one being written
                step = (seconds, float(sync), compute, retrans or 0, sync_retrans or 0,
                        None if throttled is None else float(throttled),
                        None if limit is None else float(limit), bool(held),
                        StepSource.GLOO)
                old = table.get(time_ns)
                if old is None:
                    added.append(time_ns)
                elif old[3:] == step and old.node == node:
                    continue
                table[time_ns] = Step(rank, node, time_ns, *step)
            ev.keys_added("steps", rank, added)
        ev.node_of_rank.update((rank, node) for rank, node in node_of_rank.items()
                               if rank not in members.node_of_rank)

    def _nccl_steps(self, ev: JobEvidence, members: Members, wheres: list[str]) -> None:
        """The job's nccl_step records as steps, their grad sync from the profiler's
        kernel windows where it has them (the module's docstring)."""
        kernels = self._kernels(members.job, wheres)
        node_of_rank: dict[str, str] = {}
        for tags, columns, values in self._series(
                f"SELECT seconds FROM nccl_step WHERE job = {quote(members.job)}", wheres,
                "rank, node"):
            rank, node = tags.get("rank") or "-", tags.get("node") or ""
            node_of_rank.setdefault(rank, node)
            table, added = ev.steps.setdefault(rank, {}), []
            windows = kernels.get(rank)
            for time_ns, seconds in map(_picker(columns, ("time", "seconds")), values):
                if seconds is None:       # a row being written
                    continue
                seconds = float(seconds)
                sync = _sync_in(windows, time_ns, seconds) if windows else None
                step = Step(rank, node, time_ns, seconds, sync or 0.0, seconds - (sync or 0.0),
                            source=StepSource.NCCL if sync is None
                            else StepSource.NCCL_PROFILED)
                old = table.get(time_ns)
                if old is None:
                    added.append(time_ns)
                elif old == step:
                    continue
                table[time_ns] = step
            ev.keys_added("steps", rank, added)
        ev.node_of_rank.update((rank, node) for rank, node in node_of_rank.items()
                               if rank not in members.node_of_rank)

    def _kernels(self, job: str, wheres: list[str]) -> dict[str, "_Kernels"]:
        """Each rank's collectives with GPU kernel times (ncclprof_collective), in
        enqueue order. Those the plugin closed itself (`incomplete`: its stale sweep or
        finalize) are left out: their times are partial, and the sweep closes a
        collective only long after NCCL stopped reporting it."""
        out: dict[str, _Kernels] = {}
        for tags, columns, values in self._series(
                "SELECT kernel_seconds, kernel_start_ns, kernel_end_ns, incomplete FROM "
                f"ncclprof_collective WHERE job = {quote(job)}", wheres, "rank"):
            rows = sorted(row for row in map(_picker(columns, (
                "time", "kernel_seconds", "kernel_start_ns", "kernel_end_ns", "incomplete")),
                values) if row[1] is not None and not row[4])
            if rows:
                out[tags.get("rank") or "-"] = _Kernels([r[0] for r in rows], rows)
        return out

    def _ras(self, ev: JobEvidence, job: str, span: str) -> None:
        """The job's RAS polls and the ranks each reported in trouble (one request)."""
        q = quote(job)
        polls: dict[str, int] = {}
        ranks = []
        for tags, columns, values in self.store.series(
                f"SELECT nranks FROM nccl_ras_comm WHERE job = {q} AND {span} GROUP BY comm; "
                f"SELECT host FROM nccl_ras_rank WHERE job = {q} AND {span} "
                "GROUP BY comm, rank, state"):
            comm = tags.get("comm", "")
            if "rank" not in tags:          # a poll of the communicator (time first)
                if values:
                    polls[comm] = max(max(v[0] for v in values), polls.get(comm, 0))
                continue
            ranks += [RasRank(comm, tags["rank"], t, tags.get("state", ""), str(host or ""))
                      for t, host in map(_picker(columns, ("time", "host")), values)]
        ev.take_ras(polls, ranks)

    def _progress(self, ev: JobEvidence, job: str, wheres: list[str]) -> None:
        """The ranks' reports of their steps in progress (one point per step: each
        report replaces the last in the store); read from where the steps are read,
        since a step in progress starts after the last one reported."""
        for tags, columns, values in self._series(
                "SELECT seconds, sync_seconds, waiting, throttled_seconds FROM gloo_progress "
                f"WHERE job = {quote(job)}", wheres, "rank, node"):
            rank, node = tags.get("rank") or "-", tags.get("node") or ""
            pick = _picker(columns, ("time", "seconds", "sync_seconds", "waiting",
                                     "throttled_seconds"))
            held = ev.progress.get(rank, {})
            for v in values:
                time_ns, seconds, sync, waiting, throttled = pick(v)
                if seconds is None or sync is None:
                    continue
                fields = (float(seconds), float(sync), bool(waiting),
                          None if throttled is None else float(throttled))
                old = held.get(time_ns)
                if old is not None and old[3:] == fields and old.node == node:
                    continue              # read again as it was: most of a tick's reports
                ev.take_progress(Progress(rank, node, time_ns, *fields))

    def _phases(self, ev: JobEvidence, job: str, wheres: list[str]) -> None:
        # a rank's kinds come as series of their own; its new keys go to its kept
        # orders at once, so that the order of all its phases takes them in one step
        added: dict[str, list] = {}
        for tags, columns, values in self._series(
                "SELECT seconds, bytes, peer FROM gloo_phase WHERE "
                f"job = {quote(job)} AND (phase = 'data_load' OR phase = 'checkpoint')",
                wheres, "rank, node, phase"):
            rank, phase, node = tags.get("rank") or "-", tags.get("phase"), \
                tags.get("node") or ""
            table, new = ev.phases.setdefault(rank, {}), added.setdefault(rank, [])
            pick = _picker(columns, ("time", "seconds", "bytes", "peer"))
            for v in values:
                time_ns, seconds, size, peer = pick(v)
                fields = (float(seconds or 0.0), size or 0, peer or "")
                key = (time_ns, phase)
                old = table.get(key)
                if old is None:
                    new.append(key)
                elif old[4:] == fields and old.node == node:
                    continue
                table[key] = Phase(rank, node, time_ns, phase, *fields)
        for rank, keys in added.items():
            ev.keys_added("phases", rank, keys)

    def _heartbeats(self, ev: JobEvidence, nodes: str, span: str, latest: bool) -> None:
        if latest:
            for r in self.store.query(f"SELECT last(seconds) FROM tcp_node WHERE node =~ "
                                      f"{nodes} AND {span} GROUP BY node"):
                node = r["_tags"]["node"]
                ev.last_seen_ns[node] = max(ev.last_seen_ns.get(node, 0), int(r["time"]))
        for r in self.store.query(f"SELECT max(records) AS records FROM agent_loss WHERE "
                                  f"node =~ {nodes} AND {span} GROUP BY node"):
            node = r["_tags"]["node"]
            ev.lost_records[node] = max(ev.lost_records.get(node, 0), int(r["records"] or 0))


class _Kernels(NamedTuple):
    """One rank's collectives: enqueue times (sorted) and (time, kernel_seconds,
    kernel_start_ns, kernel_end_ns, incomplete) rows in the same order."""

    times: list[int]
    rows: list[tuple]


def _sync_in(kernels: _Kernels, t_ns: int, seconds: float) -> float | None:
    """The GPU time inside collectives of the collectives enqueued in [t, t + seconds):
    the union of their kernel windows where they carry both ends (one process's ends
    share a clock, GPU or host), else the sum of their kernel_seconds; at most the
    step. None: no collective of the step has kernel times."""
    lo = bisect.bisect_left(kernels.times, t_ns)
    hi = bisect.bisect_left(kernels.times, t_ns + int(seconds * SECOND), lo)
    rows = kernels.rows[lo:hi]
    if not rows:
        return None
    spans = sorted((r[2], r[3]) for r in rows if r[2] is not None and r[3] is not None)
    total = sum(float(r[1]) for r in rows if r[2] is None or r[3] is None)
    end = None
    for start, stop in spans:
        if end is None or start > end:
            total += (stop - start) / SECOND
            end = stop
        elif stop > end:
            total += (stop - end) / SECOND
            end = stop
    return min(max(0.0, total), seconds)


# Per-second tables are summed here from the raw points, not by InfluxQL's
# GROUP BY time(1s): InfluxDB 1.x builds one cursor per series, field and aggregate
# for that, which made the cells' query cost influxd ~8x a plain read of the same
# points (measured with bench/diagnosis_cost.py's fleet). The sums, maxima and
# medians are InfluxQL's: nulls left out, and an even count's median is
# lo + (hi - lo) / 2 as InfluxDB computes it (tests/unit/test_diagnosis_source.py
# checks them against GROUP BY time(1s)). A tick reads tens of thousands of rows,
# so the common row (one per series and second, no nulls) takes the shortest path.
_TCP_NODE = ("segs_out", "retrans_segs", "timeouts", "bytes_out")
_TCP_ZERO, _NIC_ZERO, _QDISC_ZERO = (0, 0, 0, 0), (0.0, 0, 0, 0.0), (0, 0)
#: nic_window's fields the engine reads: peak_util only where the link has a line rate
_NIC = ("peak_util", "hot_bins", "bursts", "peak_bps")


def _per_second(values: list[list], pick, combine) -> dict[int, tuple]:
    """UNIX second -> the picked fields of one series' rows in it: a row's own where
    it is the second's only one and has no nulls (most), else combine(rows)."""
    out: dict[int, tuple] = {}
    several: dict[int, list[tuple]] = {}
    for v in values:
        second = v[0] // SECOND
        if second in out:
            several.setdefault(second, [out[second]]).append(pick(v))
        else:
            out[second] = pick(v)
    for second, fields in out.items():
        if second in several:
            out[second] = combine(several[second])
        elif None in fields:
            out[second] = combine([fields])
    return out


@functools.lru_cache(maxsize=64)
def _picker_of(columns: tuple[str, ...], names: tuple[str, ...]):
    return itemgetter(*(columns.index(n) for n in names))


def _picker(columns: list[str], names: tuple[str, ...]):
    """A row's named fields, in order (InfluxDB names every selected field, null or
    not; every series of an answer has the same columns)."""
    return _picker_of(tuple(columns), names)


def _total(column: tuple) -> int:
    return sum(column) if None not in column else sum(x for x in column if x is not None)


def _combine_cells(rows: list[tuple]) -> tuple:
    if len(rows) == 2 and None not in rows[0] and None not in rows[1]:
        # the common case: two connections to one peer in a second (a storage
        # server's read and checkpoint flows), every field set
        a, b = rows
        return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4],
                _middle(a[5], b[5]), _middle(a[6], b[6]), a[7] + b[7], a[8] + b[8],
                a[9] + b[9])
    cols = list(zip(*rows))
    return (*(_total(cols[i]) for i in range(5)), _median(cols[5]), _median(cols[6]),
            *(_total(cols[i]) for i in (7, 8, 9)))


def _combine_sums(rows: list[tuple]) -> tuple:
    return tuple(_total(column) for column in zip(*rows))


def _combine_nic(rows: list[tuple]) -> tuple:
    util, hot, bursts, bps = zip(*rows)
    return _max(util) or 0.0, _total(hot), _total(bursts), _max(bps) or 0.0


def _combine_qdisc(rows: list[tuple]) -> tuple:
    drops, backlog = zip(*rows)
    return _total(drops), int(_max(backlog) or 0)


def _max(column: tuple):
    values = [x for x in column if x is not None]
    return max(values) if values else None


def _middle(x, y) -> float:
    """The median of two values, as InfluxDB computes it."""
    lo, hi = (x, y) if x <= y else (y, x)
    return float(lo + (hi - lo) / 2)


def _median(column: tuple) -> float | None:
    values = sorted(x for x in column if x is not None)
    if not values:
        return None
    mid = len(values) // 2
    if len(values) % 2:
        return float(values[mid])
    return _middle(values[mid - 1], values[mid])
