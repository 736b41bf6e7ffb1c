"""Measurements of the nccl_ras source (agent/sources/nccl_ras.py): the health of a job's
ranks as NCCL's RAS service reports it (NCCL >= 2.24, client port 28028, JSON status).

RAS keeps a keep-alive mesh between the job's processes over the bootstrap network;
a rank that does not answer its collective within ~5 s is unresponsive, one silent for
~60 s is considered dead.
"""

from fabricscope.schema import Field, Measurement

_SOURCE = "agent source nccl_ras (agent/sources/nccl_ras.py, NCCL RAS client protocol)"
_TAGS = {
    "job": "job id: config nccl_ras_job, else the job of a local rank RAS lists (its "
           "process environment, as gloo_step), else ras:<address>",
    "comm": "NCCL communicator hash (hex, as in NCCL's logs)",
}

MEASUREMENTS = [
    Measurement(
        name="nccl_ras_comm",
        doc="One communicator of the job at one RAS status poll (time = the poll).",
        source=_SOURCE,
        tags=dict(_TAGS),
        fields={
            "nranks": Field(int, "ranks", "ranks in the communicator (`size`)"),
            "ranks_seen": Field(int, "ranks", "ranks that answered (`ranks_count`)"),
            "missing": Field(int, "ranks", "ranks that did not (`missing_ranks_count`)"),
            "unresponsive": Field(int, "ranks", "missing ranks RAS could not reach"),
            "dead": Field(int, "ranks", "missing ranks RAS considers dead"),
            "errors": Field(int, "ranks", "answering ranks with an asynchronous NCCL error, "
                            "a failed init or the abort flag set"),
            "healthy": Field(bool, "", "every rank answered without an error"),
            "collection_seconds": Field(float, "s", "how long RAS took to collect the "
                                        "status (`collection_time_sec`; long: some peer "
                                        "timed out)"),
            "timeouts": Field(int, "", "RAS collective legs that timed out"),
        },
    ),
    Measurement(
        name="nccl_ras_rank",
        doc="One rank of a communicator that RAS reports in trouble, at one status poll "
            "(ranks in good health get no record; their count is in nccl_ras_comm).",
        source=_SOURCE,
        tags={**_TAGS,
              "rank": "rank in the communicator",
              "state": "dead (silent ~60 s), unresponsive (did not answer), missing (not "
                       "reported, reason unknown), error (asynchronous NCCL error or failed "
                       "init) or aborted (ncclCommAbort called)"},
        fields={
            "host": Field(str, "", "the rank's host address as RAS knows it (`unknown` "
                                   "when RAS has no peer for it)"),
            "pid": Field(int, "", "its process id on that host (-1 when unknown)"),
            "cuda_dev": Field(int, "", "its CUDA device"),
            "async_error": Field(int, "", "ncclResult_t of its asynchronous error (error)"),
            "init_state": Field(int, "", "ncclResult_t of its init (error)"),
        },
    ),
]
