"""The fabricscope boards: what each shows, and the queries behind it.

Training job answers "why did my step time double?" from the top down: the step
time with the annotations and findings over it, where the step went (gradient
sync against compute, data loading and checkpoints), the phases of every rank, the
job's traffic as a square wave (T, B, D) and the open findings with their advice.
Fabric, Collectives and Topology are where a finding's evidence lives; Findings
lists them all; fabricscope shows the telemetry pipeline itself.
"""

from __future__ import annotations

from fabricscope.diagnosis.finding import PLACE_KEYS
from fabricscope.surface import jobclass
from fabricscope.surface.grafana.queries import InfluxQL, PromNames, agg, raw, select
from fabricscope.surface.grafana.panels import Board, influx_annotation

PHASE_COLORS = {"grad_sync": "red", "compute": "green", "data_load": "blue",
                "checkpoint": "purple", "param_broadcast": "orange"}
PLACE = PLACE_KEYS
#: columns of a finding a person reads first, then where, how much, why
FINDING_ORDER = ["summary", "advice", "severity", "cause", *PLACE, "step_seconds_added",
                 "share_of_step", "explained_share", "evidence", "ruled_out", "victims"]


def annotations() -> list:
    notes = select("annotation", [raw("text"), raw("author"), raw("job")], by_time=False,
                   wildcards={"job": "-"})
    opened = select("finding", [raw("summary"), raw("cause"), raw("severity")], by_time=False,
                    where=('"open" = true',))
    return [influx_annotation("fabricscope annotate", notes, text="text", tags="author,job",
                              color="blue"),
            influx_annotation("Open findings (start)", opened, text="summary",
                              tags="cause,severity", color="red")]


def open_findings(columns: list[str]):
    """Open findings, however long ago they started: open is a state of now."""
    return select("finding", [raw(c) for c in columns], by_time=False, time_filter=False,
                  where=('"open" = true',), result_format="table")


def job_class_panels(b: Board, classification: InfluxQL) -> Board:
    """The job's class and the model that decided it, from a query whose columns are
    surface/jobclass.py's COLUMNS (a stored classification, or a test's), and how the
    class's own costs moved over time."""
    b.row("What kind of job")
    b.table("Job class and what decided it", [classification], order=list(jobclass.COLUMNS),
            description="The class from the collectives alone (fabricscope/jobclass.py, "
                        "job_class): the exchange family carrying most bytes, the message "
                        "sizes, and the period or the arrival rate. The latest decision "
                        "in the time range.")
    b.timeseries("Time in exchanges, and what imbalance costs", [
        select("job_class", [agg("mean", "exchange_share", "in exchanges"),
                             agg("mean", "bubble_share", "pipeline bubble"),
                             agg("mean", "stage_cost_share", "slow stage excess"),
                             agg("mean", "alltoall_cost_share", "uneven all-to-all")])],
        unit="percentunit", w=12, min_val=0,
        description="exchange_share: the ranks' mean share of time inside their "
                    "collectives. Pipelines: the bubble and what a balanced split would "
                    "save; MoE: what an even routing would save of the all-to-all time.")
    b.timeseries("Request latency (inference)", [
        select("job_class", [agg("mean", "request_p50_s", "request p50"),
                             agg("mean", "request_p99_s", "request p99")])],
        unit="s", w=12, min_val=0,
        description="A served model's requests, first exchange to last, over each "
                    "classification window; the tail_latency finding compares P99 with "
                    "the job's own first requests.")
    return b


def latest_job_class() -> InfluxQL:
    """The job's latest stored class in the time range, with surface/jobclass.py's
    COLUMNS."""
    return select("job_class", [raw(c) for c in jobclass.COLUMNS], by_time=False,
                  tail="ORDER BY time DESC LIMIT 1", result_format="table")


