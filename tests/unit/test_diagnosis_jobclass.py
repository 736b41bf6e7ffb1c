"""diagnosis/jobclass.py over a fake store's answers: each kind's class and reason,
a change of kind, the rewrite period, rows that cannot be used, and the hooks in
the collector's diagnosis and `fabricscope diagnose`."""

from __future__ import annotations

import math
import re

import pytest
from prometheus_client import CollectorRegistry

from fabricscope.collector import diagnosis as collector_diagnosis
from fabricscope.collector.config import CollectorConfig
from fabricscope.diagnosis.jobclass import (SECOND, SOURCES, Drop, JobClassAnalyzer, class_line, job_classes,
                                job_class_record, stored_classes)
from fabricscope import schema
from fabricscope.errors import UserError
from fabricscope.jobclass import OpFamily, classify
from fabricscope.measurements.jobclass import FAMILIES
from fabricscope.records import Record
from tests.unit.test_jobclass import (DDP, FSDP_GLOO, FSDP_NCCL, MOE, PIPELINE, SERVE_MOE, loop,
                                      pipeline, served)

T0 = 1_700_000_000 * SECOND


class FakeStore:
    """Answers the analyzer's InfluxQL as InfluxDB 1.x would (series per rank and op,
    newest first, LIMIT per series) from records held in memory."""

    def __init__(self, rows=()):
        self.rows: list[tuple[dict, dict]] = list(rows)     # (tags, {time, bytes, seconds})
        self.written: list[Record] = []
        self.queries: list[str] = []

    def add(self, job: str, observations, t0: int = T0,
            measurement: str = "gloo_collective", seconds: str = "seconds",
            memberships=None) -> None:
        """memberships: a fabricscope.commpeers.Membership per observation, stored as
        the rows' comm_rank and nranks fields and comm tag."""
        for i, o in enumerate(observations):
            row = {"time": t0 + o.start_ns, "bytes": o.bytes,
                   seconds: (o.end_ns - o.start_ns) / SECOND}
            tags = {"job": job, "rank": str(o.rank), "op": o.op, "_measurement": measurement}
            if o.peer is not None:
                row["peer"] = o.peer
            if memberships is not None:
                m = memberships[i]
                row.update(comm_rank=m.comm_rank, nranks=m.nranks)
                if m.comm is not None:
                    tags["comm"] = m.comm
            self.rows.append((tags, row))

    @staticmethod
    def _measurement(tags: dict) -> str:
        return tags.get("_measurement", "gloo_collective")

    def series(self, q: str):
        self.queries.append(q)
        job = re.search(r"job = '([^']*)'", q).group(1)
        measurement = re.search(r"FROM (\w+)", q).group(1)
        columns = ["time", *re.findall(r'"(\w+)"', q.split(" FROM ")[0])]
        lo, hi = map(int, re.search(r"time >= (\d+) AND time < (\d+)", q).groups())
        limit = int(re.search(r"LIMIT (\d+)", q).group(1))
        by = [t.strip() for t in re.search(r"GROUP BY ([\w, ]+?) ORDER", q).group(1).split(",")]
        groups: dict = {}
        for tags, row in self.rows:
            t = row.get("time")
            if tags.get("job") == job and self._measurement(tags) == measurement and \
                    (not isinstance(t, int) or lo <= t < hi):
                key = tuple(tags.get(k) for k in by)
                groups.setdefault(key, []).append(row)
        out = []
        for key, rows in groups.items():
            rows.sort(key=lambda r: r["time"] if isinstance(r["time"], int) else 0,
                      reverse=True)
            tags = {k: v for k, v in zip(by, key) if v is not None}
            out.append((tags, columns, [[r.get(c) for c in columns] for r in rows[:limit]]))
        return out

    def query(self, q: str):
        job = re.search(r"job = '([^']*)'", q)
        lo, hi = map(int, re.search(r"time >= (\d+) AND time <= (\d+)", q).groups())
        if q.startswith('SELECT last('):
            measurement = re.search(r"FROM (\w+)", q).group(1)
            times = [row["time"] for tags, row in self.rows if tags["job"] == job.group(1)
                     and self._measurement(tags) == measurement
                     and isinstance(row["time"], int) and lo <= row["time"] <= hi]
            return [{"time": max(times), "last": 0.0, "_tags": {}}] if times else []
        return [{"time": r.time_ns, **r.fields, "_tags": dict(r.tags)} for r in self.written
                if lo <= r.time_ns <= hi and (job is None or r.tags["job"] == job.group(1))]

    def write(self, records) -> None:
        self.written += list(records)


def only(records):
    assert len(records) == 1, records
    return records[0]


