"""Each owned job's class, from its recent collectives, as job_class records.

    analyzer = JobClassAnalyzer(store, registry)
    records = analyzer.records(owned_jobs, now_ns)     # the collector writes them

Every EVERY_S the analyzer reads the last WINDOW_S of each job's collectives back
from the store (the same InfluxQL the engine uses, diagnosis/store.py): gloo's
(gloo_collective) and NCCL's as the profiler plugin closed them
(ncclprof_collective; GPU kernel time where the plugin saw the kernels, else
enqueue time). The classifier does not care which library ran a collective. NCCL
Inspector's records are not read: without verbose dumps each is stamped with the
dump's time, not the operation's start, and periods and gaps would be the dumps'.
The analyzer classifies them with fabricscope.jobclass.classify, and returns a
job_class point (fabricscope/measurements/jobclass.py) when the class differs from
the one it last wrote for the job, or REWRITE_S after that one. A job that changes kind is
re-classified as its window fills with the new kind's collectives (through
`mixed` while both are in it). A job with no collective rows in the window gets
no point: there is nothing to decide from.

Rows that cannot be used (no op tag, an op the classifier does not know, a bad
time, size or duration) are dropped and counted by cause, once each (a row stays
in the window for several reads), on /metrics as
fabricscope_job_class_rows_dropped_total{cause}, and per point in rows_dropped.
The read is capped at ROWS_PER_SERIES rows per rank and op, the newest.
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass

from fabricscope.commpeers import Membership, number_peers
from fabricscope.diagnosis.store import Store, quote
from fabricscope.jobclass import (FAMILY_OF_OP, Classification, JobClass, Observation,
                                  classify)
from fabricscope.measurements.jobclass import REWRITE_S
from fabricscope.records import Record

SECOND = 1_000_000_000
WINDOW_S = 30.0          # a few steps of a slow job, several "requests" of a server
EVERY_S = 10.0           # classifications per job: a job's kind changes rarely
ROWS_PER_SERIES = 5000   # newest rows per rank and op a read takes (cost cap)


@dataclass(frozen=True)
class CollectiveSource:
    """A measurement of collectives as each rank executed them: one row per operation,
    tagged job, rank and op, stamped at its start, with bytes and peer fields."""

    measurement: str
    seconds: tuple[str, ...]      # duration columns, the first present taken; every row
                                  # has the last
    comm_tag: str | None = None   # the tag naming the communicator, where one does


SOURCES = (CollectiveSource("gloo_collective", ("seconds",)),
           CollectiveSource("ncclprof_collective", ("kernel_seconds", "enqueue_seconds"),
                            comm_tag="comm"))


class Drop(str, enum.Enum):
    NO_OP = "no_op"
    UNKNOWN_OP = "unknown_op"
    BAD_TIME = "bad_time"
    BAD_BYTES = "bad_bytes"
    BAD_SECONDS = "bad_seconds"


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def observation_of(tags: dict, row: dict,
                   seconds_columns: tuple[str, ...] = ("seconds",)) -> Observation | Drop:
    """One stored collective row (tags of its series, {column: value}) as an
    Observation, or the cause it cannot be one; its duration is the first of
    seconds_columns present."""
    op = tags.get("op")
    if not op:
        return Drop.NO_OP
    if str(op).lower() not in FAMILY_OF_OP:
        return Drop.UNKNOWN_OP
    start = row.get("time")
    if not isinstance(start, int) or isinstance(start, bool) or start <= 0:
        return Drop.BAD_TIME
    size = row.get("bytes")
    if size is not None:
        # a store answering JSON may give an integer field as 1e6
        if not _number(size) or size < 0 or size != int(size):
            return Drop.BAD_BYTES
        size = int(size)
    seconds = next((row[c] for c in seconds_columns if row.get(c) is not None), None)
    if not _number(seconds) or seconds < 0:
        return Drop.BAD_SECONDS
    rank = str(tags.get("rank", ""))
    peer = row.get("peer")
    return Observation(str(op), size, start, start + int(seconds * SECOND),
                       rank=int(rank) if rank.isdigit() else None,
                       peer=int(peer) if _number(peer) and peer >= 0 else None)


def _whole(value) -> int | None:
    """A stored integer field, None where absent or not a whole number >= 0."""
    return int(value) if _number(value) and value >= 0 and value == int(value) else None


@dataclass
class Read:
    observations: list[Observation]
    dropped: dict[Drop, int]
    new_dropped: dict[Drop, int]       # of which in rows no earlier read saw
    #: Send/Recv peers whose training rank the window cannot tell (fabricscope.commpeers)
    peers_unnumbered: int = 0


def read_window(store: Store, job: str, t0_ns: int, t1_ns: int, seen_to_ns: int = 0) -> Read:
    """The job's usable collectives of [t0, t1), of every source, and the rows dropped;
    rows stamped before seen_to_ns were read before and count only in `dropped`."""
    out, rows = Read([], {}, {}), []
    for source in SOURCES:
        _read_source(store, source, job, t0_ns, t1_ns, seen_to_ns, out, rows)
    out.observations, out.peers_unnumbered = number_peers(rows)
    out.observations.sort(key=lambda o: o.start_ns)
    return out


def _read_source(store: Store, source: CollectiveSource, job: str, t0_ns: int, t1_ns: int,
                 seen_to_ns: int, out: Read, rows: list) -> None:
    """Appends the source's usable rows to `rows` as (Observation, Membership) and
    counts the others in `out`."""
    columns = ", ".join(f'"{c}"' for c in ("bytes", *source.seconds, "peer", "comm_rank",
                                            "nranks"))
    group = "rank, op" + (f", {source.comm_tag}" if source.comm_tag else "")
    q = (f"SELECT {columns} FROM {source.measurement} WHERE job = {quote(job)} AND "
         f"time >= {int(t0_ns)} AND time < {int(t1_ns)} GROUP BY {group} "
         f"ORDER BY time DESC LIMIT {ROWS_PER_SERIES}")
    for tags, columns, values in store.series(q):
        comm = (tags or {}).get(source.comm_tag) if source.comm_tag else None
        for values_row in values:
            row = dict(zip(columns, values_row))
            got = observation_of(tags or {}, row, source.seconds)
            if isinstance(got, Observation):
                rows.append((got, Membership(comm or None, _whole(row.get("comm_rank")),
                                             _whole(row.get("nranks")))))
                continue
            out.dropped[got] = out.dropped.get(got, 0) + 1
            t = row.get("time")
            if not isinstance(t, int) or t >= seen_to_ns:
                out.new_dropped[got] = out.new_dropped.get(got, 0) + 1


def job_class_record(job: str, now_ns: int, c: Classification, rows_dropped: int,
                     window_s: float, since_ns: int, peers_unnumbered: int = 0) -> Record:
    """The job_class point of one classification."""
    d = c.to_dict()
    fields: dict = {"reason": c.reason, "components": ",".join(d["components"]),
                    "mix": json.dumps(d["mix"], sort_keys=True),
                    "observations": c.observations,
                    "rows_dropped": rows_dropped + sum(c.dropped.values()),
                    "peers_unnumbered": int(peers_unnumbered),
                    "window_s": float(window_s), "since_ns": int(since_ns)}
    for family, share in c.mix.items():
        fields[f"{family.value}_count_share"] = float(share.count_share)
        fields[f"{family.value}_bytes_share"] = float(share.bytes_share)
    for name in ("p50_bytes", "p90_bytes", "period_s", "collectives_per_step",
                 "arrival_rate_per_s", "gap_spread"):
        value = d[name]
        if value is not None and math.isfinite(value):
            fields[name] = float(value)
    if c.stages is not None:
        fields["bubble_share"] = float(c.stages.bubble_share)
        fields["stages"] = json.dumps(d["stages"]["stages"])
        if c.stages.slow_stage is not None:
            fields["slow_stage"] = int(c.stages.slow_stage)
            fields["stage_cost_share"] = float(c.stages.cost_share)
    if c.alltoall is not None:
        fields["alltoall_hot_rank"] = int(c.alltoall.hot_rank)
        fields["alltoall_hot_share"] = float(c.alltoall.hot_share)
        fields["alltoall_imbalance"] = float(c.alltoall.imbalance)
        fields["alltoall_cost_share"] = float(c.alltoall.cost_share)
    if c.requests is not None:
        fields["requests"] = len(c.requests.requests)
        fields["request_p50_s"] = float(c.requests.p50_s)
        fields["request_p99_s"] = float(c.requests.p99_s)
    if c.exchange_share is not None:
        fields["exchange_share"] = float(c.exchange_share)
    return Record("job_class", now_ns, {"job": job, "class": c.job_class.value}, fields)


@dataclass
class _Held:
    """What this replica last decided and wrote for a job."""

    job_class: str
    since_ns: int          # first decided
    written_ns: int        # last written
    decided_ns: int        # last classified
    seen_to_ns: int        # end of the last read
    latest: Classification | None = None     # the last classification made


class JobClassAnalyzer:
    def __init__(self, store: Store, registry=None, window_s: float = WINDOW_S,
                 every_s: float = EVERY_S, rewrite_s: float = REWRITE_S):
        self.store, self.window_s, self.every_s, self.rewrite_s = \
            store, window_s, every_s, rewrite_s
        self.held: dict[str, _Held] = {}
        self.dropped: dict[Drop, int] = {}      # rows dropped since start, by cause
        self._drops = self._written = None
        if registry is not None:
            from prometheus_client import Counter
            self._drops = Counter("fabricscope_job_class_rows_dropped", "Collective "
                                  "rows the job-class analyzer could not use, by cause",
                                  ["cause"], registry=registry)
            self._written = Counter("fabricscope_job_class_points", "job_class points "
                                    "written, by class", ["class"], registry=registry)

    def records(self, jobs, now_ns: int) -> list[Record]:
        """job_class points for the jobs due (every_s since their last classification)
        whose class changed or was last written rewrite_s ago; forgets jobs not given
        (no longer owned or ended)."""
        jobs = list(jobs)
        for gone in [j for j in self.held if j not in jobs]:
            del self.held[gone]
        out = []
        for job in jobs:
            held = self.held.get(job)
            if held is not None and now_ns - held.decided_ns < self.every_s * SECOND:
                continue
            record = self._classify(job, held, now_ns)
            if record is not None:
                out.append(record)
        return out

    def _classify(self, job: str, held: _Held | None, now_ns: int) -> Record | None:
        t0 = now_ns - int(self.window_s * SECOND)
        read = read_window(self.store, job, t0, now_ns, held.seen_to_ns if held else 0)
        self._count(read.new_dropped)
        if held is None:        # remembered even without rows: asked again every_s on
            held = self.held[job] = _Held("", now_ns, 0, now_ns, now_ns)
        held.decided_ns = held.seen_to_ns = now_ns
        if not read.observations and not read.dropped:
            return None
        c = held.latest = classify(read.observations,
                                   served=held.job_class == JobClass.INFERENCE.value)
        decided = c.job_class.value
        if decided == held.job_class and now_ns - held.written_ns < self.rewrite_s * SECOND:
            return None
        if decided != held.job_class:
            held.job_class, held.since_ns = decided, now_ns
        held.written_ns = now_ns
        if self._written is not None:
            self._written.labels(decided).inc()
        return job_class_record(job, now_ns, c, sum(read.dropped.values()), self.window_s,
                                held.since_ns, read.peers_unnumbered)

    def latest(self, job: str) -> Classification | None:
        """The job's last classification (None before one, or once it is forgotten)."""
        held = self.held.get(job)
        return held.latest if held is not None else None

    def _count(self, dropped: dict[Drop, int]) -> None:
        for cause, n in dropped.items():
            self.dropped[cause] = self.dropped.get(cause, 0) + n
            if self._drops is not None:
                self._drops.labels(cause.value).inc(n)


