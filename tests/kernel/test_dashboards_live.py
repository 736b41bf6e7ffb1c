"""Every panel query of the Grafana boards, run against real servers holding a real run.

One lab run for the module: 3 nodes on 1 Gbit/s shaped links, InfluxDB + collector +
one agent per node (fabricscope.lab.stack, gloo buffer hooks on for the traffic model), a data
server, 2 % loss on node 1's port and 15 real DDP steps over gloo. Debian's
Prometheus (tests.support.servers.PrometheusServer) scrapes the collector and the
agents every second meanwhile.

No Grafana server can run here, so each query is expanded as Grafana would expand
it (surface/grafana/macros.py) and its result is turned into the fields Grafana's
InfluxDB backend makes of it (`frames` below, after pkg/tsdb/influxdb/influxql/
buffered/response_parser.go); the test asserts the fields each panel maps exist and,
where the run must have produced data, that there is some.

The collector's diagnosis engine is off here (`--no-diagnosis`), so that the findings
and the fabric graph the panels map are known ones: the `finding`, `annotation` and
`topology_*` points are written by the test, from fabricscope.diagnosis.finding.Finding.to_record
and Records of the schema, through the real encoder (fabricscope.lineproto) into that
InfluxDB. What the live engine writes is asserted in test_diagnosis_smoke.py and, on
recorded runs, in tests/unit/test_diagnosis_corpus.py.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass

import pytest
import yaml

from fabricscope.services import http_get
from tests.support.servers import PrometheusServer
from fabricscope.surface.grafana import dashboards
from fabricscope.surface.grafana.macros import (ALL, ANNOTATION_INTERVAL, TimeRange, Variable, expand_influxql,
                                    expand_promql, panel_interval)
from fabricscope.surface.grafana.queries import ENGINE_METRICS, InfluxQL
from tests.support.grafana import query_index

pytestmark = pytest.mark.root

STEPS = 15
MAX_DATA_POINTS = 1000          # a panel about 1000 px wide
LOSSY_NODE = 1
#: measurements the run must have written (or this test wrote): their queries return rows
MUST_HAVE = {"gloo_step", "gloo_collective", "gloo_phase", "traffic_model", "train_step",
             "job_class",
             "nic_window", "nic_flow", "nic_qdisc", "tcp_node", "tcp_flow", "tcp_retransmit",
             "finding", "annotation", "topology_node", "topology_edge"}
#: fields of those that may be absent from every row, with why
OPTIONAL_FIELDS = {
    ("nic_window", "peak_util"): "no line rate on the lab's virtual links (veths): utilisation "
                                 "is left out rather than quoted against a guess",
    ("traffic_model", "burst_util"): "no line rate on the lab's virtual links",
    ("traffic_model", "period_s"): "stated only when the model found a period "
                                   "(fabricscope/trafficmodel.fit), which a short run on a "
                                   "loaded machine may not give it",
    **{("job_class", column): "the lab trains with DDP: only a served model has requests"
       for column in ("request p50", "request p99")},
}
#: ... and those that may be empty, with why
MAY_BE_EMPTY = {
    "nccl_call": "the lab trains over gloo; NCCL needs GPUs",
    "agent_loss": "written only when an agent loses records",
}
#: PromQL that may return nothing, with why (everything else must return series)
PROM_MAY_BE_EMPTY = {
    **{m: "exported by the diagnosis engine, off in this run (the test writes its points)"
       for m in ENGINE_METRICS},
    "ALERTS": "this Prometheus loads no alert rules (surface/alerting/generate.py's are tested there)",
    "fabricscope_collector_records_rejected_total": "a labelled counter: no series until "
                                                    "the collector rejects a record",
    "fabricscope_collector_sink_errors_total": "no series until a sink write fails",
}


class LabelledPrometheus(PrometheusServer):
    """tests.support.servers.PrometheusServer (every second) with whole scrape configs:
    the agents' targets carry their `node` label, as deploy/prometheus/
    prometheus.example.yaml relabels them in a cluster."""

    def __init__(self, scrape_configs: list[dict]):
        super().__init__({})
        self.scrape_configs = scrape_configs

    def _prepare(self) -> None:
        config = {"global": {"scrape_interval": self.interval,
                             "evaluation_interval": self.interval},
                  "scrape_configs": self.scrape_configs}
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))

    def api(self, path: str, **params) -> list[dict]:
        status, body = http_get(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}")
        data = json.loads(body)
        assert status == 200 and data["status"] == "success", (params, data)
        return data["data"]["result"]


@dataclass
class Run:
    stack: object
    prom: LabelledPrometheus
    job: str
    time_range: TimeRange
    nodes: tuple[str, ...]

    def influx(self, text: str) -> list[dict]:
        return self.stack.influx.query(text, db="fabricscope")


def _collector_metrics_addr(stack) -> str:
    text = stack.collector.log_path.read_text(errors="replace")
    return re.search(r"collector metrics on http://(\S+:\d+)/metrics", text).group(1)


def _scrape_configs(stack) -> list[dict]:
    """As deploy/prometheus/prometheus.example.yaml: the collector with honor_labels,
    the agents with the `node` label of their target."""
    agents = [{"targets": [f"{n.address}:9471"], "labels": {"node": f"node{n.index}"}}
              for n in stack.lab.nodes]
    return [{"job_name": "fabricscope-collector", "honor_labels": True,
             "static_configs": [{"targets": [_collector_metrics_addr(stack)]}]},
            {"job_name": "fabricscope-agent", "static_configs": agents}]


def _diagnosis_points(job: str, start_ns: int, end_ns: int) -> list:
    """Findings, annotations and the fabric graph, as the engine will write them."""
    from fabricscope.diagnosis.finding import Advice, Evidence, Finding
    from fabricscope.records import Record
    mid = (start_ns + end_ns) // 2
    lossy = Finding("lossy_link", "warning", job, {"node": "node1", "interface": "eth0",
                                                  "tor": "tor0", "rank": "1"}, mid,
                    "node1 eth0 drops 2 % of frames; grad sync +40 %; replace the cable",
                    first_seen_ns=mid, last_seen_ns=end_ns, step_seconds_added=0.2,
                    share_of_step=0.4, explained_share=0.9,
                    evidence=[Evidence("tcp_node", "retransmitted share", 0.02, "fraction",
                                       mid, end_ns, ["node1"])],
                    advice=[Advice("cable on node1 eth0", "replace", "loss independent of load")])
    straggler = Finding("straggler_network", "critical", job, {"node": "node1", "rank": "1"},
                        mid + 10**9, "rank 1's link slows the ring", first_seen_ns=mid)
    stall = Finding("input_stall", "info", job, {"peer": "198.18.0.254:9000"}, start_ns,
                    "data loading delayed step 3", end_ns=mid)
    records = [f.to_record() for f in (lossy, straggler, stall)]
    records += [Record("annotation", mid - 10**9, {"job": job, "node": "node0"},
                       {"text": "bucket_cap_mb 25 -> 50", "author": "sre@lab"}),
                Record("annotation", mid, {"job": "-"}, {"text": "switch firmware", "author":
                                                         "net@lab"})]
    for vertex, kind, health in (("node0", "node", 1.0), ("node1", "node", 0.0),
                                 ("node2", "node", 1.0), ("tor0", "tor", 1.0)):
        records.append(Record("topology_node", end_ns, {"id": vertex, "kind": kind, "job": job},
                              {"title": vertex, "subtitle": "tor0" if kind == "node" else "",
                               "health": health, "status": "ok" if health else "lossy_link",
                               "mainstat": "0.0 %", "secondarystat": "80 us"}))
    for source, target, kind in (("node0", "tor0", "port"), ("node1", "tor0", "port"),
                                 ("node2", "tor0", "port"), ("node0", "node1", "ring")):
        records.append(Record("topology_edge", end_ns, {"id": f"{source}->{target}",
                                                        "source": source, "target": target,
                                                        "kind": kind, "job": job},
                              {"health": 0.0 if "node1" in (source, target) else 1.0,
                               "mainstat": "2 %", "bytes_per_s": 1e8, "retrans_ratio": 0.02,
                               "rtt_p90_us": 80.0}))
    return records


def _job_class_points(stack, job: str) -> list:
    """The run's class, as the collector's analyzer (off in this run) decides it from
    the gloo_collective rows in InfluxDB."""
    from fabricscope.diagnosis.jobclass import JobClassAnalyzer
    from fabricscope.diagnosis.store import Store
    points = JobClassAnalyzer(Store(stack.influx.url, "fabricscope")).records(
        [job], time.time_ns())
    assert [p.tags["class"] for p in points] == ["data_parallel"], points
    return points


def _write(stack, records) -> None:
    from fabricscope import lineproto, schema
    for r in records:
        schema.validate(r)
    req = urllib.request.Request(f"{stack.influx.url}/write?db=fabricscope&precision=ns",
                                 data=lineproto.encode_many(records), method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 204


def _await_stored(stack, lab) -> None:
    from fabricscope.lab.stack import await_condition, await_stable

    def count(q: str) -> int:
        rows = stack.influx.query(q, db="fabricscope")
        return int(rows[0]["count"]) if rows else 0
    await_condition(lambda: count("SELECT count(seconds) FROM train_step WHERE rank='0'")
                    >= STEPS - 1, 60, "rank 0's steps in InfluxDB", 0.5)
    await_condition(lambda: all(stack.agent_metric(n.index, "fabricscope_agent_queue_records")
                                == 0 for n in lab.nodes), 60, "the agents' queues to drain")
    # each rank's process has exited: its agent writes its last traffic model then
    ranks = {str(n.index) for n in lab.nodes}

    def modelled() -> set[str]:
        return {row["value"] for row in stack.influx.query(
            'SHOW TAG VALUES FROM "traffic_model" WITH KEY = "rank"', db="fabricscope")}
    try:
        await_condition(lambda: modelled() >= ranks, 60, "every rank's traffic model", 0.5)
    except TimeoutError as exc:
        stepped = {row["value"] for row in stack.influx.query(
            'SHOW TAG VALUES FROM "gloo_step" WITH KEY = "rank"', db="fabricscope")}
        missing = sorted(ranks - modelled())
        tails = "; ".join(f"node{r}'s agent: {stack.agents[int(r)].log_tail(8)}"
                          for r in missing if int(r) in stack.agents)
        raise TimeoutError(f"{exc}: ranks modelled {sorted(modelled())} of {sorted(ranks)}, "
                           f"ranks with gloo steps {sorted(stepped)}; {tails}") from exc
    await_stable(lambda: (count("SELECT count(seconds) FROM gloo_phase"),
                          count("SELECT count(duty_cycle) FROM traffic_model")),
                 quiet_s=3.0, timeout_s=60, what="phases in InfluxDB")


@pytest.fixture(scope="module")
def run():
    from fabricscope.lab import faults
    from fabricscope.lab.dataserver import running_dataserver
    from fabricscope.lab.stack import running_stack
    from fabricscope.lab.running import running_lab
    from fabricscope.lab.training import start_training

    with running_lab(nodes=3, link_rate="1gbit") as lab, \
            running_stack(lab, agent_args=["--gloo-buffer-hooks",
                                           "--gloo-model-interval-s", "2"],
                          collector_args=["--no-diagnosis"]) as stack, \
            running_dataserver(lab, None) as server, \
            LabelledPrometheus(_scrape_configs(stack)) as prom:
        start_ms = int(time.time() * 1000) - 1000
        faults.loss(lab, LOSSY_NODE, 2)
        with start_training(lab, STEPS, model_mb=4, data_server=server, data_bytes=1 << 20,
                            checkpoint_every=5,
                            master_port=29000 + os.getpid() % 500) as training:
            list(training.steps())
            assert training.wait() == 0, training.error
        _await_stored(stack, lab)
        job = stack.influx.query('SHOW TAG VALUES FROM "gloo_step" WITH KEY = "job"',
                                 db="fabricscope")[0]["value"]
        _write(stack, _diagnosis_points(job, start_ms * 10**6, int(time.time() * 1e9)))
        _write(stack, _job_class_points(stack, job))
        prom.wait_for(lambda p: len(p.query("up == 1")) == 1 + len(lab.nodes), 30,
                      "scrape of the collector and every agent")
        yield Run(stack, prom, job, TimeRange(start_ms, int(time.time() * 1000) + 1000),
                  tuple(f"node{n.index}" for n in lab.nodes))


def variables(run: Run, node=ALL, interface=ALL) -> dict[str, Variable]:
    """The boards' variables with their options as their own queries find them."""
    board = json.loads((dashboards.GRAFANA_DIR / "dashboards" / "fabricscope-job.json")
                       .read_text())
    out: dict[str, Variable] = {}
    picks = {"job": run.job, "node": node, "interface": interface}
    for v in board["templating"]["list"]:
        text = expand_influxql(v["query"], run.time_range, out, ANNOTATION_INTERVAL)
        options = sorted({r["value"] for r in run.influx(text)})
        if v.get("regex"):        # Grafana filters the values with the variable's regex
            options = [o for o in options if re.search(v["regex"].strip("/"), o)]
        out[v["name"]] = Variable(v["name"], picks[v["name"]], tuple(options), v["multi"],
                                  v["includeAll"], v.get("allValue"))
    return out


