"""The Grafana boards as generated: current, loadable by Grafana's SDK, well formed.

No Grafana server runs here. The JSON is checked against Grafana's own typed model
(grafana-foundation-sdk): loading it back must lose nothing but the InfluxQL
annotation fields the SDK does not model. tests/kernel/test_dashboards_live.py runs
every query against real servers."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from fabricscope.errors import UserError
from fabricscope.schema import measurements
from fabricscope.surface.grafana import dashboards
from fabricscope.surface.grafana.queries import InfluxQL, PromNames, PromQL, agg, select, tag_values
from fabricscope.surface.grafana.panels import INFLUX, PROMETHEUS
from tests.support.grafana import query_index, register_sdk_plugins

VARIABLES = ["job", "node", "interface"]
#: what Grafana's InfluxDB datasource keeps on an InfluxQL annotation target
ANNOTATION_TARGET_KEYS = {"query", "queryType", "fromAnnotations", "textColumn", "tagsColumn",
                          "titleColumn", "timeEndColumn", "name", "limit", "matchAny", "tags",
                          "type"}


@pytest.fixture(scope="module")
def boards() -> dict[str, dict]:
    return {b.uid: dashboards.dashboard_json(b) for b in dashboards.boards()}


def panels(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p["type"] not in ("row", "text")]


def lost(original, loaded, path: str = "") -> list[str]:
    """What `loaded` dropped or changed from `original` (defaults it adds are fine)."""
    if isinstance(original, dict):
        if not isinstance(loaded, dict):
            return [f"{path}: became {loaded!r}"]
        out = []
        for key, value in original.items():
            out += [f"{path}.{key}: dropped"] if key not in loaded \
                else lost(value, loaded[key], f"{path}.{key}")
        return out
    if isinstance(original, list):
        if not isinstance(loaded, list) or len(loaded) != len(original):
            return [f"{path}: became {loaded!r}"]
        return [p for i, (a, b) in enumerate(zip(original, loaded))
                for p in lost(a, b, f"{path}[{i}]")]
    return [] if original == loaded else [f"{path}: {original!r} became {loaded!r}"]


def test_checked_in_files_are_what_the_code_generates(tmp_path):
    dashboards.write(tmp_path)
    generated = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.*"))
    for path in generated:
        checked_in = dashboards.GRAFANA_DIR / path
        assert checked_in.is_file() and checked_in.read_text() == (tmp_path / path).read_text(), \
            f"grafana/{path} is stale: run `python -m fabricscope.surface.grafana`"
    assert dashboards.stale() == []
    assert dashboards.main(["--check"]) == 0


def test_generation_is_deterministic():
    assert dashboards.files() == dashboards.files()


def test_check_names_what_is_stale(tmp_path, capsys):
    dashboards.write(tmp_path)
    (tmp_path / "dashboards" / "fabricscope-job.json").write_text("{}")
    (tmp_path / "dashboards" / "retired.json").write_text("{}")
    assert dashboards.main(["--check", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "fabricscope-job.json" in out and "retired.json" in out


def test_lost_reports_drops_and_changes_not_additions():
    assert lost({"a": 1, "b": [{"c": 2}]}, {"a": 1, "b": [{"c": 2, "d": 3}], "e": 4}) == []
    assert lost({"a": 1, "b": [{"c": 2}]}, {"a": 2, "b": [{}]}) == \
        [".a: 1 became 2", ".b[0].c: dropped"]


def test_dashboards_load_into_the_sdk_model(boards):
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard
    register_sdk_plugins()
    for uid, board in boards.items():
        loaded = json.loads(json.dumps(Dashboard.from_json(board), cls=JSONEncoder))
        problems = [p for p in lost(board, loaded)
                    if not re.match(r"\.annotations\.list\[\d+\]\.target\.", p)]
        assert problems == [], uid
        for annotation in board["annotations"]["list"]:
            assert set(annotation["target"]) == ANNOTATION_TARGET_KEYS


def test_boards_and_their_links(boards):
    assert set(boards) == {"fabricscope-job", "fabricscope-fabric", "fabricscope-collectives",
                           "fabricscope-topology", "fabricscope-findings", "fabricscope-pipeline"}
    from fabricscope.surface.alerting.catalog import BOARDS
    assert {uid for uid, _ in BOARDS.values()} <= set(boards)    # alerts link to these
    for board in boards.values():
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)) and 2 <= len(panels(board)) <= 20
        assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in board["panels"])


def test_every_panel_has_a_datasource_and_queries(boards):
    uids = {INFLUX.uid, PROMETHEUS.uid}
    for board in boards.values():
        for p in panels(board):
            assert p["datasource"]["uid"] in uids and p["targets"], p["title"]
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs))
            for t in p["targets"]:
                assert t["datasource"] == p["datasource"]
                if t["datasource"]["type"] == "influxdb":
                    assert t["rawQuery"] is True and t["query"].startswith("SELECT ")
                    assert t["resultFormat"] in ("time_series", "table")
                else:
                    assert t["expr"] and (t.get("range") or t.get("instant"))


def test_every_query_filters_by_the_variables_it_can(boards):
    index = query_index()
    for board in boards.values():
        for p in panels(board):
            for t in p["targets"]:
                q = index[t.get("query") or t.get("expr")]
                if isinstance(q, PromQL):
                    continue
                tags = measurements()[q.measurement].all_tags()
                for var in VARIABLES:
                    assert (f'"{var}" =~ /^${var}$/' in q.text) == (var in tags), q.text
                # open findings are a state of now; everything else is in the time range
                assert "$timeFilter" in q.text or '"open" = true' in q.text, q.text


def test_variables_are_well_formed(boards):
    for board in boards.values():
        variables = board["templating"]["list"]
        assert [v["name"] for v in variables] == VARIABLES
        for i, v in enumerate(variables):
            assert v["datasource"] == INFLUX.to_json() and v["type"] == "query"
            m = re.fullmatch(r'SHOW TAG VALUES FROM (.+) WITH KEY = "(\w+)"( WHERE .*)?',
                             v["query"])
            assert m and m.group(2) == v["name"], v["query"]
            for name in re.findall(r'"(\w+)"', m.group(1)):
                assert v["name"] in measurements()[name].all_tags()
            used = re.findall(r"\$(\w+)", m.group(3) or "")
            assert set(used) <= {w["name"] for w in variables[:i]}   # defined before use
            assert v["multi"] == v["includeAll"] == (v["name"] != "job")
            assert v.get("allValue") == (".*" if v["multi"] else None)


def test_annotation_queries_are_well_formed(boards):
    for board in boards.values():
        names = [a["name"] for a in board["annotations"]["list"]]
        assert names == ["fabricscope annotate", "Open findings (start)"]
        for a in board["annotations"]["list"]:
            t = a["target"]
            assert a["datasource"] == INFLUX.to_json() and a["enable"]
            assert "$timeFilter" in t["query"] and t["query"].startswith("SELECT ")
            selected = re.findall(r'"(\w+)"', t["query"].split(" FROM ")[0])
            assert t["textColumn"] in selected
            assert set(t["tagsColumn"].split(",")) <= set(selected)


def test_panels_map_fields_their_queries_select(boards):
    """Field names the panels refer to (overrides, transformations, node graph fields)
    are columns or tags of their queries (the live test checks the data)."""
    index = query_index()
    for board in boards.values():
        for p in panels(board):
            queries = [index[t.get("query") or t.get("expr")] for t in p["targets"]]
            if not all(isinstance(q, InfluxQL) for q in queries):
                continue
            fields = {"Time"} | {c for q in queries for c in q.columns + q.group_tags}
            for name in referenced_fields(p):
                assert name in fields, (p["title"], name)


def referenced_fields(panel: dict) -> set[str]:
    names = {o["matcher"]["options"] for o in panel.get("fieldConfig", {}).get("overrides", [])
             if o["matcher"]["id"] == "byName"}
    for t in panel.get("transformations", []):
        names |= set(t["options"].get("fields", []))
        names |= set(t["options"].get("excludeByName", {}))
    if panel["type"] == "nodeGraph":
        names |= {"id"} | {a["field"] for a in panel["options"]["nodes"]["arcs"]}
    return names


def test_node_graph_frames_have_the_fields_grafana_reads(boards):
    graph = next(p for p in panels(boards["fabricscope-topology"]) if p["type"] == "nodeGraph")
    index = query_index()
    by_ref = {t["refId"]: index[t["query"]] for t in graph["targets"]}
    nodes, edges = by_ref["nodes"], by_ref["edges"]
    assert {"id", "title", "subtitle", "mainstat", "secondarystat"} <= \
        set(nodes.columns + nodes.group_tags)
    assert {"id", "source", "target", "mainstat"} <= set(edges.columns + edges.group_tags)
    assert all(q.result_format == "table" for q in (nodes, edges))


def test_provisioning_names_the_uids_the_panels_use(boards):
    root = dashboards.GRAFANA_DIR / "provisioning"
    sources = yaml.safe_load((root / "datasources" / "fabricscope.yaml").read_text())
    by_uid = {s["uid"]: s for s in sources["datasources"]}
    assert by_uid[INFLUX.uid]["type"] == "influxdb"
    assert by_uid[INFLUX.uid]["jsonData"]["version"] == "InfluxQL"
    assert by_uid[PROMETHEUS.uid]["type"] == "prometheus"
    used = {p["datasource"]["uid"] for b in boards.values() for p in panels(b)}
    assert used == set(by_uid)
    provider = yaml.safe_load((root / "dashboards" / "fabricscope.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == dashboards.DASHBOARDS_PATH


@pytest.mark.parametrize("make, message", [
    (lambda: select("gloo_steps", [agg("mean", "seconds")]), "measurement 'gloo_steps'"),
    (lambda: select("gloo_step", [agg("mean", "second")]), "field 'second'"),
    (lambda: select("gloo_step", [agg("mean", "seconds")], by_tags=("op",)), "tag 'op'"),
    (lambda: tag_values(("nic_window",), "job"), "tag 'job'"),
    (lambda: PromNames().query("fabricscope_agent_nope", "fabricscope_agent_nope"),
     "metric 'fabricscope_agent_nope'"),
])
def test_a_name_outside_the_schema_fails_generation(make, message):
    with pytest.raises(UserError, match=message):
        make()


def test_the_cli_reports_a_bad_name_in_one_line(monkeypatch, capsys, tmp_path):
    def broken():
        select("gloo_step", [agg("mean", "no_such_field")])
    monkeypatch.setattr(dashboards, "BOARD_FUNCTIONS", (broken,))
    assert dashboards.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fabricscope: error: ") and "; fix: " in err and "\n" not in err
    assert not list(tmp_path.iterdir())


def test_prometheus_names_come_from_the_registries():
    names = PromNames().known
    assert {"fabricscope_collector_records_written_total", "fabricscope_agent_spool_bytes",
            "fabricscope_agent_events_lost_total",
            "fabricscope_agent_poll_seconds_count"} <= names


def test_the_job_class_panels_show_a_classification_s_columns_in_reading_order():
    from fabricscope.jobclass import Observation, classify
    from fabricscope.surface import jobclass
    from fabricscope.surface.grafana.boards import (job_class_panels, latest_job_class,
                                                    training_job)
    from fabricscope.surface.grafana.panels import Board
    ring = [Observation("AllReduce", 1 << 20, s * 10**9 + k * 10**7, s * 10**9 + k * 10**7 + 10**6,
                        rank=0) for s in range(8) for k in range(2)]
    row = jobclass.columns(classify(ring))
    assert list(row) == list(jobclass.COLUMNS) and row["class"] == "data_parallel"
    board = dashboards.dashboard_json(job_class_panels(Board("t", "t", "t"),
                                                       latest_job_class()))
    (table,) = [p for p in board["panels"] if p["type"] == "table"]
    assert table["title"] == "Job class and what decided it"
    assert "ORDER BY time DESC LIMIT 1" in table["targets"][0]["query"]
    job = dashboards.dashboard_json(training_job())
    assert "Job class and what decided it" in [p["title"] for p in job["panels"]]
    (organize,) = table["transformations"]
    assert list(organize["options"]["indexByName"])[:3] == ["class", "reason", "components"]