def replay_classes(store: Store, job: str, every_s: float = EVERY_S,
                   window_s: float = WINDOW_S):
    """A function of a second t (UNIX s): the job's classification as the live analyzer
    made it at the last multiple of every_s up to t, from the window_s before that
    (None without collectives there); `diagnose --recompute` hands it to the engine."""
    made: dict[int, Classification | None] = {}
    served = False                          # the latest made was INFERENCE (time order)

    def at(t_s: int) -> Classification | None:
        nonlocal served
        due = int(t_s // every_s * every_s * SECOND)
        if due not in made:
            read = read_window(store, job, due - int(window_s * SECOND), due)
            made[due] = classify(read.observations, served=served) \
                if read.observations else None
            if made[due] is not None:
                served = made[due].job_class is JobClass.INFERENCE
        return made[due]
    return at


# -- what `fabricscope diagnose` shows ---------------------------------------------------
def stored_classes(store: Store, t0_ns: int, t1_ns: int, job: str | None = None) -> dict:
    """{job: its latest job_class point of [t0, t1] as {class, reason, ...fields}}."""
    where = f" AND job = {quote(job)}" if job else ""
    rows = store.query(f"SELECT * FROM job_class WHERE time >= {int(t0_ns)} AND "
                       f"time <= {int(t1_ns)}{where}")
    latest: dict[str, dict] = {}
    for row in rows:
        merged = {**row, **(row.get("_tags") or {})}
        merged.pop("_tags", None)
        name = merged.get("job")
        if name and isinstance(merged.get("time"), int) and \
                merged["time"] >= latest.get(name, {}).get("time", -1):
            latest[name] = {k: v for k, v in merged.items() if v is not None}
    return latest


def computed_class(store: Store, job: str, t0_ns: int, t1_ns: int,
                   window_s: float = WINDOW_S) -> dict | None:
    """The job's class over the window_s up to its last collective in [t0, t1] (for a
    window no collector classified), in the stored point's shape; None without
    collectives."""
    last = [row.get("time") for source in SOURCES for row in store.query(
        f'SELECT last("{source.seconds[-1]}") FROM {source.measurement} WHERE '
        f"job = {quote(job)} AND time >= {int(t0_ns)} AND time <= {int(t1_ns)}")]
    last = [t for t in last if isinstance(t, int) and not isinstance(t, bool)]
    if not last:
        return None
    end = max(last) + 1
    start = max(t0_ns, end - int(window_s * SECOND))
    read = read_window(store, job, start, end)
    if not read.observations and not read.dropped:
        return None
    rec = job_class_record(job, end, classify(read.observations),
                           sum(read.dropped.values()), (end - start) / SECOND, end)
    return {"time": end, **rec.tags, **rec.fields}


def class_line(job: str, point: dict) -> str:
    """One line: the job, its class and the sentence that decided it."""
    return f"job {job}: {point.get('class', 'unknown')}: {point.get('reason', '')}"


def job_classes(store: Store, t0_ns: int, t1_ns: int, job: str | None = None,
                jobs=()) -> dict[str, dict]:
    """The latest stored class of each job classified in [t0, t1] (only `job`'s when
    given), and for `job` and each of `jobs` with none stored, the class computed
    from its last window of collectives in [t0, t1]."""
    out = stored_classes(store, t0_ns, t1_ns, job)
    for name in [job] if job else sorted(set(jobs)):
        if name and name not in out:
            point = computed_class(store, name, t0_ns, t1_ns)
            if point is not None:
                out[name] = point
    return out
