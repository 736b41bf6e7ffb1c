"""The one record type that flows from probes to sinks.

A Record is one InfluxDB point. Probes produce them, the agent batches them, the
wire carries them (fabricscope.wire), the collector validates them against
fabricscope.schema and writes them. Field values keep their Python type: int is
an InfluxDB integer (`i` suffix), float a float, str a string, bool a boolean.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

FieldValue = int | float | str | bool


@dataclass(slots=True)
class Record:
    measurement: str
    time_ns: int
    tags: dict[str, str] = field(default_factory=dict)
    fields: dict[str, FieldValue] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {"measurement": self.measurement, "time_ns": self.time_ns,
             "tags": self.tags, "fields": self.fields},
            separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Record":
        obj = json.loads(text)
        return cls(obj["measurement"], int(obj["time_ns"]), dict(obj.get("tags", {})),
                   dict(obj.get("fields", {})))

    def identity(self) -> tuple:
        """What makes two records the same InfluxDB point (a rewrite replaces it)."""
        return (self.measurement, tuple(sorted(self.tags.items())), self.time_ns)
