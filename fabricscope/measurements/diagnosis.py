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
              "cause": "the cause, one of docs/DIAGNOSIS.md's table (lossy_link, "
                       "buffer_saturation, straggler_compute, ..., bisection_limit)",
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
            "superseded_by": Field(str, "", "id of the finding that took this one over: a "
                                   "place that explains all its hops and more (the fault "
                                   "localized again), or, for an unexplained slowdown, a "
                                   "cause named since that explains it; absent otherwise"),
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
        name="collector_heartbeat",
        doc="A collector replica is alive (every second): the replicas that wrote one in "
            "the last seconds share out the jobs by rendezvous hashing, so a job's "
            "analysis has one owner and moves when its owner stops.",
        source="collector diagnosis (diagnosis/live.py)",
        tags={"replica": "replica id (collector config replica_id)"},
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
