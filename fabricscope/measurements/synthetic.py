"""Measurement of the synthetic load-generator source (agent/sources/synthetic.py)."""

from fabricscope.schema import Field, Measurement

MEASUREMENTS = [
    Measurement(
        name="synthetic",
        doc="Numbered test records at a fixed rate, for transport tests and benchmarks: record "
            "n of a run is timestamped base + n / rate, so a resent record rewrites the same "
            "point and `count(n)` per node tells exactly how many arrived.",
        source="agent source synthetic (agent/sources/synthetic.py; load generator, not a "
               "measurement of anything)",
        tags={"stream": "which generator of the node (the agent runs one: '0'; the load "
                        "generator bench/loadgen.py numbers its streams)"},
        fields={
            "n": Field(int, "records", "sequence number, from 0"),
            "value": Field(float, "", "a deterministic pseudo-random payload value"),
        },
    ),
]
