"""The measurement of a job's class (fabricscope/jobclass.py), as the collector's
analyzer (diagnosis/jobclass.py) writes it from the job's collectives.

One point per job and classification: written when the class changes, and again
every REWRITE_S while it holds, so a board or `fabricscope diagnose` over any
window of that length finds one. The class is a tag, so each class a job held is
its own series and Grafana can count or colour by it.
"""

from fabricscope.schema import Field, Measurement

REWRITE_S = 30.0      # a held class is written again this often

#: fabricscope.jobclass.OpFamily's values, spelled out so that loading the schema
#: (every agent and collector does) does not load the classifier (a test keeps them equal)
FAMILIES = ("allreduce", "allgather_reducescatter", "alltoall", "send_recv", "control")
#: per op family: its share of the window's ops by count and by bytes
_SHARES = {f"{family}_{kind}_share": Field(float, "fraction",
                                           f"{family} ops' share of the window's ops by {kind}")
           for family in FAMILIES for kind in ("count", "bytes")}

MEASUREMENTS = [
    Measurement(
        name="job_class",
        doc="What kind of job this is, decided from its collectives alone "
            "(fabricscope.jobclass.classify over the last window of its gloo_collective "
            "and ncclprof_collective records): the class, the sentence with the numbers that decided it, and "
            "those numbers. Written when the class changes and every "
            f"{REWRITE_S:.0f} s while it holds. Time: when it was decided.",
        source="collector job-class analyzer (diagnosis/jobclass.py, in the job's "
               "owning replica)",
        tags={"job": "job id (as gloo_collective's job tag)",
              "class": "data_parallel, sharded, moe_alltoall, pipeline, inference, mixed "
                       "or unknown (no exchange op in the window)"},
        optional_tags=frozenset({"node"}),
        fields={
            "reason": Field(str, "", "the rule that decided, with its numbers"),
            "components": Field(str, "", "exchange families' classes present, most bytes "
                                         "first, comma-separated"),
            "mix": Field(str, "", "JSON {family: {count, bytes, count_share, "
                                  "bytes_share}} (fabricscope.jobclass Share)"),
            **_SHARES,
            "p50_bytes": Field(float, "B", "median message size of the exchange ops"),
            "p90_bytes": Field(float, "B", "90th percentile message size"),
            "period_s": Field(float, "s", "the loop's period (a training step); absent "
                                          "when the traffic has none"),
            "collectives_per_step": Field(float, "", "exchange ops per period and rank"),
            "arrival_rate_per_s": Field(float, "1/s", "aperiodic traffic: repeats of its "
                                                      "op sequence (requests) per second"),
            "gap_spread": Field(float, "", "IQR / median of the gaps between repeats: a "
                                           "step loop ~0, Poisson arrivals 1.58"),
            "bubble_share": Field(float, "fraction", "Send/Recv in the window: the "
                                  "stages' mean share of time inside transfers "
                                  "(fabricscope.stagemodel)"),
            "slow_stage": Field(int, "rank", "the stage that computes the most, when its "
                                "excess over the stages' mean costs a tenth of its time"),
            "stage_cost_share": Field(float, "fraction", "that excess, of the slow stage's "
                                      "time: what a balanced split saves"),
            "stages": Field(str, "", "JSON [{rank, compute_s, recv_s, send_s, span_s, "
                                     "wait_share}] per pipeline stage"),
            "alltoall_hot_rank": Field(int, "rank", "AlltoAll in the window: the rank "
                                       "that receives the most of its bytes "
                                       "(fabricscope.alltoallmodel)"),
            "alltoall_hot_share": Field(float, "fraction", "that rank's share of the "
                                        "AlltoAll bytes received"),
            "alltoall_imbalance": Field(float, "", "max / mean of the ranks' AlltoAll "
                                        "bytes received (1: even routing)"),
            "alltoall_cost_share": Field(float, "fraction", "the step time an even "
                                         "routing would save"),
            "requests": Field(int, "", "inference: whole requests in the window "
                                       "(fabricscope.requestmodel)"),
            "request_p50_s": Field(float, "s", "their median latency, first exchange "
                                               "call to last, over all ranks"),
            "request_p99_s": Field(float, "s", "their 99th percentile latency"),
            "exchange_share": Field(float, "fraction", "the ranks' mean share of their "
                                    "time inside exchange ops"),
            "observations": Field(int, "", "collectives the class was decided from"),
            "rows_dropped": Field(int, "", "rows of the window that could not be used "
                                           "(unknown op, bad time, size or duration)"),
            "peers_unnumbered": Field(int, "", "Send/Recv rows whose peer's training "
                                      "rank the window could not tell (a gloo sub-group; "
                                      "an NCCL comm whose peer has no row in it), taken "
                                      "as unknown (fabricscope/commpeers.py)"),
            "window_s": Field(float, "s", "length of the window classified"),
            "since_ns": Field(int, "ns", "UNIX time this replica first decided this class "
                                         "for the job"),
        },
    ),
]
