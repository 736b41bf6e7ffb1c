"""Measurements the agent writes about itself."""

from fabricscope.schema import Field, Measurement

MEASUREMENTS = [
    Measurement(
        name="agent_loss",
        doc="Records an agent could not keep, counted at the agent and shipped so that "
            "gaps are visible in InfluxDB.",
        source="agent shipper",
        tags={"agent_id": "boot id of the agent process", "reason": "why they were lost"},
        fields={"records": Field(int, "records",
                                 "records lost since the agent started (cumulative)")},
    ),
]