def training_job() -> Board:
    b = Board("fabricscope-job", "fabricscope / Training job",
              "Why did my step time change? Step time with annotations and findings, where "
              "the step went, phases per rank, the traffic model and what to change.")
    b.annotate(*annotations()).row("Is the job slow, and since when?")
    b.stat("Step time (median rank)", [select("gloo_step", [agg("median", "seconds")])],
           unit="s", description="Inferred from the gradient AllReduce windows (gloo_step).")
    b.stat("Gradient sync share of the step", [select("gloo_step", [agg("mean", "comm_fraction")])],
           unit="percentunit", thresholds=[(None, "green"), (0.5, "red")],
           description="sync_seconds / seconds; above 0.5 the network bounds the step.")
    b.stat("Segments retransmitted in gradient sync",
           [select("gloo_step", [agg("sum", "sync_retrans_segs")])], calc="sum",
           thresholds=[(None, "green"), (1, "orange")],
           description="TCP retransmits of the ranks inside their AllReduce windows, "
                       "over the time range.")
    b.stat("Open findings", [select("finding", [agg("count", "summary")], by_time=False,
                                    time_filter=False, where=('"open" = true',))],
           thresholds=[(None, "green"), (1, "red")],
           description="Findings of the job open now, wherever they started.")
    job_class_panels(b, latest_job_class())
    b.row("Where the step time goes")
    b.timeseries("Step time", [
        select("gloo_step", [agg("mean", "seconds", "mean of ranks"),
                             agg("max", "seconds", "slowest rank")]),
        select("train_step", [agg("mean", "seconds", "marked steps")])],
        unit="s", w=12, min_val=0,
        description="Inferred steps (gloo_step) and steps the script marked (train_step); "
                    "annotations: `fabricscope annotate` notes and open findings.")
    b.timeseries("Gradient sync vs compute per step", [
        select("gloo_step", [agg("mean", "sync_seconds", "gradient sync"),
                             agg("mean", "compute_seconds", "compute")])],
        unit="s", stack=True, bars=True,
        description="Mean over ranks. A doubled step with doubled sync is the network; "
                    "with doubled compute, a rank or the input.")
    b.state_timeline("Phases per rank", [
        select("gloo_phase", [raw("phase"), raw("seconds")], by_time=False, by_tags=("rank",),
               alias="$col rank $tag_rank")],
        include="^(Time|phase rank .*)$", colors=PHASE_COLORS,
        description="Each phase's start, per rank: param_broadcast, grad_sync, compute, "
                    "data_load (dataset reads), checkpoint (writes). Inferred, no markers.")
    b.timeseries("Data loading and checkpoints", [
        select("gloo_phase", [agg("sum", "seconds", "data load")],
               where_tags={"phase": "data_load"}),
        select("gloo_phase", [agg("sum", "seconds", "checkpoint")],
               where_tags={"phase": "checkpoint"})],
        unit="s", bars=True,
        description="Seconds of the ranks' transfers outside their collectives.")
    b.timeseries("Retransmits in the steps", [
        select("gloo_step", [agg("sum", "sync_retrans_segs", "in gradient sync"),
                             agg("sum", "retrans_segs", "whole step")])],
        bars=True, description="Segments the ranks retransmitted, per step window.")
    b.row("Traffic model and what to change")
    b.stat("T: sync period", [select("traffic_model", [agg("mean", "period_s")])], unit="s",
           w=6, no_value="no period found",
           description="Mean time between burst onsets (the step time seen on the wire), "
                       "fitted to the series the traffic_model's `series` tag names: "
                       "gloo_sent (payload sent), gloo_ring (the ring model's bytes) or "
                       "gloo_windows (time in collectives). Absent when no period shows.")
    b.stat("B: burst bandwidth", [select("traffic_model", [agg("mean", "burst_bytes_per_s")])],
           unit="Bps", w=6, no_value="no NIC bins in the bursts",
           description="The NIC's busiest 100 us received bin inside each collective "
                       "window, as a rate (median over the windows), on burst_interface.")
    b.stat("B against the line rate", [select("traffic_model", [agg("mean", "burst_util")])],
           unit="percentunit", w=6, no_value="line rate unknown",
           thresholds=[(None, "green"), (0.9, "orange")],
           description="B / the interface's line rate; a link with none (a virtual link: "
                       "veth, bridge) says \"line rate unknown\" rather than a share of "
                       "a guess.")
    b.stat("D: duty cycle", [select("traffic_model", [agg("mean", "duty_cycle")])],
           unit="percentunit", w=6, thresholds=[(None, "green"), (0.5, "red")],
           description="Time with a collective in flight / time; above 0.5 communication "
                       "dominates.")
    b.table("Open findings: what to change", [open_findings(FINDING_ORDER)],
            order=FINDING_ORDER, json_columns=("advice", "evidence", "ruled_out", "victims"),
            description="Summary and advice first; the evidence and the causes ruled out "
                        "after. Written by the diagnosis engine (finding).")
    prom = PromNames()
    b.timeseries("Step-time jitter against the job's baseline", [
        prom.query('fabricscope_job_step_jitter_seconds{job="$job"}',
                   "fabricscope_job_step_jitter_seconds", legend="jitter"),
        prom.query('fabricscope_job_step_jitter_baseline_seconds{job="$job"}',
                   "fabricscope_job_step_jitter_baseline_seconds", legend="baseline")],
        unit="s", w=24, description="The diagnosis engine's trend detector (Prometheus).")
    return b


