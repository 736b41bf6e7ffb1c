"""The engine inside the collector: every second, the jobs this replica owns are read
back from the store, evaluated, and their findings written and exported.

Replicas hold nothing another could not rebuild: each writes a heartbeat
(collector_heartbeat) every tick, the replicas with a recent one share the jobs
out by rendezvous hashing (each job goes to the replica whose hash of
(job, replica) is highest, so a replica that stops loses only its own jobs),
and a replica that takes a job over reads its history from the store: its
baseline steps, its open findings (which it continues under the same id). A
finding is one point (time = its start; fabricscope/measurements/diagnosis.py),
so two replicas that briefly both own a job write the same point, not two
findings. The agents of one job may land on any replicas: the owner reads all
of them from the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import logging
import time
from typing import NamedTuple

from fabricscope.diagnosis.engine import JobEngine
from fabricscope.diagnosis.evidence import SECOND
from fabricscope.diagnosis.finding import Finding
from fabricscope.diagnosis.graph import GRAPH_EVERY_NS, graph_records
from fabricscope.diagnosis.metrics import DiagnosisMetrics
from fabricscope.diagnosis.source import Members, Starts, StoreSource
from fabricscope.diagnosis.store import Store, StoreError, quote
from fabricscope.cadence import until_next
from fabricscope.records import Record

log = logging.getLogger("fabricscope.collector.diagnosis")

HEARTBEAT_TTL_S = 5          # a replica without a heartbeat this long is gone
JOB_ACTIVE_S = 60            # a job with steps or collectives this recently is analysed
#: how far before the last tick a tick rereads cells and nodes (from the start of that
#: second): each second is read at two ticks. A node's windows of a second leave at
#: its poll just after the second (its NIC windows too: their bins are cut on the wall
#: clock's seconds, agent/probes/nic/window.py window_shift), so most of a second is
#: in at its first read and the rest by the second: in the live matrix, of the rows a
#: tick found new or changed, 95 % of the cells' and 96 % of the nodes' came at the
#: first read, the others at the second, and none of the cells' at a third while there
#: was one (docs/SCALING.md). What comes later (an agent that lagged) is read by the
#: catch-up ticks
LATE_S = 1.5
READ_BACK_S = 10             # records up to this late (an agent that lagged) are read too, by
CATCH_UP_S = 10              # a catch-up tick this often, rereading READ_BACK_S + CATCH_UP_S
JOBS_EVERY_S = 5             # the jobs and their ranks are looked up this often
TAKEOVER_S = 600             # a new owner reads this much history once
#: ticks run this long after each multiple of the interval on the wall clock
#: (fabricscope/cadence.py): the agents poll just after each second begins
#: (agent/pipeline.py POLL_OFFSET_S), their batches leave within flush_interval_s
#: (0.2 s by default) and land in the store tens of ms later, so a tick reads the
#: second before whole. At a free phase a tick waited half an interval on average
#: for data that was already in, and read a window's last second half in
TICK_OFFSET_S = 0.5


def _still_evaluated_ns(engine: JobEngine) -> int:
    """The oldest second of cells and nodes an evaluation can still look at: the start of
    the last evaluation's window (windows end after the latest second known, which only
    grows). Older seconds are not read again: a late record there changes nothing, and
    rereading them cost most of a tick's rows (steps and phases are reread in full:
    baselines, trends and phases look further back)."""
    latest = engine.ev.latest_second()
    if latest is None:
        return 0
    return (latest + 1 - engine.thresholds.eval_seconds) * SECOND


class ReadSpan(NamedTuple):
    cells_ns: int            # cells and nodes
    steps: Starts
    phases: Starts


def _read_span(engine: JobEngine, members: Members, back_ns: int, step_lag_ns: int,
               catch_up: bool) -> ReadSpan:
    """Where a tick's reads begin. Cells and nodes from back_ns, never before what an
    evaluation can still look at: a node's records of one second do not reach the
    store together (a new flow's wait for its owner, up to a /proc rescan; its
    probes' polls), so what a node reported last says little about what of its
    earlier seconds is still to come. Steps and phases from a step lag before
    back_ns (they are reported after they end) and, but for a catch-up, for each
    rank not before what it had already reported: a rank's steps reach the store
    in order and whole, so none can come that began before its latest one; a phase
    is reported when its flow's next transfer begins, so one of another flow that
    began before the latest seen can still come: phases are read from a step lag
    before the rank's latest. What comes later than that (an agent that lagged, a
    flow that moves less often than every step) is read by the next catch-up.
    Reading every rank's steps and phases from back_ns reread 3-5 s of them each
    tick, about half of a tick's rows (bench/diagnosis_tick.py)."""
    cells_ns = max(back_ns, _still_evaluated_ns(engine))
    steps_ns = back_ns - step_lag_ns
    if catch_up:
        return ReadSpan(cells_ns, Starts(steps_ns), Starts(steps_ns))
    seen = engine.ev.latest_reports()
    ranks = members.node_of_rank
    return ReadSpan(
        cells_ns, _own_starts(steps_ns, seen.step_ns, ranks),
        _own_starts(steps_ns, {r: t - step_lag_ns for r, t in seen.phase_ns.items()}, ranks))


