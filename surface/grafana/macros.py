"""Grafana's expansion of macros and template variables, for InfluxQL and PromQL.

No Grafana server can run here, so the dashboards' tests expand each query as a
Grafana server does and run the result against a real InfluxDB and a real
Prometheus. What is reproduced, and from where (Grafana 11, Apache-licensed
parts and the AGPL server read for behaviour only; nothing copied):

- Template variables (public/app/features/templating/template_srv.ts): `$var`,
  `${var}`, `${var:format}` and `[[var]]`; a name that is no variable stays as it
  is (so `$timeFilter` and `$__interval` reach the datasource untouched). A
  variable set to All expands to its custom all value unformatted, else to every
  option's value, formatted.
- The InfluxDB datasource (public/app/plugins/datasource/influxdb/datasource.ts,
  applyVariables) formats every variable of a raw InfluxQL query with the `regex`
  format (formatRegistry.ts): values regex-escaped (grafana-data escapeRegex), a
  multi-value selection as `(a|b)`. Queries are written `"tag" =~ /^$var$/`.
- The InfluxDB backend (pkg/tsdb/influxdb/models/query.go, Build) then replaces
  `$timeFilter` with `time >= <from>ms and time <= <to>ms`, `$interval` and
  `$__interval` with the interval as text (gtime.FormatInterval: `1s`, `2m`) and
  `$__interval_ms` with it in milliseconds; the interval is at least 1 ms.
- The interval a panel asks for (grafana-data rangeutil.calculateInterval):
  roundInterval(range / maxDataPoints), raised to the panel's min interval or,
  without one, the datasource's `timeInterval`. Annotation queries carry none
  (1 ms).
- The Prometheus datasource (grafana-prometheus datasource.ts,
  interpolateQueryExpr) escapes a single value for a label string, multi values
  as a regex alternation; its backend (pkg/promlib/models/query.go) computes the
  step and `$__rate_interval` = max($__interval + scrape, 4 x scrape).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

ALL = "$__all"
#: template_srv.ts variableRegex
_VARIABLE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^}]+))?(?::([^}]+))?\}")
#: grafana-data text/string.ts escapeRegex
_REGEX_SPECIAL = re.compile(r"[\\^$*+?.()|\[\]{}/]")
_PROM_REGEX_SPECIAL = re.compile(r"[$^*{}\[\]+?.()|]")
# rangeutil.roundInterval: (upper bound in ms, rounded interval in ms)
_ROUNDING = ((10, 1), (15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500),
             (1500, 1000), (3500, 2000), (7500, 5000), (12500, 10000), (17500, 15000),
             (25000, 20000), (45000, 30000), (90000, 60000), (210000, 120000),
             (450000, 300000), (750000, 600000), (1050000, 900000), (1500000, 1200000),
             (2700000, 1800000), (5400000, 3600000), (9000000, 7200000),
             (16200000, 10800000), (32400000, 21600000), (86400000, 43200000),
             (604800000, 86400000), (1814400000, 604800000), (3628800000, 2592000000))
_UNIT_MS = {"y": 31536000000, "M": 2592000000, "w": 604800000, "d": 86400000, "h": 3600000,
            "m": 60000, "s": 1000, "ms": 1}
#: promlib: a step never asks for more than this many points
_SAFE_RESOLUTION = 11000


@dataclass(frozen=True)
class Variable:
    """A dashboard variable as the template service sees it at query time."""

    name: str
    current: str | tuple[str, ...]       # selected value(s); ALL when All is selected
    options: tuple[str, ...] = ()        # every option's value (what All means)
    multi: bool = False
    include_all: bool = False
    all_value: str | None = None         # custom all value (`.*`), passed on unformatted


@dataclass(frozen=True)
class TimeRange:
    from_ms: int
    to_ms: int

    @property
    def span_ms(self) -> int:
        return self.to_ms - self.from_ms


@dataclass(frozen=True)
class Interval:
    ms: int
    text: str


Formatter = Callable[[object, Variable], str]


def escape_regex(value: str) -> str:
    return _REGEX_SPECIAL.sub(lambda m: "\\" + m.group(0), value)


def regex_format(value, variable: Variable) -> str:
    """formatRegistry.ts `regex`: what the InfluxDB datasource uses for raw queries."""
    if isinstance(value, str):
        return escape_regex(value)
    escaped = [escape_regex(str(v)) for v in value]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def prometheus_format(value, variable: Variable) -> str:
    """grafana-prometheus interpolateQueryExpr (classic escaping)."""
    if not variable.multi and not variable.include_all:
        text = value if isinstance(value, str) else ",".join(value)
        return text.replace("\\", "\\\\").replace("'", "\\\\'")

    def special(v: str) -> str:
        return _PROM_REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(0), v.replace("\\", "\\\\\\\\"))
    if isinstance(value, str):
        return special(value)
    escaped = [special(v) for v in value]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


_FORMATS: dict[str, Formatter] = {
    "regex": regex_format,
    "raw": lambda v, _: v if isinstance(v, str) else ",".join(v),
    "pipe": lambda v, _: v if isinstance(v, str) else "|".join(v),
    "csv": lambda v, _: v if isinstance(v, str) else ",".join(v),
}


def replace_variables(text: str, variables: dict[str, Variable], fmt: Formatter) -> str:
    """template_srv.replace: every known variable formatted, anything else untouched."""
    def one(m: re.Match) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        explicit = m.group(3) or m.group(6)
        variable = variables.get(name)
        if variable is None:
            return m.group(0)
        formatter = _FORMATS[explicit] if explicit else fmt
        value = variable.current
        if value == ALL or (isinstance(value, tuple) and value[:1] == (ALL,)):
            if variable.all_value is not None:
                # template_srv: "skip formatting of custom all values"
                return replace_variables(variable.all_value, variables, fmt)
            value = tuple(variable.options)
        if isinstance(value, tuple) and len(value) == 1 and not variable.multi:
            value = value[0]
        return formatter(value, variable)
    return _VARIABLE.sub(one, text)


def round_interval_ms(ms: float, inclusive: bool = False) -> int:
    """rangeutil.roundInterval (inclusive=False) and the Go backends' roundInterval
    (inclusive=True: their thresholds are `<=`)."""
    for bound, rounded in _ROUNDING:
        if ms < bound or (inclusive and ms == bound):
            return rounded
    return 31536000000


def interval_to_ms(text: str) -> int:
    """rangeutil.describeInterval: `10s`, `1m`, `500ms`; a bare number is seconds."""
    if re.fullmatch(r"\d+", text):
        return int(text) * 1000
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|[yMwdhms])", text.strip("<>"))
    if not m:
        raise ValueError(f"invalid interval {text!r}")
    return int(float(m.group(1)) * _UNIT_MS[m.group(2)])


def format_interval(ms: int) -> str:
    """gtime.FormatInterval / rangeutil.secondsToHms: the largest whole unit."""
    for unit in ("y", "d", "h", "m", "s"):
        if ms >= _UNIT_MS[unit]:
            return f"{ms // _UNIT_MS[unit]}{unit}"
    return f"{max(ms, 1)}ms"


def go_duration(ms: int) -> str:
    """Go's time.Duration.String for whole milliseconds: 4s, 1m0s, 1.5s, 500ms."""
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3600000)
    minutes, rest = divmod(rest, 60000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{seconds}"
    return f"{minutes}m{seconds}" if minutes else seconds


def panel_interval(time_range: TimeRange, max_data_points: int,
                   min_interval: str | None) -> Interval:
    """rangeutil.calculateInterval: the panel's $__interval."""
    ms = round_interval_ms(time_range.span_ms / max_data_points)
    if min_interval:
        ms = max(ms, interval_to_ms(min_interval))
    return Interval(ms, format_interval(ms))


def expand_influxql(query: str, time_range: TimeRange, variables: dict[str, Variable],
                    interval: Interval) -> str:
    """A raw InfluxQL query as the InfluxDB backend sends it to InfluxDB."""
    text = replace_variables(query, variables, regex_format)
    ms = max(interval.ms, 1)
    time_filter = f"time >= {time_range.from_ms}ms and time <= {time_range.to_ms}ms"
    text = text.replace("$timeFilter", time_filter)
    text = text.replace("$interval", format_interval(ms))
    text = text.replace("$__interval_ms", str(ms))
    return text.replace("$__interval", format_interval(ms))


#: what an annotation or variable query runs with: no interval in its request
ANNOTATION_INTERVAL = Interval(1, "1ms")


@dataclass(frozen=True)
class PromRange:
    """One query_range request: the expanded expression and its aligned window."""

    expr: str
    start_ms: int
    end_ms: int
    step_ms: int


def expand_promql(expr: str, time_range: TimeRange, variables: dict[str, Variable],
                  interval: Interval, max_data_points: int,
                  scrape_interval: str = "15s") -> PromRange:
    """A PromQL range query as Grafana's Prometheus backend runs it."""
    text = replace_variables(expr, variables, prometheus_format)
    scrape_ms = interval_to_ms(scrape_interval)
    raw = time_range.span_ms / max_data_points
    step = interval.ms if raw < interval.ms else round_interval_ms(raw, inclusive=True)
    step = max(step, round_interval_ms(time_range.span_ms / _SAFE_RESOLUTION, inclusive=True))
    rate_ms = max(interval.ms + scrape_ms, 4 * scrape_ms)
    range_s = round(time_range.span_ms / 1000)
    for name, value in (("__interval_ms", str(step)), ("__interval", format_interval(step)),
                        ("__range_ms", str(time_range.span_ms)), ("__range_s", str(range_s)),
                        ("__range", f"{range_s}s"), ("__rate_interval_ms", str(rate_ms)),
                        ("__rate_interval", go_duration(rate_ms))):
        text = text.replace("$" + name, value).replace("${" + name + "}", value)
    # AlignTimeRange: start and end rounded down to a multiple of the step
    return PromRange(text, time_range.from_ms // step * step, time_range.to_ms // step * step,
                     step)
