"""The operator's boards: the fabric as a graph, every finding, and fabricscope itself."""

from __future__ import annotations

from fabricscope.surface.grafana.boards import FINDING_ORDER, PLACE, annotations, open_findings
from fabricscope.surface.grafana.queries import Col, PromNames, agg, raw, select
from fabricscope.surface.metrics import AGENT_SCRAPE_JOB
from fabricscope.surface.grafana.panels import Board


def board_alerts(uid: str, *, finding_alerts: bool = False) -> list:
    """The alerts of the alert list (surface/alerting/catalog.py) that send their reader to the
    board `uid`, or, with finding_alerts, every alert that pages on a finding's cause.
    Empty while there is no catalog (the alert panels then list every firing alert)."""
    try:
        from fabricscope.surface.alerting import catalog
    except ImportError:
        return []
    return [a for a in catalog.ALERTS
            if (a.causes if finding_alerts else catalog.BOARDS.get(a.board, ("",))[0] == uid)]


def alert_panels(b: Board, alerts: list, prom: PromNames) -> None:
    """What pages for this board (names, runbooks) and which of it fires now."""
    if alerts:
        from fabricscope.surface.alerting.catalog import runbook_url
        # summaries are templates: `{place}` is filled in when the alert fires
        rows = "\n".join(f"| [{a.name}]({runbook_url(a)}) | "
                         f"{a.summary.replace('{', '<').replace('}', '>')} |" for a in alerts)
        b.text("Alerts", "| alert | when |\n|---|---|\n" + rows,
               description="The alert rules of surface/alerting/catalog.py that lead here.")
    names = "|".join(a.name for a in alerts) or "Fabricscope.+"
    b.table("Firing alerts", [prom.query(f'ALERTS{{alertstate="firing",alertname=~"{names}"}}',
                                         "ALERTS", instant=True, legend="{{alertname}}")],
            order=["alertname", "severity", "job", "node", "cause"], hide=("Time", "__name__"),
            w=12 if alerts else 24,
            description="Prometheus' ALERTS series of the alerts listed here.")


def topology() -> Board:
    b = Board("fabricscope-topology", "fabricscope / Topology",
              "ToRs, ports, nodes and the job's ring, coloured by health: the place of each "
              "open finding.")
    b.annotate(*annotations()).row("Fabric graph")
    nodes = select("topology_node", [
        agg("last", "title", "title"), agg("last", "subtitle", "subtitle"),
        agg("last", "mainstat", "mainstat"), agg("last", "secondarystat", "secondarystat"),
        agg("last", "health", "arc__healthy"),
        Col("health", "last", "arc__faulty", template="1 - {}"),
        agg("last", "status", "detail__status")],
        by_time=False, by_tags=("id", "kind"), wildcards={"job": "-"}, result_format="table")
    edges = select("topology_edge", [
        agg("last", "mainstat", "mainstat"), agg("last", "health", "detail__health"),
        agg("last", "retrans_ratio", "detail__retrans_ratio"),
        agg("last", "rtt_p90_us", "detail__rtt_p90_us")],
        by_time=False, by_tags=("id", "source", "target", "kind"), wildcards={"job": "-"},
        result_format="table")
    b.node_graph("Nodes, ToRs and the job's ring", nodes, edges,
                 arcs={"arc__healthy": "green", "arc__faulty": "red"},
                 description="Drawn by the collector (topology_node, topology_edge) from the "
                             "job owner's view; a red arc is the place of an open finding. "
                             "Edges: ports, ToR uplinks and ring hops.")
    b.table("Links, latest", [select("topology_edge", [
        agg("last", "health", "health"), agg("last", "retrans_ratio", "retrans_ratio"),
        agg("last", "bytes_per_s", "bytes_per_s"), agg("last", "rtt_p90_us", "rtt_p90_us")],
        by_time=False, by_tags=("source", "target", "kind"), wildcards={"job": "-"},
        result_format="table")],
        order=["source", "target", "kind", "health", "retrans_ratio", "bytes_per_s",
               "rtt_p90_us"], hide=("Time",),
        description="Every edge's latest numbers: health 0 is the culprit.")
    return b


def findings() -> Board:
    b = Board("fabricscope-findings", "fabricscope / Findings",
              "Every finding: cause, place, impact, evidence and advice, open and past.")
    b.annotate(*annotations()).row("Now")
    open_ = ('"open" = true',)
    b.stat("Open findings", [select("finding", [agg("count", "summary")], by_time=False,
                                    time_filter=False, where=open_)],
           thresholds=[(None, "green"), (1, "red")], description="Open now, any start.")
    b.stat("Critical", [select("finding", [agg("count", "summary")], by_time=False,
                               time_filter=False, where=open_ + ('"severity" = \'critical\'',))],
           thresholds=[(None, "green"), (1, "red")], description="Open critical findings.")
    b.stat("Step time lost to open findings", [select(
        "finding", [agg("sum", "step_seconds_added")], by_time=False, time_filter=False,
        where=open_)], unit="s", description="Sum of their impact per step.")
    prom = PromNames()
    b.stat("Active in the engine", [prom.query(
        'sum(fabricscope_finding_active{job="$job"})', "fabricscope_finding_active",
        legend="active")], description="fabricscope_finding_active, as alerts see it.")
    b.table("Open findings", [open_findings(FINDING_ORDER)], order=FINDING_ORDER,
            json_columns=("advice", "evidence", "ruled_out", "victims"),
            description="Summary and advice first, then the place, the impact and the "
                        "evidence.")
    b.row("History")
    history = ["summary", "severity", "cause", "open", *PLACE,
               "step_seconds_added", "share_of_step", "first_seen_ns", "end_ns", "advice",
               "evidence"]
    b.table("Findings that started in the range", [select(
        "finding", [raw(c) for c in history], by_time=False, result_format="table",
        tail="ORDER BY time DESC")], order=history, json_columns=("advice", "evidence"),
        description="Open and closed; end_ns is set once the evidence is gone.")
    b.timeseries("Findings by cause", [select(
        "finding", [agg("count", "summary")], by_tags=("cause",), alias="$tag_cause")],
        bars=True, stack=True, description="Findings by the time they started.")
    b.timeseries("Findings opened by the engine", [prom.query(
        "sum by (cause, severity) (increase(fabricscope_findings_opened_total[$__rate_interval]))",
        "fabricscope_findings_opened_total", legend="{{cause}} {{severity}}")],
        bars=True, description="fabricscope_findings_opened_total (Prometheus).")
    b.row("Alerts")
    alert_panels(b, board_alerts(b.uid, finding_alerts=True), prom)
    return b


