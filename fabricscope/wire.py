"""Conversion between Records and the protobuf wire contract (proto/fabricscope/v1).

The generated modules live in fabricscope/v1/ and are produced by `make proto`
from proto/fabricscope/v1/telemetry.proto; they are never edited by hand.
"""

from __future__ import annotations

from fabricscope.records import Record

try:
    from fabricscope.v1 import telemetry_pb2 as pb
    from fabricscope.v1 import telemetry_pb2_grpc as pb_grpc
except ImportError as exc:  # pragma: no cover - only on an unprepared checkout
    from fabricscope.errors import UserError
    raise UserError("generated wire code is missing (fabricscope/v1/telemetry_pb2.py)",
                    "run `make proto` (or `make test`, which runs setup)") from exc

__all__ = ["pb", "pb_grpc", "record_to_pb", "record_from_pb", "make_batch"]


def _set_value(dst, value) -> None:
    # bool before int: bool is a subclass of int.
    if isinstance(value, bool):
        dst.b = value
    elif isinstance(value, int):
        dst.i = value
    elif isinstance(value, float):
        dst.f = value
    elif isinstance(value, str):
        dst.s = value
    else:
        raise TypeError(f"unsupported field value {value!r}")


def record_to_pb(record: Record, out=None):
    msg = out if out is not None else pb.Record()
    msg.measurement = record.measurement
    msg.time_ns = record.time_ns
    msg.tags.update(record.tags)
    for name, value in record.fields.items():
        _set_value(msg.fields[name], value)
    return msg


def record_from_pb(msg) -> Record:
    fields = {}
    for name, value in msg.fields.items():
        kind = value.WhichOneof("kind")
        if kind is None:
            raise ValueError(f"field {name!r} has no value")
        fields[name] = getattr(value, kind)
    return Record(msg.measurement, msg.time_ns, dict(msg.tags), fields)


def make_batch(*, node: str, agent_id: str, seq: int, records: list[Record] = (),
               dropped_before: int = 0, schema_version: int | None = None,
               lines: list[str] = ()):
    """A Batch carrying `records` as Record messages and `lines` as line protocol
    (agents send lines: fabricscope.lineschema.canonical_line)."""
    from fabricscope.schema import SCHEMA_VERSION
    batch = pb.Batch(schema_version=SCHEMA_VERSION if schema_version is None else schema_version,
                     node=node, agent_id=agent_id, seq=seq, dropped_before=dropped_before,
                     lines=lines)
    for r in records:
        record_to_pb(r, batch.records.add())
    return batch