def frames(rows: list[dict], q: InfluxQL) -> list[dict]:
    """Field names (and, for time series, display names) of the frames Grafana's InfluxDB
    backend makes of a result: one table, or one frame per series and column."""
    series: dict[tuple, dict] = {}
    for r in rows:
        key = (r["_series"], tuple(sorted(r["_tags"].items())))
        series.setdefault(key, {"tags": r["_tags"], "columns": [c for c in r if c not in
                                                                ("_series", "_tags", "time")],
                                "rows": []})["rows"].append(r)
    if q.result_format == "table":
        if not series:
            return []
        first = next(iter(series.values()))
        return [{"fields": ["Time", *first["tags"], *first["columns"]],
                 "rows": [{**s["tags"], **r} for s in series.values() for r in s["rows"]]}]
    out = []
    for (name, _), s in series.items():
        for column in s["columns"]:
            out.append({"fields": ["Time", "Value"], "name": _frame_name(q.alias, name, column,
                                                                         s["tags"]),
                        "tags": s["tags"], "rows": s["rows"]})
    return out


def _frame_name(alias: str, measurement: str, column: str, tags: dict) -> str:
    """util.FormatFrameName: $m, $col and $tag_<key> in the alias."""
    if not alias:
        return f"{measurement}.{column}"

    def one(m: re.Match) -> str:
        key = m.group(1) or m.group(2)
        if key in ("m", "measurement"):
            return measurement
        if key == "col":
            return column
        return tags.get(key[4:], "") if key.startswith("tag_") else m.group(0)
    return re.sub(r"\$(\w+)|\[\[([\s\S]+?)\]\]", one, alias)