def fabric() -> Board:
    b = Board("fabricscope-fabric", "fabricscope / Fabric",
              "Every NIC's 100 us peaks, bursts, queues and drops, and what TCP saw: "
              "retransmits by kind, RTT, ECN.")
    b.annotate(*annotations()).row("NICs")
    b.heatmap("NIC peak rate (busiest 100 us bin per window)", [
        select("nic_window", [agg("max", "peak_bps")], by_tags=("node", "interface", "direction"),
               fill="0", alias="$tag_node $tag_interface $tag_direction")],
        unit="bps",
        description="One row per node, interface and direction; every link has it, with a "
                    "line rate or without. Training shows as synchronized stripes; a hot "
                    "row alone is a hot port.")
    b.heatmap("NIC peak utilization, where the line rate is known", [
        select("nic_window", [agg("max", "peak_util")], by_tags=("node", "interface", "direction"),
               fill="0", alias="$tag_node $tag_interface $tag_direction")],
        unit="percentunit", scale_max=1,
        description="The peak rate / the link's line rate; 1.0 is line rate. A link whose "
                    "line rate is unknown (a virtual link: veth, bridge, tun) has no row: "
                    "its peaks are in the rate above, never a share of a guess.")
    b.timeseries("Throughput", [
        select("nic_window", [agg("mean", "rate_bps")], by_tags=("node", "interface", "direction"),
               alias="$tag_node $tag_interface $tag_direction")],
        unit="bps", description="Mean rate per window.")
    b.timeseries("Microbursts", [
        select("nic_window", [agg("sum", "bursts")], by_tags=("node", "interface", "direction"),
               alias="$tag_node $tag_interface $tag_direction")],
        bars=True, description="Runs of hot 100 us bins (at or above the burst threshold).")
    b.timeseries("Qdisc drops", [
        select("nic_qdisc", [agg("sum", "drops")], by_tags=("node", "interface", "kind"),
               alias="$tag_node $tag_interface $tag_kind")],
        bars=True, description="Packets the node's qdiscs dropped (a shaped or full queue).")
    b.timeseries("Qdisc backlog", [
        select("nic_qdisc", [agg("max", "backlog_bytes")], by_tags=("node", "interface", "kind"),
               alias="$tag_node $tag_interface $tag_kind")],
        unit="bytes", description="Largest backlog read per window.")
    b.row("TCP")
    kinds = ["fast", "rto", "tlp", "slow_start", "syn", "synack", "unknown"]
    b.timeseries("Retransmitted segments by kind", [
        select("tcp_node", [agg("sum", f"{k}_segs", k) for k in kinds])],
        stack=True, bars=True,
        description="fast: recovery; rto: timeouts (200 ms each at least); tlp: tail loss "
                    "probes. Loss independent of load shows as steady fast retransmits.")
    b.timeseries("RTT percentiles", [
        select("tcp_flow", [agg("mean", "rtt_p50_us", "p50"), agg("mean", "rtt_p90_us", "p90"),
                            agg("max", "rtt_p99_us", "p99"), agg("min", "rtt_min_us", "floor")])],
        unit="µs", description="Smoothed RTT of the flows; p99 far above the floor during "
                               "bursts is queueing.")
    b.timeseries("ECN CE marks", [
        select("nic_flow", [agg("sum", "ce_marks")], by_tags=("node", "direction"),
               alias="$tag_node $tag_direction")],
        bars=True, description="Segments with Congestion Experienced set.")
    return b


