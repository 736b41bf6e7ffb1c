"""What the board tests need of surface/grafana/ beyond what it generates (test
support; not part of the product): every panel query by its text, and Grafana's SDK
set up to read a generated board back into its typed models."""

from __future__ import annotations

from fabricscope.surface.grafana import dashboards
from fabricscope.surface.grafana.queries import InfluxQL, PromQL


def query_index() -> dict[str, InfluxQL | PromQL]:
    """Every panel query of every board, by its text (InfluxQL) or expression (PromQL),
    with what its result must hold."""
    index: dict[str, InfluxQL | PromQL] = {}
    for b in dashboards.boards():
        for q in b.queries:
            index[q.text if isinstance(q, InfluxQL) else q.expr] = q
    return index


def register_sdk_plugins() -> None:
    """The SDK's typed panel options, and InfluxTarget for `influxdb` queries."""
    from grafana_foundation_sdk.cog import runtime
    from grafana_foundation_sdk.cog.plugins import register_default_plugins

    from fabricscope.surface.grafana.panels import InfluxTarget
    register_default_plugins()
    runtime.Runtime().register_dataquery_variant(
        runtime.DataqueryConfig(identifier="influxdb", from_json_hook=InfluxTarget.from_json))