def _own_starts(floor_ns: int, own_ns: dict[str, int], names) -> Starts:
    """Starts for these names: each from its own time where later than floor_ns; when
    every one has one, nothing is read from before the earliest of them (a job
    whose agents report in step reads in one statement per table)."""
    later = {n: t for n, t in own_ns.items() if n in names and t > floor_ns}
    if later and len(later) == len(names):
        floor_ns = min(later.values())
    return Starts(floor_ns, later)


@contextlib.contextmanager
def _collection_paused():
    """The garbage collector waits while a tick runs. A tick parses tens of thousands of
    rows and drops them when it ends; collections during it would carry the rows into
    the oldest generation and so start full passes over everything the engines hold
    (at a thousand nodes that was most of the engine's CPU). Nothing a tick builds is
    cyclic garbage that cannot wait the tick's length."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def owner(job: str, replicas: list[str]) -> str:
    """Rendezvous hashing: the replica with the highest hash of (job, replica)."""
    return max(replicas, key=lambda r: hashlib.sha1(f"{job}\0{r}".encode()).digest())


class LiveDiagnosis:
    def __init__(self, store: Store, metrics: DiagnosisMetrics, replica_id: str,
                 tor_of=lambda node: None, interval_s: float = 1.0, clock=time.time_ns):
        self.store, self.metrics, self.replica_id = store, metrics, replica_id
        self.source = StoreSource(store)
        self.tor_of, self.interval_s, self.clock = tor_of, interval_s, clock
        self.engines: dict[str, JobEngine] = {}
        self.read_until: dict[str, int] = {}
        self.graph_at: dict[str, int] = {}
        self.caught_up: dict[str, int] = {}
        self._jobs_cache: tuple[int, dict] | None = None
        self.started_ns = clock()
        self._task: asyncio.Task | None = None
        self._warned: set[str] = set()   # kinds of failure logged since a tick succeeded

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="diagnosis")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.tick)
                self._warned.clear()
            except StoreError as exc:
                if self._failed("store"):
                    log.warning("diagnosis: %s; retrying every tick", exc.cause)
            except Exception:       # an engine bug must not stop the collector
                if self._failed("engine"):
                    log.exception("diagnosis tick failed (counted in "
                                  "fabricscope_diagnosis_errors_total{kind=\"engine\"})")
            await asyncio.sleep(until_next(self.interval_s, TICK_OFFSET_S))

    def _failed(self, kind: str) -> bool:
        """Count a failed tick; True when this kind is to be logged (once until a tick
        succeeds: the count goes on)."""
        self.metrics.errors.labels(kind).inc()
        first = kind not in self._warned
        self._warned.add(kind)
        return first

    # -- one tick ----------------------------------------------------------------------
    def tick(self) -> list[Finding]:
        cpu = time.thread_time()
        try:
            return self._tick()
        finally:
            self.metrics.cpu_seconds.inc(time.thread_time() - cpu)

    def _tick(self) -> list[Finding]:
        now = self.clock()
        with self.metrics.tick_seconds.time(), _collection_paused():
            replicas = self._heartbeat(now)
            jobs = self._jobs(now)
            mine = {j: m for j, m in jobs.items() if owner(j, replicas) == self.replica_id}
            changed, records, lag = [], [], 0.0
            for job in [j for j in self.engines if j not in mine]:
                if job not in jobs:            # ended: its findings end with it
                    ended = self.engines[job].close_all()
                    changed += ended
                    records += [f.to_record() for f in ended]
                self._release(job)
            for job, members in mine.items():
                engine = self.engines.get(job) or self._take(job, now)
                late_s = self._late_s(job, engine, now)
                last = self.read_until.get(job, now)
                span = _read_span(engine, members, last - int(late_s * SECOND),
                                  self._step_lag_ns(engine), catch_up=late_s > LATE_S)
                ev = self.source.read(members, span.cells_ns, now + SECOND,
                                      steps_from=span.steps, phases_from=span.phases,
                                      heartbeats=late_s > LATE_S, into=engine.ev)
                self.read_until[job] = now
                engine.feed(ev)
                found = engine.evaluate(now)
                self.metrics.evaluations.inc()
                changed += found
                records += [f.to_record() for f in found]
                latest = engine.ev.latest_second()
                if latest is not None:
                    lag = max(lag, now / SECOND - (latest + 1))
                if engine.last_snapshot is not None and \
                        now - self.graph_at.get(job, 0) >= GRAPH_EVERY_NS:
                    self.graph_at[job] = now
                    records += graph_records(engine.last_snapshot, engine.findings(),
                                             self.tor_of, now)
                self.metrics.set_job(job, engine.gauges)
            self.store.write(records)
            for f in changed:
                self.metrics.show(f)
            self.metrics.jobs_owned.set(len(self.engines))
            self.metrics.lag.set(lag)
        return changed

    def _jobs(self, now: int) -> dict:
        """The active jobs and their ranks, looked up every JOBS_EVERY_S (a scan of a
        minute of every rank's steps: a job's members rarely change, and a new job
        warms up for longer than that)."""
        if self._jobs_cache is None or now - self._jobs_cache[0] >= JOBS_EVERY_S * SECOND:
            self._jobs_cache = (now, self.source.jobs(now - JOB_ACTIVE_S * SECOND,
                                                      now + SECOND))
        return self._jobs_cache[1]

    def _late_s(self, job: str, engine: JobEngine, now: int) -> float:
        """How far back this tick rereads: LATE_S, and every CATCH_UP_S a catch-up
        rereads READ_BACK_S + CATCH_UP_S, so that a record that reached the store up to
        READ_BACK_S after its second, just after one catch-up, is read by the next.
        Rereading READ_BACK_S every tick was most of the engine's cost at a thousand
        nodes (bench diagnosis-cost)."""
        if now - self.caught_up.get(job, 0) >= CATCH_UP_S * SECOND:
            self.caught_up[job] = now
            return READ_BACK_S + CATCH_UP_S
        return LATE_S

    @staticmethod
    def _step_lag_ns(engine: JobEngine) -> int:
        """Steps and phases come later than the rest: a step is stamped with its start
        and reported after its end, a phase's transfer when its flow's next one starts,
        about a step later; two of the job's steps (READ_BACK_S while they are not
        known)."""
        snap = engine.last_snapshot
        step_s = snap.step_s if snap is not None and snap.step_s else READ_BACK_S / 2
        return int(min(READ_BACK_S, 2 * step_s) * SECOND)

    def _heartbeat(self, now: int) -> list[str]:
        self.store.write([Record("collector_heartbeat", now, {"replica": self.replica_id},
                                 {"jobs_owned": len(self.engines),
                                  "started_ns": int(self.started_ns)})])
        rows = self.store.query(
            f"SELECT last(jobs_owned) FROM collector_heartbeat WHERE time > "
            f"{now - HEARTBEAT_TTL_S * SECOND} GROUP BY replica")
        # a store that does not answer InfluxQL (an InfluxDB 2 API stand-in) returns
        # rows without the tag: only the replicas that name themselves count
        live = sorted({r["_tags"]["replica"] for r in rows if r["_tags"].get("replica")}
                      | {self.replica_id})
        self.metrics.replicas.set(len(live))
        return live

    def _take(self, job: str, now: int) -> JobEngine:
        """Own a job: its history from the store, its open findings continued."""
        engine = JobEngine(job, tor_of=self.tor_of, clock=self.clock)
        members = self.source.jobs(now - TAKEOVER_S * SECOND, now + SECOND).get(job)
        if members is not None:
            engine.feed(self.source.read(members, now - READ_BACK_S * SECOND, now + SECOND,
                                         steps_from=now - TAKEOVER_S * SECOND))
        for row in self.store.query(f"SELECT * FROM finding WHERE job = {quote(job)} AND "
                                    f"time > {now - TAKEOVER_S * SECOND}"):
            f = Finding.from_row({**row, **row.get("_tags", {})})
            if f.open:
                engine.open[f.key] = f
        self.engines[job] = engine
        self.read_until[job] = now
        log.info("diagnosis: analysing job %s (%d open findings taken over)", job,
                 len(engine.open))
        return engine

    def _release(self, job: str) -> None:
        self.engines.pop(job, None)
        self.read_until.pop(job, None)
        self.graph_at.pop(job, None)
        self.caught_up.pop(job, None)
        self.metrics.forget_job(job)
        log.info("diagnosis: job %s is another replica's or has ended", job)
