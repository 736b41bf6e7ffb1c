"""Grafana's macro and variable expansion (surface/grafana/macros.py), case by case.

Expected values are what Grafana 11 produces for the same input, worked out from
its code (cited in the module's docstring): the InfluxQL ones are what its InfluxDB
backend sends to InfluxDB, the PromQL ones what its Prometheus backend sends."""

from __future__ import annotations

import pytest

from fabricscope.surface.grafana.macros import (ALL, ANNOTATION_INTERVAL, Interval, TimeRange, Variable,
                                    expand_influxql, expand_promql, format_interval, go_duration,
                                    interval_to_ms, panel_interval, replace_variables,
                                    round_interval_ms)

HOUR = TimeRange(1_700_000_000_000, 1_700_003_600_000)
NODES = ("node0", "node1", "node2")


def node(current, all_value: str | None = ".*") -> dict[str, Variable]:
    return {"node": Variable("node", current, NODES, multi=True, include_all=True,
                             all_value=all_value)}


def influx(query: str, variables=None, interval=Interval(5000, "5s"), time_range=HOUR) -> str:
    return expand_influxql(query, time_range, variables or {}, interval)


def test_time_filter_is_the_range_in_epoch_milliseconds():
    assert influx("SELECT x FROM m WHERE $timeFilter") == \
        "SELECT x FROM m WHERE time >= 1700000000000ms and time <= 1700003600000ms"


@pytest.mark.parametrize("span_ms, points, min_interval, ms, text", [
    (3_600_000, 1000, None, 5000, "5s"),        # 3.6 s a point rounds to 5 s
    (3_600_000, 1000, "10s", 10000, "10s"),     # the datasource's timeInterval is a floor
    (300_000, 1000, None, 200, "200ms"),        # 300 ms rounds to 200 ms
    (300_000, 1000, "1s", 1000, "1s"),
    (86_400_000, 1500, None, 60000, "1m"),      # 57.6 s rounds to 1 m
    (600_000, 100, None, 5000, "5s"),
])
def test_the_interval_follows_range_max_data_points_and_min_interval(span_ms, points,
                                                                    min_interval, ms, text):
    got = panel_interval(TimeRange(0, span_ms), points, min_interval)
    assert (got.ms, got.text) == (ms, text)


def test_interval_macros():
    q = "GROUP BY time($__interval) -- $__interval_ms $interval"
    assert influx(q) == "GROUP BY time(5s) -- 5000 5s"
    assert influx(q, interval=ANNOTATION_INTERVAL) == "GROUP BY time(1ms) -- 1 1ms"


def test_a_single_value_is_regex_escaped():
    job = {"job": Variable("job", "198.18.0.1:29500/a")}
    assert influx('"job" =~ /^$job$/', job) == r'"job" =~ /^198\.18\.0\.1:29500\/a$/'


def test_several_values_become_an_alternation():
    assert influx('"node" =~ /^$node$/', node(("node0", "node2"))) == \
        '"node" =~ /^(node0|node2)$/'
    assert influx('"node" =~ /^$node$/', node(("node1",))) == '"node" =~ /^node1$/'


def test_all_is_the_custom_all_value_unformatted():
    assert influx('"node" =~ /^$node$/', node(ALL)) == '"node" =~ /^.*$/'
    assert influx('"node" =~ /^$node$/', node((ALL,))) == '"node" =~ /^.*$/'


def test_all_without_a_custom_value_is_every_option():
    assert influx('"node" =~ /^$node$/', node(ALL, all_value=None)) == \
        '"node" =~ /^(node0|node1|node2)$/'


def test_every_variable_syntax_and_explicit_formats():
    variables = node(("node0", "node1"))
    assert replace_variables("[[node]] ${node} $node", variables, lambda v, _: "|".join(v)) == \
        "node0|node1 node0|node1 node0|node1"
    assert influx("${node:csv} ${node:pipe} ${node:raw}", variables) == \
        "node0,node1 node0|node1 node0,node1"


def test_what_is_no_variable_stays():
    assert replace_variables("$timeFilter $__interval $other", node(ALL),
                             lambda v, _: "X") == "$timeFilter $__interval $other"


def test_prometheus_escaping():
    single = {"job": Variable("job", "it's\\x")}
    assert expand_promql('m{job="$job"}', HOUR, single, Interval(5000, "5s"), 1000).expr == \
        "m{job=\"it\\\\'s\\\\x\"}"
    many = node(("node.0", "node1"))
    assert expand_promql('m{node=~"$node"}', HOUR, many, Interval(5000, "5s"), 1000).expr == \
        'm{node=~"(node\\\\.0|node1)"}'
    assert expand_promql('m{node=~"$node"}', HOUR, node(ALL), Interval(5000, "5s"),
                         1000).expr == 'm{node=~".*"}'


@pytest.mark.parametrize("interval_ms, scrape, rate", [
    (1000, "5s", "20s"),         # 4 x scrape
    (60000, "15s", "1m15s"),     # interval + scrape
    (5000, "1s", "6s"),
])
def test_rate_interval(interval_ms, scrape, rate):
    q = expand_promql("rate(x[$__rate_interval])", HOUR, {},
                      Interval(interval_ms, format_interval(interval_ms)), 1000, scrape)
    assert q.expr == f"rate(x[{rate}])"


def test_prometheus_step_and_aligned_range():
    q = expand_promql("avg_over_time(x[$__interval]) $__range $__interval_ms", HOUR, {},
                      Interval(5000, "5s"), 1000, "5s")
    assert q.expr == "avg_over_time(x[5s]) 3600s 5000"
    assert (q.step_ms, q.start_ms % 5000, q.end_ms % 5000) == (5000, 0, 0)
    # range / max points (3.6 s) under the panel's interval: the interval is the step
    assert q.start_ms <= HOUR.from_ms < q.start_ms + q.step_ms


def test_rounding_tables_differ_only_at_their_bounds():
    assert round_interval_ms(1499) == round_interval_ms(1499, inclusive=True) == 1000
    assert round_interval_ms(1500) == 2000                       # grafana-data: `<`
    assert round_interval_ms(1500, inclusive=True) == 1000       # Go backends: `<=`
    assert round_interval_ms(10 ** 12) == 31536000000


def test_interval_text():
    assert [format_interval(ms) for ms in (1, 500, 1000, 90000, 3600000, 86400000 * 2)] == \
        ["1ms", "500ms", "1s", "1m", "1h", "2d"]
    assert [go_duration(ms) for ms in (500, 4000, 1500, 60000, 75000, 3600000)] == \
        ["500ms", "4s", "1.5s", "1m0s", "1m15s", "1h0m0s"]
    assert [interval_to_ms(t) for t in ("10s", "1m", "500ms", "15", "<2h>")] == \
        [10000, 60000, 500, 15000, 7200000]
    with pytest.raises(ValueError):
        interval_to_ms("soon")
