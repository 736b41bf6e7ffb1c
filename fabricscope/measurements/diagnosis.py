"""Measurements the collector's diagnosis writes (diagnosis/): the findings, the
per-node evidence its detectors summarise from the agents' records, the
annotations of `fabricscope annotate`, and the replicas' heartbeats by which they
share out the jobs.

A finding is one point per finding (time = `start`), rewritten as it evolves: the
same series and timestamp, so the store always holds its latest state, and two
replicas writing the same finding write the same point.
"""

from fabricscope.schema import Field, Measurement

_ENGINE = "collector diagnosis (diagnosis/live.py; `fabricscope diagnose --recompute` too)"
_PLACE = {
    "node": "the node at the place (culprit), when the place is a node or its port",
    "interface": "the node's interface, or `uplink` for a ToR's uplink",
    "peer": "the remote end (an address:port, e.g. the storage server), when one is named",
    "tor": "the top-of-rack switch, when the place is a ToR (or the node's ToR is known)",
    "rank": "the training rank at the place",
}

MEASUREMENTS = [
    Measurement(
        name="finding",
        doc="One diagnosis finding: a cause (closed vocabulary, docs/DIAGNOSIS.md), where, "
            "how much it costs, the evidence and the advice. Time: the finding's start "
            "(the first evidence of it). Open while `open` is true; `end_ns` is set when "
            "its evidence is gone.",
        source=_ENGINE,
        tags={"id": "finding id (stable: job, cause, place and start)",
              "cause": "lossy_link, buffer_saturation, microburst, straggler_compute, "
                       "straggler_network, input_stall, jitter_accumulation, network_bound, "
                       "telemetry_gap, unexplained_slowdown (slow, cause unclear)",
              "job": "training job id (as gloo_step's job tag)",
              **_PLACE},
        optional_tags=frozenset(_PLACE),
        fields={
            "severity": Field(str, "", "info, warning or critical"),
            "open": Field(bool, "", "true while the finding is open"),
            "first_seen_ns": Field(int, "ns", "UNIX time the engine first raised it"),
            "last_seen_ns": Field(int, "ns", "UNIX time of its latest evidence"),
            "end_ns": Field(int, "ns", "UNIX time its evidence ended (absent while open)"),
            "summary": Field(str, "", "one sentence: what, where, how much, what to change"),
            "evidence": Field(str, "", "JSON list of {measurement, what, value, unit, "
                                       "start_ns, end_ns, nodes}: the numbers that prove it"),
            "ruled_out": Field(str, "", "JSON list of {cause, why}: the other causes and "
                                        "the evidence that rules each out"),
            "advice": Field(str, "", "JSON list of {knob, value, why}"),
            "step_seconds_added": Field(float, "s", "impact: step time added per step"),
            "share_of_step": Field(float, "fraction", "impact: step_seconds_added / step time"),
            "explained_share": Field(float, "fraction", "how much of the lost step time this "
                                     "cause's evidence explains"),
            "retransmit_amplification": Field(float, "", "network findings: collective time "
                                              "lost per unit of bytes resent (grad-sync "
                                              "slowdown / retransmitted share of bytes)"),
            "victims": Field(str, "", "JSON list of {rank, node, waited_s}: who waited"),
        },
    ),
    Measurement(
        name="annotation",
        doc="A note of `fabricscope annotate` (a tuning change, a deploy): Grafana shows "
            "it, `fabricscope compare --around` splits at it. Time: when it was made.",
        source="fabricscope annotate (diagnosis/cli.py)",
        tags={"job": "training job it concerns, or `-` for all"},
        optional_tags=frozenset({"node"}),
        fields={"text": Field(str, "", "the note"),
                "author": Field(str, "", "who wrote it (user@host)")},
    ),
    Measurement(
        name="diag_node",
        doc="One node's evidence over one second, summarised where the node's stream "
            "lands (diagnosis/node.py) for the job-level detectors, which read it from the "
            "store. Time: the second's start.",
        source=_ENGINE,
        tags={},
        fields={
            "segs_out": Field(int, "segments", "own TCP segments sent (tcp_node)"),
            "retrans_segs": Field(int, "segments", "segments retransmitted"),
            "timeouts": Field(int, "events", "retransmission timeouts (RTO)"),
            "bytes_out": Field(int, "bytes", "TCP payload sent"),
            "rtt_p50_us": Field(float, "us", "median of the node's flows' median RTT"),
            "rtt_p99_us": Field(float, "us", "largest 99th percentile RTT of its flows"),
            "rtt_min_us": Field(float, "us", "smallest RTT sample of its flows"),
            "tx_peak_util": Field(float, "fraction", "busiest 100 us bin, tx, any interface"),
            "rx_peak_util": Field(float, "fraction", "busiest 100 us bin, rx"),
            "hot_bins": Field(int, "bins", "bins at or above the burst threshold, both ways"),
            "bursts": Field(int, "bursts", "microbursts started"),
            "retrans_in_bursts": Field(int, "segments", "retransmits stamped inside a "
                                       "listed burst of the node's interfaces"),
            "qdisc_drops": Field(int, "packets", "drops of the node's qdiscs"),
            "qdisc_backlog_bytes": Field(int, "bytes", "largest backlog read"),
            "ce_marks": Field(int, "packets", "ECN CE-marked segments"),
            "records": Field(int, "records", "records of the node observed in the second"),
            "lost_events": Field(int, "events", "events the agent reported lost (agent_loss "
                                 "growth, missed kernel hits)"),
        },
    ),
    Measurement(
        name="diag_pair",
        doc="One node's traffic to one peer address over one second (its tcp_flow and "
            "tcp_retransmit records summed): a cell of the job's connection matrix. "
            "Time: the second's start.",
        source=_ENGINE,
        tags={"addr": "the node's own address of these flows",
              "peer": "the remote address",
              "job": "job of the process that owns the flows (`-`: none)",
              "rank": "its rank (`-`: none)"},
        fields={
            "bytes_acked": Field(int, "bytes", "bytes the peer acknowledged"),
            "bytes_received": Field(int, "bytes", "payload received from the peer"),
            "retrans_segs": Field(int, "segments", "segments retransmitted to the peer"),
            "retrans_bytes": Field(int, "bytes", "payload bytes retransmitted"),
            "timeouts": Field(int, "events", "RTOs toward the peer"),
            "rtt_p50_us": Field(float, "us", "median smoothed RTT"),
            "rtt_p90_us": Field(float, "us", "90th percentile"),
            "rtt_min_us": Field(float, "us", "smallest sample"),
            "rtt_samples": Field(int, "samples", "RTT samples"),
        },
    ),
    Measurement(
        name="collector_heartbeat",
        doc="A collector replica is alive (every second): the replicas that wrote one in "
            "the last seconds share out the jobs by rendezvous hashing, so a job's "
            "analysis has one owner and moves when its owner stops.",
        source="collector (diagnosis/ownership.py)",
        tags={"replica": "replica id (config diagnosis_replica_id)"},
        optional_tags=frozenset({"node"}),
        fields={"jobs_owned": Field(int, "jobs", "jobs this replica analyses now"),
                "started_ns": Field(int, "ns", "when the replica started")},
    ),
    Measurement(
        name="topology_node",
        doc="A vertex of the fabric graph the collector draws for Grafana's node graph "
            "panel: a node (host), a ToR or the spine, with its health now (every few "
            "seconds, from the job owner's view). Time: when it was drawn.",
        source=_ENGINE,
        tags={"id": "vertex id: the node name, tor<N> or spine",
              "kind": "node, tor or spine",
              "job": "job whose view this is (`-`: the fabric without a job)"},
        optional_tags=frozenset({"node"}),
        fields={"title": Field(str, "", "label"),
                "subtitle": Field(str, "", "second label: ToR, or the rank"),
                "health": Field(float, "fraction", "1 healthy, 0 the culprit of an open "
                                                    "warning/critical finding"),
                "status": Field(str, "", "ok, or the cause of the finding placed here"),
                "mainstat": Field(str, "", "the main number shown (retransmit ratio, step s)"),
                "secondarystat": Field(str, "", "a second number (RTT p90)")},
    ),
    Measurement(
        name="topology_edge",
        doc="An edge of the fabric graph: a node's port to its ToR, a ToR's uplink to the "
            "spine, or a hop of the job's ring (rank to next rank). Time: when drawn.",
        source=_ENGINE,
        tags={"id": "edge id: source->target",
              "source": "source vertex id", "target": "target vertex id",
              "kind": "port, uplink or ring",
              "job": "job whose view this is (`-`: the fabric without a job)"},
        optional_tags=frozenset({"node"}),
        fields={"health": Field(float, "fraction", "1 healthy, 0 faulty"),
                "mainstat": Field(str, "", "retransmit ratio or throughput shown on the edge"),
                "bytes_per_s": Field(float, "B/s", "bytes over the last seconds"),
                "retrans_ratio": Field(float, "fraction", "retransmitted segments / sent"),
                "rtt_p90_us": Field(float, "us", "RTT 90th percentile on the edge")},
    ),
]