def panel_targets(kind: str):
    """(board uid, panel, target, query) for every InfluxQL or PromQL target."""
    index = query_index()
    for path in sorted((dashboards.GRAFANA_DIR / "dashboards").glob("*.json")):
        board = json.loads(path.read_text())
        for p in board["panels"]:
            for t in p.get("targets", []):
                q = index[t.get("query") or t.get("expr")]
                if (kind == "influx") == isinstance(q, InfluxQL):
                    yield board["uid"], p, t, q


def test_variable_queries_find_the_labs_job_nodes_and_interfaces(run):
    v = variables(run)
    assert run.job in v["job"].options
    assert set(run.nodes) <= set(v["node"].options)
    assert v["interface"].options, "no interface found"


def test_every_influxql_panel_query_returns_what_its_panel_maps(run):
    v = variables(run)
    interval = panel_interval(run.time_range, MAX_DATA_POINTS, _influx_min_interval())
    for uid, panel, target, q in panel_targets("influx"):
        rows = run.influx(expand_influxql(q.text, run.time_range, v, interval))
        got = frames(rows, q)
        where = f"{uid} / {panel['title']} / {target['refId']}"
        if not got:
            if all((q.measurement, c) in OPTIONAL_FIELDS for c in q.columns):
                continue
            assert q.measurement not in MUST_HAVE, f"{where}: no rows for {q.text}"
            assert q.measurement in MAY_BE_EMPTY, where
            continue
        for f in got:
            if q.result_format == "table":
                assert set(f["fields"]) == {"Time", *q.group_tags, *q.columns}, where
            else:
                assert set(f["tags"]) == set(q.group_tags), where
        if panel["type"] != "nodeGraph":      # two frames: its own test below
            _check_panel_mapping(panel, got, where)


