"""Panels, variables and annotations of the fabricscope boards, on Grafana's own
builders (grafana-foundation-sdk, generated for Grafana 11.6).

The SDK has no InfluxDB query type, so `InfluxTarget` is one: the JSON Grafana's
InfluxDB datasource stores for a raw InfluxQL query (`query`, `rawQuery`,
`resultFormat`, `alias`), registered with the SDK's runtime so dashboards load
back into its model. InfluxQL annotations use the target shape Grafana's InfluxDB
datasource migrates its annotations to (public/app/plugins/datasource/influxdb/
migrations.ts), which the SDK's AnnotationTarget does not model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import (heatmap, nodegraph, prometheus, stat, statetimeline,
                                             table, text, timeseries, xychart)
from grafana_foundation_sdk.cog import variants
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as heatmap_model
from grafana_foundation_sdk.models import text as text_model
from grafana_foundation_sdk.models import xychart as xym

from fabricscope.surface.grafana.queries import InfluxQL, PromQL, tag_values

INFLUX = dm.DataSourceRef(type_val="influxdb", uid="fabricscope-influxdb")
PROMETHEUS = dm.DataSourceRef(type_val="prometheus", uid="fabricscope-prometheus")
_REF_IDS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class InfluxTarget(variants.Dataquery):
    """A raw InfluxQL query as Grafana's InfluxDB datasource stores it."""

    def __init__(self, ref_id: str = "A", query: str = "", result_format: str = "time_series",
                 alias: str = "", datasource: dm.DataSourceRef | None = None) -> None:
        self.ref_id, self.query, self.result_format, self.alias = ref_id, query, result_format, alias
        self.datasource = datasource or INFLUX

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"refId": self.ref_id, "datasource": self.datasource,
                                  "query": self.query, "rawQuery": True,
                                  "resultFormat": self.result_format}
        if self.alias:
            out["alias"] = self.alias
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "InfluxTarget":
        return cls(data.get("refId", ""), data.get("query", ""),
                   data.get("resultFormat", "time_series"), data.get("alias", ""),
                   dm.DataSourceRef.from_json(data.get("datasource") or {}))


class _Built:
    """A builder for an object that is already built (the SDK builders want one)."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def build(self) -> Any:
        return self._obj


class _AnnotationTarget:
    def __init__(self, name: str, query: InfluxQL, text: str, tags: str, title: str = ""):
        self.payload = {"query": query.text, "queryType": "tags", "fromAnnotations": True,
                        "textColumn": text, "tagsColumn": tags, "titleColumn": title,
                        "timeEndColumn": "", "name": name, "limit": 100, "matchAny": False,
                        "tags": [], "type": "dashboard"}

    def to_json(self) -> dict[str, object]:
        return dict(self.payload)


def influx_annotation(name: str, query: InfluxQL, *, text: str, tags: str, color: str,
                      title: str = "") -> db.AnnotationQuery:
    """An annotation from an InfluxQL query: each row an event at its time, `text`
    its text column, `tags` its comma-separated tag columns."""
    for column in [text, title, *tags.split(",")]:
        if column and column not in query.columns:
            raise ValueError(f"annotation {name!r} maps column {column!r} that its query "
                             f"does not select ({query.columns})")
    return (db.AnnotationQuery().name(name).datasource(INFLUX).enable(True).hide(False)
            .icon_color(color).target(_Built(_AnnotationTarget(name, query, text, tags, title))))


def query_variable(name: str, label: str, query: str, *, multi: bool,
                   regex: str = "") -> db.QueryVariable:
    """A variable from SHOW TAG VALUES. Multi-value ones offer All as `.*`, so that an
    optional tag's empty value (a job-wide finding has no node) still matches."""
    v = (db.QueryVariable(name).label(label).query(query).datasource(INFLUX)
         .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
         .multi(multi).include_all(multi).allow_custom_value(False))
    if multi:
        v = v.all_value(".*")
    return v.regex(regex) if regex else v