@pytest.mark.parametrize("observations, expected, number", [
    (loop(DDP), "data_parallel", "% of the exchanged bytes"),
    (loop(FSDP_GLOO), "sharded", "67%"),
    (loop(MOE), "moe_alltoall", "% of the exchanged bytes"),
    (loop(PIPELINE), "pipeline", "collectives per step"),
    (served(SERVE_MOE), "inference", "arrivals/s"),
])
def test_each_kind_of_job_gets_its_class_and_a_reason_with_numbers(
        observations, expected, number):
    store = FakeStore()
    store.add("j", observations)
    record = only(JobClassAnalyzer(store).records(["j"], T0 + 5 * SECOND))
    assert record.tags == {"job": "j", "class": expected}
    assert number in record.fields["reason"] and re.search(r"\d", record.fields["reason"])
    assert record.fields["observations"] == len(observations)
    assert record.fields["rows_dropped"] == 0
    schema.validate(record)


def test_a_training_loop_point_carries_its_period_mix_and_collectives_per_step():
    store = FakeStore()
    store.add("j", loop(FSDP_GLOO, step_ms=40))
    fields = only(JobClassAnalyzer(store).records(["j"], T0 + 5 * SECOND)).fields
    assert fields["period_s"] == pytest.approx(0.040, rel=0.05)
    assert fields["collectives_per_step"] == 12
    assert fields["allgather_reducescatter_bytes_share"] == pytest.approx(2 / 3)
    assert fields["allgather_reducescatter_count_share"] == pytest.approx(8 / 12)
    assert fields["components"] == "sharded,data_parallel"
    assert "arrival_rate_per_s" not in fields


def test_an_inference_point_carries_its_arrival_rate_and_no_period():
    store = FakeStore()
    store.add("j", served(SERVE_MOE, rate=20.0))
    fields = only(JobClassAnalyzer(store).records(["j"], T0 + 5 * SECOND)).fields
    assert "period_s" not in fields
    assert 10 < fields["arrival_rate_per_s"] < 40
    assert fields["gap_spread"] > 0.8


@pytest.mark.parametrize("observations, expected", [
    (loop(FSDP_NCCL), "sharded"),
    (loop(MOE), "moe_alltoall"),
    (pipeline(3), "pipeline"),
    (served(SERVE_MOE), "inference"),
])
def test_a_job_on_nccl_is_classified_from_the_profiler_plugins_collectives(
        observations, expected):
    store = FakeStore()
    store.add("j", observations, measurement="ncclprof_collective", seconds="kernel_seconds")
    record = only(JobClassAnalyzer(store).records(["j"], T0 + 5 * SECOND))
    assert record.tags == {"job": "j", "class": expected}
    assert record.fields["observations"] == len(observations)
    assert record.fields["rows_dropped"] == 0


def test_an_nccl_collective_without_kernel_times_counts_its_enqueue_time():
    store = FakeStore()
    store.add("j", loop(DDP), measurement="ncclprof_collective", seconds="enqueue_seconds")
    record = only(JobClassAnalyzer(store).records(["j"], T0 + 5 * SECOND))
    assert record.tags["class"] == "data_parallel" and record.fields["rows_dropped"] == 0


def test_a_job_with_gloo_and_nccl_groups_is_classified_from_both():
    """A torch job that trains over NCCL and keeps a gloo group for its CPU side."""
    store = FakeStore()
    store.add("j", loop(FSDP_NCCL), measurement="ncclprof_collective",
              seconds="kernel_seconds")
    store.add("j", loop([("Barrier", 0, 30, 0.1)]))
    record = only(JobClassAnalyzer(store).records(["j"], T0 + 5 * SECOND))
    assert record.tags["class"] == "sharded"
    assert record.fields["observations"] == len(loop(FSDP_NCCL)) + 30
    assert job_classes(store, T0, T0 + 60 * SECOND, jobs={"j"})["j"]["class"] == "sharded"


def test_an_nccl_only_job_gets_a_computed_class_where_none_is_stored():
    store = FakeStore()
    store.add("j", loop(MOE), measurement="ncclprof_collective", seconds="kernel_seconds")
    assert job_classes(store, T0, T0 + 60 * SECOND, jobs={"j"})["j"]["class"] == \
        "moe_alltoall"


def test_a_job_that_changes_kind_midway_gets_a_new_class_point():
    store = FakeStore()
    store.add("j", loop(DDP, steps=30, step_ms=1000))                       # 0-30 s
    store.add("j", loop(FSDP_GLOO, steps=30, step_ms=1000, t0=30 * SECOND))  # 30-60 s
    analyzer = JobClassAnalyzer(store)
    written = []
    for s in range(30, 91, 10):
        written += analyzer.records(["j"], T0 + s * SECOND)
    classes = [r.tags["class"] for r in written]
    assert classes[0] == "data_parallel" and classes[-1] == "sharded"
    changes = [(a, b) for a, b in zip(classes, classes[1:]) if a != b]
    assert changes, classes
    sharded = [r for r in written if r.tags["class"] == "sharded"]
    assert sharded[0].fields["since_ns"] == sharded[0].time_ns
    assert all(r.fields["since_ns"] == sharded[0].time_ns for r in sharded)
    for r in written:
        schema.validate(r)


