"""The data schema: every measurement, tag and field that fabricscope writes.

Declared once here, as data. The agent's decoders produce records of these
measurements, the collector validates incoming records against them, and
docs/SCHEMA.md is rendered from them (`python -m fabricscope.schema`; a test
checks the file is current). Adding a probe adds a Measurement here; nothing on
the wire or in the collector changes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from fabricscope.records import Record

SCHEMA_VERSION = 1

#: Tags every record carries, set by the agent, not the probe.
COMMON_TAGS = {"node": "node name the agent reports for (config `node`, default the hostname)"}


@dataclass(frozen=True)
class Field:
    type: type          # int, float, str or bool
    unit: str
    doc: str


@dataclass(frozen=True)
class Measurement:
    name: str
    doc: str
    source: str                                     # which probe or component writes it
    tags: dict[str, str] = field(default_factory=dict)   # tag name -> meaning
    fields: dict[str, Field] = field(default_factory=dict)
    optional_tags: frozenset[str] = frozenset()

    def all_tags(self) -> dict[str, str]:
        return {**COMMON_TAGS, **self.tags}


def measurement_modules() -> list[str]:
    """The modules under fabricscope/measurements/, one per probe family or component,
    each with a MEASUREMENTS list; found by listing the package, so adding a family
    adds one module and nothing else here."""
    import pkgutil

    import fabricscope.measurements as pkg
    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.ispkg)


def _collect() -> list[Measurement]:
    import importlib
    out: list[Measurement] = []
    for mod in measurement_modules():
        out += importlib.import_module(f"fabricscope.measurements.{mod}").MEASUREMENTS
    names = [m.name for m in out]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise RuntimeError(f"measurements declared twice: {sorted(dupes)}")
    return out


_MEASUREMENTS: list[Measurement] = []
MEASUREMENTS: dict[str, Measurement] = {}


def _load() -> None:
    if not _MEASUREMENTS:
        _MEASUREMENTS.extend(_collect())
        MEASUREMENTS.update({m.name: m for m in _MEASUREMENTS})


class SchemaError(ValueError):
    """A record that does not match the schema."""


def validate(record: Record) -> None:
    """Raise SchemaError naming the first problem; return None when the record is valid."""
    _load()
    m = MEASUREMENTS.get(record.measurement)
    if m is None:
        raise SchemaError(f"unknown measurement {record.measurement!r}")
    if record.time_ns <= 0:
        raise SchemaError(f"{m.name}: time_ns must be positive")
    known_tags = m.all_tags()
    for tag in record.tags:
        if tag not in known_tags:
            raise SchemaError(f"{m.name}: unknown tag {tag!r}")
    for tag in known_tags:
        if tag not in record.tags and tag not in m.optional_tags:
            raise SchemaError(f"{m.name}: missing tag {tag!r}")
    if not record.fields:
        raise SchemaError(f"{m.name}: no fields")
    for name, value in record.fields.items():
        spec = m.fields.get(name)
        if spec is None:
            raise SchemaError(f"{m.name}: unknown field {name!r}")
        ok = (isinstance(value, spec.type) and not (spec.type is int and isinstance(value, bool))) \
            or (spec.type is float and isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            raise SchemaError(f"{m.name}: field {name!r} must be {spec.type.__name__}")


def render_markdown() -> str:
    _load()
    out = ["# fabricscope data schema", "",
           f"Schema version {SCHEMA_VERSION}. Rendered from `fabricscope/schema.py` by "
           "`python -m fabricscope.schema`; do not edit by hand.", "",
           "Every record is one InfluxDB point. Timestamps are UNIX epoch nanoseconds, "
           "taken from the kernel's monotonic clock (`bpf_ktime_get_ns`) and shifted to "
           "wall-clock time by the agent. Integer fields are written as InfluxDB integers.", ""]
    for m in _MEASUREMENTS:
        out += [f"## `{m.name}`", "", m.doc, "", f"Written by: {m.source}.", "",
                "| tag | meaning |", "|---|---|"]
        for tag, doc in m.all_tags().items():
            opt = " (optional)" if tag in m.optional_tags else ""
            out.append(f"| `{tag}` | {doc}{opt} |")
        out += ["", "| field | type | unit | meaning |", "|---|---|---|---|"]
        for name, f in m.fields.items():
            out.append(f"| `{name}` | {f.type.__name__} | {f.unit} | {f.doc} |")
        out.append("")
    return "\n".join(out)


def measurements() -> dict[str, Measurement]:
    _load()
    return MEASUREMENTS


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
