"""The diagnosis-cost bench's pure parts: the simulated fleet's lines (valid for the
collector's fast path, the record mix it documents, the loss where it says), its
timing, the figures a round reports, and that the engine names the fault it plants
(the fleet's records through a real InfluxDB, replayed second by second)."""

from __future__ import annotations

import gzip
import os
import re
import time
import urllib.request
from collections import Counter

import pytest

from fabricscope.bench.diagnosis_cost import Round, Sample, cpu_seconds, expected_latency_s
from fabricscope.bench.harness import percentile
from fabricscope.bench.fleet import LOSS, SECOND, Fleet
from fabricscope.lineschema import LineValidator

NOW_S = int(time.time())
FLEET = Fleet(6, lossy=2, onset_s=NOW_S, start_s=NOW_S - 30)
HOUR_NS = 3600 * SECOND


def measurements(lines: list[str]) -> Counter:
    return Counter(line.partition(",")[0] for line in lines)


def field(line: str, name: str) -> float:
    return float(re.search(rf"[ ,]{name}=(-?[0-9.e+]+)i?[, ]", line).group(1))


def test_every_line_passes_the_collectors_fast_check():
    validator = LineValidator()
    for i in range(FLEET.nodes):
        for second in (NOW_S - 1, NOW_S, NOW_S + 1):
            lines = FLEET.lines(i, second)
            assert validator.check_all(lines, FLEET.node(i), time.time_ns(), HOUR_NS,
                                       24 * HOUR_NS) > 0


def test_a_healthy_second_is_the_documented_mix():
    mix = measurements(FLEET.lines(0, NOW_S - 5))
    assert mix == {"tcp_node": 1, "tcp_flow": 5, "nic_window": 2, "nic_qdisc": 1,
                   "gloo_progress": 1, "gloo_step": 3, "gloo_collective": 6, "gloo_phase": 12,
                   "nic_burst": 9, "tcp_transfer": 6}
    assert FLEET.records_per_second(0, False) == 46


def test_the_fault_slows_every_step_and_makes_the_lossy_nodes_resend():
    assert measurements(FLEET.lines(0, NOW_S + 2))["gloo_step"] == 2
    lossy, upstream = FLEET.senders_into_lossy()
    for i in range(FLEET.nodes):
        lines = FLEET.lines(i, NOW_S + 2)
        ring = [x for x in lines if x.startswith("tcp_flow,") and
                f"daddr={FLEET.address((i - 1) % FLEET.nodes)}," in x][0]
        resent = field(ring, "retrans_bytes") / (field(ring, "bytes_acked") +
                                                 field(ring, "retrans_bytes"))
        retransmits = measurements(lines)["tcp_retransmit"]
        if i in (lossy, upstream):
            assert resent == pytest.approx(LOSS, rel=0.05) and retransmits > 100
        else:
            assert resent == 0 and retransmits == 0
        # before the onset nobody resends
        assert measurements(FLEET.lines(i, NOW_S - 1))["tcp_retransmit"] == 0


def test_windows_fall_in_their_second_and_batches_go_after_them():
    for i in range(FLEET.nodes):
        stamps = [int(x.rpartition(" ")[2]) for x in FLEET.lines(i, NOW_S)
                  if x.startswith(("tcp_node,", "tcp_flow,", "nic_window,"))]
        assert {t // SECOND for t in stamps} == {NOW_S}
        assert FLEET.sends_at_s(i, NOW_S) >= NOW_S + 1.2
    sends = [FLEET.sends_at_s(i, NOW_S) for i in range(FLEET.nodes)]
    assert sends == sorted(sends) and sends[-1] - sends[0] < 1
    steps = [int(field(x, "step")) for x in FLEET.lines(0, NOW_S - 3) + FLEET.lines(0, NOW_S - 2)
             if x.startswith("gloo_step,")]
    assert steps == list(range(steps[0], steps[0] + 6))


def sample(wall, collector, ticks=0.0, tick_sum=0.0) -> Sample:
    return Sample(wall, collector, 0.0, 0.0, tick_sum, ticks)


def test_a_round_reports_cpu_per_node_second_and_whether_it_kept_up():
    r = Round(True, 200, sample(100.0, 10.0, 4, 0.4), sample(130.0, 16.0, 34, 6.4),
              [0.01] * 99 + [0.5], 0.05, 2.5)
    assert r.per_node_s("collector_cpu_s") == pytest.approx(6.0 / (200 * 30) * 1e6)
    assert r.tick_s == pytest.approx(0.2) and r.ticks_per_s == pytest.approx(1.0)
    assert r.kept_up
    r.latencies_s = [1.5] * 10
    assert not r.kept_up
    assert percentile([3, 1, 2], 50) == 2 and percentile([], 50) is None


def test_the_expected_finding_is_the_lossy_link_at_the_lossy_node():
    onset = FLEET.onset_ns()
    rows = [{"cause": "lossy_link", "node": "node1", "first_seen_ns": onset + SECOND},
            {"cause": "network_bound", "first_seen_ns": onset},
            {"cause": "lossy_link", "node": FLEET.node(2), "first_seen_ns": onset + 3 * SECOND}]
    assert expected_latency_s(rows, FLEET) == pytest.approx(3.0)
    assert expected_latency_s(rows[:2], FLEET) is None


def test_cpu_seconds_reads_a_process_from_proc():
    before = cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    assert cpu_seconds(os.getpid()) > before


def test_the_engine_names_the_planted_fault():
    from fabricscope.diagnosis.engine import JobEngine
    from fabricscope.diagnosis.replay import replay
    from fabricscope.diagnosis.source import StoreSource
    from fabricscope.diagnosis.store import Store
    from fabricscope.services import InfluxServer

    start = NOW_S - 40
    fleet = Fleet(6, lossy=2, onset_s=start + 25, start_s=start - 1)
    lines = [x for s in range(start, start + 35) for i in range(fleet.nodes)
             for x in fleet.lines(i, s)]
    with InfluxServer() as influx:
        influx.query('CREATE DATABASE "fabricscope"')
        request = urllib.request.Request(
            f"{influx.url}/write?db=fabricscope&precision=ns", method="POST",
            data=gzip.compress("\n".join(lines).encode()), headers={"Content-Encoding": "gzip"})
        urllib.request.urlopen(request, timeout=60).read()
        source = StoreSource(Store(influx.url))
        t0, t1 = start * SECOND, (start + 37) * SECOND
        members = source.jobs(t0, t1)[fleet.job]
        engine = JobEngine(fleet.job)
        found = replay(engine, source.read(members, t0, t1, heartbeat_from_ns=t0),
                       start + 2, start + 37)
    causes = {(f.cause, f.place.get("node")) for f in found if f.severity != "info"}
    assert ("lossy_link", fleet.node(2)) in causes
    lossy = next(f for f in found if f.cause == "lossy_link")
    assert fleet.onset_ns() <= lossy.first_seen_ns <= fleet.onset_ns() + 5 * SECOND
    assert not [c for c in causes if c[0] in ("lossy_link", "buffer_saturation")
                and c[1] != fleet.node(2)]
