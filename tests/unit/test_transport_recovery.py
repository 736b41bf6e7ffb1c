"""Nothing lost, nothing doubled: collectors and agents killed, InfluxDB stopped.

Real processes throughout: influxd, `fabricscope collector` and `fabricscope agent`
subprocesses (the agents run the synthetic source: record n at base + n/rate,
resumable), SIGKILL by pid. The check is InfluxDB's own count and sum of n per
node: count == N and sum == N(N-1)/2 means records 0..N-1 each exactly once.
"""

from __future__ import annotations

import time

import pytest

from fabricscope.services import InfluxServer, free_port
from tests.unit.transport_procs import Procs, complete, synthetic_counts, wait_for

N = 12_000          # records per agent: 6 s at 2000/s
NODES = ["na", "nb", "nc"]


@pytest.fixture
def influx():
    with InfluxServer() as server:
        yield server


@pytest.fixture
def procs(tmp_path):
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.stop_all()


def total(influx) -> int:
    return sum(c for c, _ in synthetic_counts(influx).values())


def assert_exactly_once(influx, nodes=NODES, n=N, timeout_s=120):
    want = {node: complete(n) for node in nodes}
    wait_for(lambda: synthetic_counts(influx) == want, timeout_s,
             f"InfluxDB to hold records 0..{n - 1} of {nodes} (now {synthetic_counts(influx)})")
    assert synthetic_counts(influx) == want


def no_agent_loss(agents) -> None:
    for agent in agents:
        assert agent.metric("fabricscope_agent_records_dropped_total") == 0, agent.name


def test_collector_sigkill_mid_stream_loses_and_doubles_nothing(influx, procs, tmp_path):
    port = free_port()
    spool = str(tmp_path / "collector-spool")
    collector = procs.collector("collector", port, influx.url, "--spool-dir", spool).start()
    agents = [procs.agent(node, port, count=N).start() for node in NODES]
    wait_for(lambda: total(influx) >= N // 2, 60, "a third of the records to arrive")

    collector.kill()
    # Agents notice and keep spooling while it is down.
    wait_for(lambda: all(a.metric("fabricscope_agent_collector_connected") == 0 for a in agents),
             60, "every agent to see the collector gone")
    wait_for(lambda: sum(a.metric("fabricscope_agent_queue_records") for a in agents) > 0,
             30, "batches to wait in the agents' spools")
    collector.start()

    assert_exactly_once(influx)
    no_agent_loss(agents)
    assert collector.metric("fabricscope_collector_records_rejected_total") == 0


def test_influxdb_down_for_60s_is_spooled_and_replayed_with_bounded_memory(influx, procs,
                                                                           tmp_path):
    n = 150_000                  # 60 s at 2500/s per agent
    port = free_port()
    collector = procs.collector("collector", port, influx.url, "--spool-dir",
                                str(tmp_path / "collector-spool")).start()
    agents = [procs.agent(node, port, rate=2500, count=n).start() for node in NODES]
    wait_for(lambda: total(influx) >= 10_000, 60, "records to arrive")
    rss_before = collector.rss_mb()

    influx.stop_process()
    outage_end = time.monotonic() + 60
    rss_peak = rss_before
    while time.monotonic() < outage_end:        # the outage itself: 60 s by definition
        rss_peak = max(rss_peak, collector.rss_mb())
        time.sleep(0.5)
    spooled = collector.metric("fabricscope_collector_records_spooled_total")
    spool_bytes = collector.metric("fabricscope_collector_spool_bytes")
    influx.start_process()

    assert_exactly_once(influx, n=n, timeout_s=240)
    no_agent_loss(agents)
    # Everything the agents made during the outage went through the collector's spool...
    assert spooled >= 3 * 2500 * 50
    assert collector.metric("fabricscope_collector_records_replayed_total") >= spooled
    wait_for(lambda: collector.metric("fabricscope_collector_spool_entries") == 0, 60,
             "the spool to empty")
    # ...and not through its memory: the ~400k records (~40 MB of line protocol) that
    # arrived during the outage moved the collector's RSS by far less.
    print(f"collector RSS {rss_before:.0f} MiB before, {rss_peak:.0f} MiB peak; "
          f"{spooled:.0f} records, {spool_bytes / 2**20:.1f} MiB spooled (gzip)")
    assert rss_peak - rss_before < 30


def test_agent_sigkill_and_restart_resends_without_gap_or_duplicate(influx, procs):
    port = free_port()
    procs.collector("collector", port, influx.url).start()
    agent = procs.agent("na", port, count=N).start()
    wait_for(lambda: total(influx) >= 2000, 60, "records to arrive")
    agent.kill()
    agent.start()
    assert "resuming run" in agent.text()
    assert_exactly_once(influx, nodes=["na"])
    no_agent_loss([agent])


def test_agent_killed_while_the_collector_is_down_resends_from_its_spool(influx, procs):
    port = free_port()
    collector = procs.collector("collector", port, influx.url).start()
    agent = procs.agent("na", port, count=N).start()
    wait_for(lambda: total(influx) >= 1000, 60, "records to arrive")
    collector.kill()
    wait_for(lambda: agent.metric("fabricscope_agent_queue_records") > 1000, 60,
             "records to pile up in the agent's spool")
    agent.kill()
    agent.start()
    assert "left by a previous run; resending them" in agent.text()
    collector.start()
    assert_exactly_once(influx, nodes=["na"])


def test_two_replicas_on_one_port_share_the_agents_and_survive_one_dying(influx, procs):
    port = free_port()      # both bind it (SO_REUSEPORT): one address, as behind a Service
    age = ("--max-connection-age-s", "1")       # streams move between replicas every ~2 s
    a = procs.collector("replica-a", port, influx.url, *age).start()
    b = procs.collector("replica-b", port, influx.url, *age).start()
    nodes = [f"n{i}" for i in range(5)]
    n = 30_000                                   # 15 s at 2000/s
    agents = [procs.agent(node, port, count=n).start() for node in nodes]
    # ~5 connections per agent in this time: both replicas get some (p(not) ~ 2^-25).
    wait_for(lambda: min(r.metric("fabricscope_collector_batches_received_total")
                         for r in (a, b)) > 0, 60, "both replicas to receive batches")
    a.kill()
    assert_exactly_once(influx, nodes=nodes, n=n)
    no_agent_loss(agents)