def _influx_min_interval() -> str:
    sources = yaml.safe_load((dashboards.GRAFANA_DIR / "provisioning" / "datasources" /
                              "fabricscope.yaml").read_text())["datasources"]
    return next(s for s in sources if s["type"] == "influxdb")["jsonData"]["timeInterval"]


def _check_panel_mapping(panel: dict, got: list[dict], where: str) -> None:
    """The fields the panel's options and transformations name are in the frames."""
    names = {n for f in got for n in f["fields"]}
    display = {f.get("name") for f in got}
    for o in panel.get("fieldConfig", {}).get("overrides", []):
        if o["matcher"]["id"] == "byName":
            assert o["matcher"]["options"] in names, where
    for t in panel.get("transformations", []):
        if t["id"] == "filterFieldsByName":
            pattern = t["options"]["include"]["pattern"]
            assert any(re.match(pattern, d or "") for d in display), (where, display)
        for name in [*t["options"].get("fields", []), *t["options"].get("indexByName", {}),
                     *t["options"].get("excludeByName", {})]:
            assert name in names, (where, name)


def test_node_graph_draws_the_lab_with_the_faulty_node(run):
    graph = next(p for _, p, _, _ in panel_targets("influx") if p["type"] == "nodeGraph")
    index = query_index()
    v = variables(run)
    rows = {t["refId"]: run.influx(expand_influxql(
        t["query"], run.time_range, v, ANNOTATION_INTERVAL)) for t in graph["targets"]}
    by_ref = {t["refId"]: frames(rows[t["refId"]], index[t["query"]])[0]
              for t in graph["targets"]}
    nodes = {r["id"]: r for r in by_ref["nodes"]["rows"]}
    assert set(nodes) == {"node0", "node1", "node2", "tor0"}
    assert all(abs(r["arc__healthy"] + r["arc__faulty"] - 1) < 1e-9 for r in nodes.values())
    assert nodes["node1"]["arc__faulty"] == 1 and nodes["node1"]["detail__status"] == "lossy_link"
    for edge in by_ref["edges"]["rows"]:
        assert edge["source"] in nodes and edge["target"] in nodes


