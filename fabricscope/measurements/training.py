"""Measurements of the training markers source (fabricscope/markers.py)."""

from fabricscope.measurements import JOB_TAGS, POD_TAGS
from fabricscope.schema import Field, Measurement

MEASUREMENTS = [
    Measurement(
        name="train_step",
        doc="One training step as marked by the training script (fabricscope.markers.step).",
        source="agent source markers (agent/sources/markers.py)",
        tags=JOB_TAGS,
        optional_tags=frozenset(POD_TAGS),
        fields={
            "step": Field(int, "step", "step number"),
            "seconds": Field(float, "s", "wall time from this step's marker to the next marker"),
        },
    ),
]