def test_a_held_class_is_written_again_every_30_s_not_every_classification():
    store = FakeStore()
    store.add("j", loop(DDP, steps=70, step_ms=1000))
    analyzer = JobClassAnalyzer(store)
    written = []
    for s in range(5, 66):                                        # a tick per second
        written += analyzer.records(["j"], T0 + s * SECOND)
    assert [(r.time_ns - T0) // SECOND for r in written] == [5, 35, 65]
    assert len([q for q in store.queries if "FROM gloo_collective" in q]) == 7  # every 10 s
    assert {r.fields["since_ns"] for r in written} == {T0 + 5 * SECOND}


BAD_ROWS = [
    ({"job": "j", "rank": "0"}, {"time": T0 + 1, "bytes": 8, "seconds": 0.001}),
    ({"job": "j", "rank": "0", "op": "Frobnicate"}, {"time": T0 + 2, "bytes": 8,
                                                     "seconds": 0.001}),
    ({"job": "j", "rank": "0", "op": "AllReduce"}, {"time": T0 + 3, "bytes": "8",
                                                    "seconds": 0.001}),
    ({"job": "j", "rank": "0", "op": "AllReduce"}, {"time": T0 + 4, "bytes": -8,
                                                    "seconds": 0.001}),
    ({"job": "j", "rank": "0", "op": "AllReduce"}, {"time": T0 + 5, "bytes": 8.5,
                                                    "seconds": 0.001}),
    ({"job": "j", "rank": "0", "op": "AllReduce"}, {"time": T0 + 6, "bytes": 8,
                                                    "seconds": None}),
    ({"job": "j", "rank": "0", "op": "AllReduce"}, {"time": T0 + 7, "bytes": 8,
                                                    "seconds": math.nan}),
    ({"job": "j", "rank": "0", "op": "AllReduce"}, {"time": None, "bytes": 8,
                                                    "seconds": 0.001}),
]


def test_rows_that_cannot_be_used_are_counted_by_cause_not_raised():
    store = FakeStore(BAD_ROWS)
    store.add("j", loop(DDP))
    registry = CollectorRegistry()
    analyzer = JobClassAnalyzer(store, registry)
    record = only(analyzer.records(["j"], T0 + 5 * SECOND))
    assert record.tags["class"] == "data_parallel"
    assert record.fields["rows_dropped"] == len(BAD_ROWS)
    assert analyzer.dropped == {Drop.NO_OP: 1, Drop.UNKNOWN_OP: 1, Drop.BAD_BYTES: 3,
                                Drop.BAD_SECONDS: 2, Drop.BAD_TIME: 1}
    assert registry.get_sample_value("fabricscope_job_class_rows_dropped_total",
                                     {"cause": "bad_bytes"}) == 3
    assert registry.get_sample_value("fabricscope_job_class_points_total",
                                     {"class": "data_parallel"}) == 1
    schema.validate(record)


def test_a_dropped_row_is_counted_once_though_later_reads_see_it_again():
    store = FakeStore(BAD_ROWS[1:2])
    store.add("j", loop(DDP))
    analyzer = JobClassAnalyzer(store)
    for s in (5, 15, 25):
        analyzer.records(["j"], T0 + s * SECOND)
    assert analyzer.dropped == {Drop.UNKNOWN_OP: 1}


def test_a_window_of_unusable_rows_only_is_classified_unknown():
    store = FakeStore(BAD_ROWS[:2])
    record = only(JobClassAnalyzer(store).records(["j"], T0 + 5 * SECOND))
    assert record.tags["class"] == "unknown"
    assert record.fields["observations"] == 0 and record.fields["rows_dropped"] == 2
    schema.validate(record)


def test_a_job_without_collectives_gets_no_point_and_is_asked_again_only_every_10_s():
    store = FakeStore()
    analyzer = JobClassAnalyzer(store)
    for s in range(5, 15):
        assert analyzer.records(["quiet"], T0 + s * SECOND) == []
    assert len(store.queries) == len(SOURCES)                     # one read of each


def test_a_job_no_longer_owned_is_forgotten_and_written_anew_when_owned_again():
    store = FakeStore()
    store.add("j", loop(DDP))
    analyzer = JobClassAnalyzer(store)
    assert analyzer.records(["j"], T0 + 5 * SECOND)
    assert analyzer.records([], T0 + 6 * SECOND) == [] and "j" not in analyzer.held
    assert analyzer.records(["j"], T0 + 7 * SECOND)


def test_the_schema_spells_every_op_family_of_the_classifier():
    assert FAMILIES == tuple(f.value for f in OpFamily)


def test_diagnose_shows_the_latest_stored_class_and_computes_one_where_none_is_stored():
    store = FakeStore()
    store.add("stored", loop(DDP))
    store.add("fresh", loop(MOE))
    analyzer = JobClassAnalyzer(store)
    store.write(analyzer.records(["stored"], T0 + 5 * SECOND))
    store.write(analyzer.records(["stored"], T0 + 40 * SECOND))   # window empty: none
    got = job_classes(store, T0, T0 + 60 * SECOND, jobs={"stored", "fresh"})
    assert got["stored"]["class"] == "data_parallel"
    assert got["fresh"]["class"] == "moe_alltoall" and got["fresh"]["reason"]
    line = class_line("stored", got["stored"])
    assert line.startswith("job stored: data_parallel: allreduce carries")
    assert stored_classes(store, T0, T0 + 60 * SECOND, "fresh") == {}


def test_the_collector_config_switch_is_on_by_default():
    assert CollectorConfig().job_class is True


def test_the_collectors_diagnosis_tick_writes_the_owned_jobs_classes_and_hands_them_on(
        monkeypatch):
    monkeypatch.setattr(collector_diagnosis.LiveDiagnosis, "tick", lambda self: [])
    store = FakeStore()
    store.add("j", loop(DDP))
    live = collector_diagnosis.start_diagnosis(CollectorConfig(), CollectorRegistry(), 9470)
    assert live.job_class is not None
    live.store, live.job_class.store = store, store
    from fabricscope.diagnosis.engine import JobEngine
    live.engines, live.clock = {"j": JobEngine("j")}, lambda: T0 + 5 * SECOND
    live.tick()
    assert [r.tags["class"] for r in store.written] == ["data_parallel"]
    # and the engine judges the class causes from it at its next evaluation
    assert live.engines["j"].evaluation.job_class.job_class.value == "data_parallel"
    off = collector_diagnosis.start_diagnosis(CollectorConfig(job_class=False),
                                              CollectorRegistry(), 9470)
    assert off.job_class is None


def test_every_view_reads_a_stored_point_as_the_classification_it_was_made_from():
    from fabricscope.surface import jobclass as view
    from tests.unit.test_stagemodel import gpipe
    for observations in (loop(DDP), loop(MOE), gpipe([2.0, 4.0, 2.0], steps=5)):
        made = classify(observations)
        store = FakeStore()
        store.write([job_class_record("j", T0, made, 2, 60.0, T0)])
        stored = view.read(stored_classes(store, T0, T0 + 60 * SECOND)["j"])
        assert stored.headline == view.read(made).headline
        assert stored.facts[:-1] == view.read(made).facts[:-1]
        assert stored.facts[-1] == ("observations", f"{made.observations} used, dropped: "
                                                    "rows 2")
    # the pipeline's stages, as the stored point carries them
    assert ("stages", f"3, bubble {made.stages.bubble_share:.0%}, slow stage rank 1 "
                      f"({made.stages.cost_share:.0%} of its span)") in stored.facts
    point = stored_classes(store, T0, T0 + 60 * SECOND)["j"]
    bad = dict(point, mix="{not json")
    with pytest.raises(UserError, match="has a field that is not JSON"):
        view.read(bad)


@pytest.mark.parametrize("source", ["ncclprof_collective", "gloo_collective"])
def test_a_pipeline_in_sub_groups_is_linked_by_training_ranks_or_not_at_all(source):
    """Two pipelines of two stages (ranks 0-1 and 2-3), each in a communicator of its
    own. NCCL's comm hash says which rows share one: their peers become training
    ranks. gloo names no group: the peers are unknown, and counted."""
    from tests.unit.test_commpeers import two_pipelines
    rows = two_pipelines((lambda i: f"c{i}") if source == "ncclprof_collective" else None)
    store = FakeStore()
    store.add("j", [o for o, _ in rows], measurement=source,
              seconds="enqueue_seconds" if source == "ncclprof_collective" else "seconds",
              memberships=[m for _, m in rows])
    analyzer = JobClassAnalyzer(store)
    record = only(analyzer.records(["j"], T0 + 20 * SECOND))
    c = analyzer.latest("j")
    assert c.job_class.value == "pipeline", c.reason
    if source == "ncclprof_collective":
        assert record.fields["peers_unnumbered"] == 0
        assert {s.rank: s.peers for s in c.stages.stages} == {0: (1,), 1: (0,), 2: (3,), 3: (2,)}
    else:
        assert record.fields["peers_unnumbered"] == len(rows)
        assert all(s.peers == () for s in c.stages.stages)