def pipeline() -> Board:
    b = Board("fabricscope-pipeline", "fabricscope / Pipeline",
              "The telemetry pipeline itself: agents up, events lost, spool depth, shipping "
              "lag, collector ingest and refusals.")
    b.annotate(*annotations()).row("Agents")
    prom = PromNames()
    node = 'node=~"$node"'
    b.stat("Agents connected", [prom.query("sum(fabricscope_collector_agents_connected)",
                                           "fabricscope_collector_agents_connected")],
           description="Open agent streams at the collectors.")
    b.timeseries("Agents up", [prom.query(
        f"max by (node) (fabricscope_agent_collector_connected{{{node}}})",
        "fabricscope_agent_collector_connected", legend="{{node}} stream"), prom.query(
        f'up{{job="{AGENT_SCRAPE_JOB}",{node}}}', "up", legend="{{node}} scraped")],
        w=18, min_val=0, description="1 while the agent's stream to a collector is up.")
    b.timeseries("Events lost", [prom.query(
        f"sum by (node, probe) (rate(fabricscope_agent_events_lost_total{{{node}}}"
        "[$__rate_interval]))", "fabricscope_agent_events_lost_total",
        legend="{{node}} {{probe}}"), prom.query(
        f"sum by (node, reason) (rate(fabricscope_agent_records_dropped_total{{{node}}}"
        "[$__rate_interval]))", "fabricscope_agent_records_dropped_total",
        legend="{{node}} dropped: {{reason}}")],
        unit="cps", description="Kernel ring buffers overflowed, records given up.")
    b.timeseries("Spool depth", [prom.query(
        f"fabricscope_agent_spool_bytes{{{node}}}", "fabricscope_agent_spool_bytes",
        legend="{{node}}"), prom.query("sum(fabricscope_collector_spool_bytes)",
                                       "fabricscope_collector_spool_bytes", legend="collectors")],
        unit="bytes", description="Batches awaiting an ack (agents), lines awaiting InfluxDB "
                                  "(collectors).")
    b.timeseries("Shipping lag", [prom.query(
        f"fabricscope_agent_oldest_pending_age_seconds{{{node}}}",
        "fabricscope_agent_oldest_pending_age_seconds", legend="{{node}} oldest unacked"),
        prom.query(f"max by (node) (fabricscope_collector_agent_lag_seconds{{{node}}})",
                   "fabricscope_collector_agent_lag_seconds", legend="{{node}} at collector")],
        unit="s", description="How stale data is when it arrives.")
    b.timeseries("Records lost, as stored", [select(
        "agent_loss", [agg("max", "records")], by_tags=("node", "reason"),
        alias="$tag_node $tag_reason")],
        description="agent_loss points: the gaps the agents shipped into InfluxDB.")
    b.row("Collectors")
    b.timeseries("Collector ingest", [prom.query(
        "sum(rate(fabricscope_collector_records_received_total[$__rate_interval]))",
        "fabricscope_collector_records_received_total", legend="received"), prom.query(
        "sum(rate(fabricscope_collector_records_written_total[$__rate_interval]))",
        "fabricscope_collector_records_written_total", legend="written")],
        unit="cps", description="Records per second.")
    b.timeseries("Refusals", [prom.query(
        "sum by (reason) (rate(fabricscope_collector_records_rejected_total[$__rate_interval]))",
        "fabricscope_collector_records_rejected_total", legend="rejected: {{reason}}"),
        prom.query("sum by (reason) (rate(fabricscope_collector_batches_throttled_total"
                   "[$__rate_interval]))", "fabricscope_collector_batches_throttled_total",
                   legend="throttled: {{reason}}"),
        prom.query("sum by (reason) (rate(fabricscope_collector_auth_failures_total"
                   "[$__rate_interval]))", "fabricscope_collector_auth_failures_total",
                   legend="auth: {{reason}}"),
        prom.query("sum by (kind) (rate(fabricscope_collector_sink_errors_total"
                   "[$__rate_interval]))", "fabricscope_collector_sink_errors_total",
                   legend="sink: {{kind}}")],
        unit="cps", description="What the collectors refused or could not write.")
    b.row("Alerts")
    alert_panels(b, board_alerts(b.uid), prom)
    return b