def standard_variables() -> list[db.QueryVariable]:
    """job, node and interface: on every board, filtered by every query that can."""
    jobs = tag_values(("gloo_step", "train_step", "finding"), "job")
    return [
        # `-` is what annotations and the fabric-wide graph use for "no job"
        query_variable("job", "Job", jobs, multi=False, regex="/^(?!-$).+$/"),
        query_variable("node", "Node", tag_values(("tcp_node", "nic_window"), "node"),
                       multi=True),
        query_variable("interface", "Interface",
                       tag_values(("nic_window",), "interface", filter_by=("node",)), multi=True),
    ]


@dataclass
class Board:
    """One dashboard being built: panels get stable ids, targets their ref ids, and
    every query is kept (`queries`) so the tests can run each one."""

    uid: str
    title: str
    description: str
    dash: db.Dashboard = field(init=False)
    queries: list[InfluxQL | PromQL] = field(default_factory=list)
    _next_id: int = field(default=1, init=False)

    def __post_init__(self) -> None:
        self.dash = (db.Dashboard(self.title).uid(self.uid).description(self.description)
                     .tags(["fabricscope"]).editable().time("now-1h", "now").refresh("30s")
                     .timezone("browser").tooltip(dm.DashboardCursorSync.CROSSHAIR)
                     .variables(standard_variables()))

    def annotate(self, *annotations: db.AnnotationQuery) -> "Board":
        self.dash = self.dash.annotations(list(annotations))
        return self

    def row(self, title: str) -> "Board":
        self.dash = self.dash.with_row(db.Row(title).id(self._take_id()))
        return self

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _targets(self, panel, queries: list[InfluxQL | PromQL], refs=_REF_IDS):
        for ref, q in zip(refs, queries):
            self.queries.append(q)
            if isinstance(q, InfluxQL):
                panel = panel.with_target(_Built(InfluxTarget(ref, q.text, q.result_format,
                                                              q.alias)))
            else:
                target = (prometheus.Dataquery().ref_id(ref).expr(q.expr).datasource(PROMETHEUS)
                          .legend_format(q.legend or "__auto"))
                panel = panel.with_target(target.instant() if q.instant else target.range())
        kinds = {type(q) for q in queries}
        if len(kinds) != 1:
            raise ValueError("a panel queries one datasource (no mixed panels here)")
        return panel.datasource(PROMETHEUS if kinds == {PromQL} else INFLUX)

    def add(self, panel, queries: list[InfluxQL | PromQL], *, title: str, description: str,
            w: int, h: int, refs=_REF_IDS) -> "Board":
        panel = panel.id(self._take_id()).title(title).description(description).span(w).height(h)
        self.dash = self.dash.with_panel(self._targets(panel, queries, refs))
        return self

    # -- panel kinds --------------------------------------------------------------------

    def timeseries(self, title: str, queries: list, *, description: str, unit: str = "",
                   w: int = 12, h: int = 8, stack: bool = False, bars: bool = False,
                   min_val: float | None = None) -> "Board":
        p = timeseries.Panel().unit(unit).fill_opacity(20 if stack else 0).line_width(1)
        if stack:
            p = p.stacking(cb.StackingConfig().mode(common.StackingMode.NORMAL))
        if bars:
            p = p.draw_style(common.GraphDrawStyle.BARS).fill_opacity(60)
        if min_val is not None:
            p = p.min(min_val)
        return self.add(p, queries, title=title, description=description, w=w, h=h)

    def stat(self, title: str, queries: list, *, description: str, unit: str = "",
             w: int = 6, h: int = 4, thresholds: list[tuple[float | None, str]] = (),
             calc: str = "lastNotNull", no_value: str = "") -> "Board":
        """One number; `calc` reduces the series (lastNotNull, sum, max); `no_value` is
        what it says when the store has none (why the field may be absent)."""
        p = (stat.Panel().unit(unit).graph_mode(common.BigValueGraphMode.AREA)
             .reduce_options(cb.ReduceDataOptions().calcs([calc])))
        if no_value:
            p = p.no_value(no_value)
        if thresholds:
            p = p.thresholds(db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
                [dm.Threshold(value=v, color=c) for v, c in thresholds]))
        return self.add(p, queries, title=title, description=description, w=w, h=h)

    def table(self, title: str, queries: list, *, description: str, order: list[str],
              json_columns: tuple[str, ...] = (), hide: tuple[str, ...] = (),
              w: int = 24, h: int = 8) -> "Board":
        """A table whose columns come in `order` (the ones a person reads first), JSON
        columns shown as JSON, `hide` left out."""
        p = table.Panel().show_header(True).cell_height(common.TableCellHeight.MD)
        p = p.with_transformation(dm.DataTransformerConfig(id_val="organize", options={
            "indexByName": {name: i for i, name in enumerate(order)},
            "excludeByName": {name: True for name in hide}, "renameByName": {}}))
        for column in json_columns:
            p = p.override_by_name(column, [dm.DynamicConfigValue(
                id_val="custom.cellOptions", value={"type": "json-view"})])
        return self.add(p, queries, title=title, description=description, w=w, h=h)

    def state_timeline(self, title: str, queries: list, *, description: str, include: str,
                       colors: dict[str, str], w: int = 24, h: int = 8) -> "Board":
        """One row per series whose name matches the regex `include`, coloured by its
        string value (each state holds until the next)."""
        p = (statetimeline.Panel().show_value(common.VisibilityMode.NEVER).merge_values(True)
             .row_height(0.8).mappings([dm.ValueMap(options={
                 value: dm.ValueMappingResult(color=color, index=i)
                 for i, (value, color) in enumerate(colors.items())})])
             .with_transformation(dm.DataTransformerConfig(
                 id_val="filterFieldsByName", options={"include": {"pattern": include}})))
        return self.add(p, queries, title=title, description=description, w=w, h=h)

    def text(self, title: str, markdown: str, *, description: str, w: int = 12,
             h: int = 8) -> "Board":
        p = (text.Panel().mode(text_model.TextMode.MARKDOWN).content(markdown)
             .id(self._take_id()).title(title).description(description).span(w).height(h))
        self.dash = self.dash.with_panel(p)
        return self

    def heatmap(self, title: str, queries: list, *, description: str, unit: str,
                scale_max: float | None = None, w: int = 24, h: int = 10) -> "Board":
        """Each series one row of cells, coloured by its value (not bucketed) from 0 to
        scale_max (default: the largest value shown)."""
        colors = (heatmap.HeatmapColorOptions().mode(heatmap_model.HeatmapColorMode.SCHEME)
                  .scheme("Turbo").min(0).steps(32))
        if scale_max is not None:
            colors = colors.max(scale_max)
        p = (heatmap.Panel().calculate(False).color(colors).cell_gap(1)
             .y_axis(heatmap.YAxisConfig().unit("").reverse(False))
             .cell_values(heatmap.CellValues().unit(unit)).show_value(common.VisibilityMode.NEVER))
        return self.add(p, queries, title=title, description=description, w=w, h=h)

    def node_graph(self, title: str, nodes: InfluxQL, edges: InfluxQL, *, description: str,
                   arcs: dict[str, str], w: int = 24, h: int = 14) -> "Board":
        p = nodegraph.Panel().nodes(nodegraph.NodeOptions().arcs(
            [nodegraph.ArcOption().field(name).color(color) for name, color in arcs.items()]))
        # the panel tells its two frames apart by refId
        return self.add(p, [nodes, edges], title=title, description=description, w=w, h=h,
                        refs=("nodes", "edges"))

    def xy(self, title: str, queries: list, *, description: str, split_by: str,
           x_unit: str, y_unit: str, w: int = 12, h: int = 8) -> "Board":
        """Points (first numeric column, second), one series per value of `split_by`."""
        p = (xychart.Panel().mapping(xym.SeriesMapping.AUTO).show(xym.XYShowMode.POINTS)
             .unit(y_unit)
             .with_transformation(dm.DataTransformerConfig(
                 id_val="partitionByValues", options={"fields": [split_by],
                                                      "keepFields": False}))
             .override_by_name(queries[0].columns[0], [dm.DynamicConfigValue(
                 id_val="unit", value=x_unit)]))
        return self.add(p, queries, title=title, description=description, w=w, h=h)

