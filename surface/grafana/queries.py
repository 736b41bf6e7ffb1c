"""Every dashboard query, built from the names the project declares once.

InfluxQL queries name measurements, fields and tags of the schema
(fabricscope/measurements/, `fabricscope.schema.measurements()`); PromQL queries
name metrics of the collector's and agents' registries (collector/metrics.py,
agent/metrics.py). A name that is not there fails at generation time with a
one-line UserError, so a renamed field breaks `python -m fabricscope.surface.grafana`, not
a panel in production.

Every InfluxQL query filters on the dashboard variables `job`, `node` and
`interface` wherever its measurement has that tag (an optional tag also matches
points without it), so each board narrows the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fabricscope.errors import UserError
from fabricscope.schema import Measurement, measurements
from fabricscope.surface.metrics import FINDING_ACTIVE, FINDINGS_OPENED, JOB_GAUGE_NAMES

#: dashboard variable -> the tag it filters
VARIABLE_TAGS = ("job", "node", "interface")

#: metrics the diagnosis engine exports (surface/metrics.py names them for the alerts
#: too); until the engine runs in the collector, queries on them return nothing
ENGINE_METRICS = frozenset({FINDING_ACTIVE, FINDINGS_OPENED, *JOB_GAUGE_NAMES})
#: series Prometheus itself makes
PROMETHEUS_BUILTINS = frozenset({"up", "ALERTS", "ALERTS_FOR_STATE"})


def measurement(name: str) -> Measurement:
    found = measurements().get(name)
    if found is None:
        raise UserError(f"dashboard query names measurement {name!r}, which the schema lacks",
                        "use a name from docs/SCHEMA.md or declare it in "
                        "fabricscope/measurements/")
    return found


def check_field(m: Measurement, name: str) -> str:
    if name not in m.fields:
        raise UserError(f"dashboard query names field {name!r}, which {m.name} lacks",
                        f"use one of {', '.join(sorted(m.fields))}")
    return name


def check_tag(m: Measurement, name: str) -> str:
    if name not in m.all_tags():
        raise UserError(f"dashboard query names tag {name!r}, which {m.name} lacks",
                        f"use one of {', '.join(sorted(m.all_tags()))}")
    return name


@dataclass(frozen=True)
class Col:
    """One selected column: `fn("field") AS "alias"`, a raw field or tag, or an
    arithmetic expression over one aggregate (`1 - last("health")`)."""

    field: str
    fn: str = ""                 # mean, max, sum, last, percentile, ... ; "" = raw value
    alias: str = ""
    arg: str = ""                # second argument (percentile's N)
    template: str = "{}"         # arithmetic around the term: "1 - {}"

    @property
    def name(self) -> str:
        """The column's name in the result (InfluxDB names an aggregate by its function)."""
        return self.alias or (self.fn if self.fn else self.field)

    def render(self) -> str:
        term = f'"{self.field}"'
        if self.fn:
            term = f"{self.fn}({term}{', ' + self.arg if self.arg else ''})"
        text = self.template.format(term)
        return f'{text} AS "{self.alias}"' if self.alias else text


def agg(fn: str, field_name: str, alias: str = "", arg: str = "") -> Col:
    return Col(field_name, fn, alias or field_name, arg)


def raw(name: str, alias: str = "") -> Col:
    return Col(name, "", alias)


@dataclass(frozen=True)
class InfluxQL:
    """One InfluxQL query of a panel, with what its result must hold."""

    text: str
    measurement: str
    columns: tuple[str, ...]            # value columns of the result (after `time`)
    group_tags: tuple[str, ...] = ()    # tags of each series (GROUP BY)
    result_format: str = "time_series"  # or "table"
    alias: str = ""                     # Grafana's series naming ($tag_node ...)


def variable_filters(m: Measurement, wildcards: dict[str, str] | None = None,
                     strict: tuple[str, ...] = ()) -> list[str]:
    """`"tag" =~ /^$tag$/` for each variable tag the measurement has. An optional tag
    also matches points without it (a job-wide finding has no node) unless `strict`;
    a wildcard value matches every selection (an annotation for job `-` is for all)."""
    conditions = []
    for tag in VARIABLE_TAGS:
        if tag not in m.all_tags():
            continue
        match = f'"{tag}" =~ /^${tag}$/'
        if tag in (wildcards or {}):
            match = f"({match} OR \"{tag}\" = '{wildcards[tag]}')"
        elif tag in m.optional_tags and tag not in strict:
            match = f"({match} OR \"{tag}\" = '')"
        conditions.append(match)
    return conditions