def collectives() -> Board:
    b = Board("fabricscope-collectives", "fabricscope / Collectives",
              "Bus bandwidth by op and size, duration tails, per-rank waiting and the "
              "retransmits inside collectives.")
    b.annotate(*annotations()).row("Bandwidth and durations")
    b.xy("Bus bandwidth by message size", [
        select("gloo_collective", [raw("bytes"), raw("busbw_gbs")], by_time=False,
               by_tags=("op",), result_format="table")],
        split_by="op", x_unit="bytes", y_unit="GBs",
        description="Each collective a point (nccl-tests conventions): small messages are "
                    "latency bound, large ones should reach the link's bus bandwidth.")
    b.timeseries("Bus bandwidth by op", [
        select("gloo_collective", [agg("mean", "busbw_gbs")], by_tags=("op",), alias="$tag_op")],
        unit="GBs", description="Mean busbw of the collectives per op.")
    b.timeseries("Collective duration tails", [
        select("gloo_collective", [agg("percentile", "seconds", "p50", "50"),
                                   agg("percentile", "seconds", "p99", "99"),
                                   agg("max", "seconds", "max")], by_tags=("op",),
               alias="$tag_op $col")],
        unit="s", description="A p99 far above p50 is a loss (an RTO) or a straggler.")
    b.timeseries("NCCL enqueue time by op (p99)", [
        select("nccl_call", [agg("percentile", "duration_ns", "p99", "99")], by_tags=("op",),
               alias="$tag_op")],
        unit="ns", description="NCCL calls return once queued on the CUDA stream: this is "
                               "enqueue time, not completion.")
    b.row("Ranks")
    b.timeseries("Time inside AllReduce per rank (the late rank waits least)", [
        select("gloo_collective", [agg("mean", "seconds")], where_tags={"op": "AllReduce"},
               by_tags=("rank",), alias="rank $tag_rank")],
        unit="s", description="The others wait inside the collective for a rank that "
                              "enters late; its own time there is the shortest.")
    b.timeseries("Compute per step per rank", [
        select("gloo_step", [agg("mean", "compute_seconds")], by_tags=("rank",),
               alias="rank $tag_rank")],
        unit="s", description="A compute straggler's compute is the longest.")
    b.timeseries("Retransmits inside collectives (gloo)", [
        select("gloo_collective", [agg("sum", "retrans_segs")], by_tags=("op", "rank"),
               alias="$tag_op rank $tag_rank")],
        bars=True, description="Segments the rank retransmitted inside its collective windows.")
    b.timeseries("Retransmits of the job's ranks (NCCL and gloo)", [
        select("tcp_retransmit", [agg("sum", "segs")], by_tags=("rank", "kind"), strict=("job",),
               alias="rank $tag_rank $tag_kind")],
        bars=True, description="Every retransmit of the job's processes, whatever the library.")
    return b
