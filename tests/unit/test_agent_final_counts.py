"""agent/main.py: all_counts and final_counts, the log lines at stop."""

from __future__ import annotations

from fabricscope.agent.main import all_counts, final_counts
from fabricscope.agent.metrics import AgentMetrics


def test_the_stop_line_names_losses_skips_and_what_the_join_did_with_transfers():
    stats = AgentMetrics().probe_stats
    stats.update("tcp_flows", {"lost": 0, "missed_hits": 3, "received_recovered_bytes": 1500,
                               "probe_hits": 99})
    stats.update("gloo", {"lost": 2, "events": 10, "unattributed": 4, "handler_errors": 1,
                          "foreign_processes": 6})
    stats.update("join", {"transfers_written": 18, "transfers_folded": 0,
                          "phases_inferred": 12})
    assert final_counts(stats) == ("gloo: handler_errors 1, lost 2, unattributed 4; join: transfers_written 18; tcp_flows: "
                                   "missed_hits 3, received_recovered_bytes 1500")


def test_a_clean_run_says_so():
    stats = AgentMetrics().probe_stats
    stats.update("tcp_flows", {"lost": 0, "missed_hits": 0})
    assert final_counts(stats) == "nothing lost"


def test_the_counters_line_names_every_non_zero_counter_of_every_probe():
    stats = AgentMetrics().probe_stats
    stats.update("gloo", {"emitted": 10, "filtered": 4, "foreign_processes": 2, "lost": 0})
    stats.update("tcp_flows", {"lost": 0})
    assert all_counts(stats) == "gloo: emitted 10, filtered 4, foreign_processes 2"
    assert all_counts(AgentMetrics().probe_stats) == "none"
