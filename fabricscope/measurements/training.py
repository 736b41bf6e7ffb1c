"""Measurements of the training markers source (fabricscope/markers.py)."""

from fabricscope.schema import Field, Measurement

MEASUREMENTS = [
    Measurement(
        name="train_step",
        doc="One training step as marked by the training script (fabricscope.markers.step).",
        source="agent source markers (agent/sources/markers.py)",
        tags={"job": "job id (FABRICSCOPE_JOB, else MASTER_ADDR:MASTER_PORT, else pid)",
              "rank": "training rank (RANK env; '-' when unset)"},
        fields={
            "step": Field(int, "step", "step number"),
            "seconds": Field(float, "s", "wall time from this step's marker to the next marker"),
        },
    ),
]