def panel_rows(run: Run, uid: str, title: str, variables_=None) -> list[dict]:
    """The rows of one panel's queries, expanded as for the whole time range."""
    interval = panel_interval(run.time_range, MAX_DATA_POINTS, _influx_min_interval())
    return [r for u, p, _, q in panel_targets("influx") if (u, p["title"]) == (uid, title)
            for r in run.influx(expand_influxql(q.text, run.time_range,
                                                variables_ or variables(run), interval))]


def test_the_lossy_port_shows_on_the_boards(run):
    by_kind = panel_rows(run, "fabricscope-fabric", "Retransmitted segments by kind")
    assert sum(r["fast"] + r["rto"] + r["tlp"] + r["slow_start"] for r in by_kind) > 0
    ranks = panel_rows(run, "fabricscope-collectives",
                       "Retransmits of the job's ranks (NCCL and gloo)")
    assert str(LOSSY_NODE) in {r["_tags"]["rank"] for r in ranks if r["segs"]}
    drops = panel_rows(run, "fabricscope-fabric", "Qdisc backlog")
    assert {r["_tags"]["kind"] for r in drops} == {"tbf"}      # the lab's shaped links


def test_a_node_selection_narrows_the_nic_heatmap(run):
    _, panel, target, q = next(x for x in panel_targets("influx") if x[1]["type"] == "heatmap")
    interval = panel_interval(run.time_range, MAX_DATA_POINTS, _influx_min_interval())
    for pick in [("node1",), ("node0", "node2")]:
        rows = run.influx(expand_influxql(q.text, run.time_range,
                                          variables(run, node=pick), interval))
        assert {r["_tags"]["node"] for r in rows} == set(pick)
        assert max(r[q.columns[0]] for r in rows) > 0     # the run loaded every NIC


def test_annotations_show_the_notes_and_the_open_findings(run):
    board = json.loads((dashboards.GRAFANA_DIR / "dashboards" / "fabricscope-job.json")
                       .read_text())
    v = variables(run)
    events = {}
    for a in board["annotations"]["list"]:
        rows = run.influx(expand_influxql(a["target"]["query"], run.time_range, v,
                                          ANNOTATION_INTERVAL))
        events[a["name"]] = sorted(r[a["target"]["textColumn"]] for r in rows)
        for r in rows:
            assert all(r.get(c) for c in a["target"]["tagsColumn"].split(","))
    assert events["fabricscope annotate"] == ["bucket_cap_mb 25 -> 50", "switch firmware"]
    assert events["Open findings (start)"] == ["node1 eth0 drops 2 % of frames; grad sync "
                                               "+40 %; replace the cable",
                                               "rank 1's link slows the ring"]


def test_every_prometheus_panel_query_runs_against_prometheus(run):
    v = variables(run)
    interval = panel_interval(run.time_range, MAX_DATA_POINTS, "1s")
    for uid, panel, target, q in panel_targets("prom"):
        r = expand_promql(q.expr, run.time_range, v, interval, MAX_DATA_POINTS,
                          scrape_interval="1s")       # this Prometheus scrapes every second
        if target.get("instant"):
            result = run.prom.api("query", query=r.expr, time=r.end_ms / 1000)
        else:
            result = run.prom.api("query_range", query=r.expr, start=r.start_ms / 1000,
                                  end=r.end_ms / 1000, step=r.step_ms / 1000)
        where = f"{uid} / {panel['title']} / {target['refId']}: {r.expr}"
        if not result:
            assert any(m in PROM_MAY_BE_EMPTY for m in q.metrics), where
        for series in result:
            for label in re.findall(r"\{\{(\w+)\}\}", q.legend):
                assert label in series["metric"], where