def select(name: str, columns: list[Col], *, where: tuple[str, ...] = (),
           where_tags: dict[str, str] | None = None, by_time: bool = True,
           by_tags: tuple[str, ...] = (), fill: str = "none", time_filter: bool = True,
           tail: str = "", result_format: str = "time_series", alias: str = "",
           wildcards: dict[str, str] | None = None, strict: tuple[str, ...] = ()) -> InfluxQL:
    """SELECT columns FROM name WHERE <variables> AND <where> AND $timeFilter GROUP BY ...

    where: extra conditions on fields (`"open" = true`); where_tags: tag = value;
    wildcards, strict: see variable_filters."""
    m = measurement(name)
    for c in columns:
        if c.fn or c.field not in m.all_tags():
            check_field(m, c.field)
    conditions = variable_filters(m, wildcards, strict)
    for tag, value in (where_tags or {}).items():
        conditions.append(f"\"{check_tag(m, tag)}\" = '{value}'")
    for condition in where:
        field_name = condition.split('"')[1]
        check_field(m, field_name)
        conditions.append(condition)
    if time_filter:
        conditions.append("$timeFilter")
    groups = ["time($__interval)"] if by_time else []
    groups += [f'"{check_tag(m, t)}"' for t in by_tags]
    text = f'SELECT {", ".join(c.render() for c in columns)} FROM "{name}"'
    if conditions:
        text += " WHERE " + " AND ".join(conditions)
    if groups:
        text += " GROUP BY " + ", ".join(groups)
    if by_time and fill:
        text += f" fill({fill})"
    if tail:
        text += " " + tail
    # a series is named by its column (`p99`), not `measurement.column`, unless told
    alias = alias or ("$col" if result_format == "time_series" else "")
    return InfluxQL(text, name, tuple(c.name for c in columns), tuple(by_tags),
                    result_format, alias)


def tag_values(names: tuple[str, ...], tag: str, *, filter_by: tuple[str, ...] = ()) -> str:
    """A variable's options: SHOW TAG VALUES of one tag over some measurements,
    narrowed by other variables."""
    found = [measurement(n) for n in names]
    for m in found:
        for t in (tag, *filter_by):
            check_tag(m, t)
    sources = ", ".join(f'"{n}"' for n in names)
    text = f'SHOW TAG VALUES FROM {sources} WITH KEY = "{tag}"'
    conditions = [f'"{t}" =~ /^${t}$/' for t in filter_by]
    return text + (" WHERE " + " AND ".join(conditions) if conditions else "")


# -- PromQL ---------------------------------------------------------------------------------

def _registry_names(registry) -> set[str]:
    """Sample names a registry exposes (a counter `x` is scraped as `x_total`)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
                "summary": ("_count", "_sum", ""), "gauge": ("",), "info": ("_info",)}
    names = set()
    for family in registry.collect():
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


def exported_metrics() -> frozenset[str]:
    from fabricscope.agent.metrics import AgentMetrics
    from fabricscope.collector.metrics import CollectorMetrics
    return frozenset(_registry_names(CollectorMetrics().registry)
                     | _registry_names(AgentMetrics().registry))


@dataclass(frozen=True)
class PromQL:
    """One PromQL query of a panel."""

    expr: str
    metrics: tuple[str, ...]
    legend: str = ""
    instant: bool = False
    pending: bool = False       # names a metric the diagnosis engine does not export yet


@dataclass
class PromNames:
    """Checks metric names against what the components export."""

    known: frozenset[str] = field(default_factory=exported_metrics)

    def query(self, expr: str, *names: str, legend: str = "", instant: bool = False) -> PromQL:
        for n in names:
            if n not in self.known and n not in ENGINE_METRICS and n not in PROMETHEUS_BUILTINS:
                raise UserError(f"dashboard query names metric {n!r}, which no component "
                                "exports", "use a name from collector/metrics.py or "
                                "agent/metrics.py")
            if n not in expr:
                raise UserError(f"metric {n!r} is declared but not used in {expr!r}",
                                "name the metrics the expression uses")
        return PromQL(expr, names, legend, instant,
                      pending=any(n in ENGINE_METRICS for n in names))
