"""Validation of one incoming Batch: which records are written, which are refused and why.

Batch-level problems (wrong schema_version, empty node or one that cannot be a
tag value, seq 0) refuse the whole batch. Otherwise each record is checked on
its own. A line (Batch.lines, what agents send) must be the canonical line of a
valid record for the batch's node within the time window
(fabricscope.lineschema: the whole batch against one regular expression first, and
when that does not accept it, each line against its measurement's; the line is
written as received, the `node` tag must be in it). A Record message is checked
in this order: it has a
value in every field; its `node` tag equals batch.node (added when missing);
fabricscope.schema.validate; its timestamp lies within [now - max_age_s,
now + max_future_s]; it can be encoded as line protocol. Integer values of float
fields are converted to float so InfluxDB never sees one field with two types
(which it would refuse for the whole series). A valid record leaves as its
encoded line, so the sink never encodes twice.

Every refusal has a reason from REASONS: a bounded set, used as the `reason`
label of fabricscope_collector_records_rejected_total.
"""

from __future__ import annotations

import collections
import functools
from dataclasses import dataclass, field

from fabricscope import lineproto, schema
from fabricscope.lineschema import LineValidator
from fabricscope.records import Record
from fabricscope.wire import record_from_pb

REASONS = {
    "schema_version": "batch of another schema version (whole batch refused)",
    "bad_batch": "batch without node or with seq 0 (whole batch refused)",
    "no_value": "a field without a value on the wire",
    "node_mismatch": "record tag node differs from the batch's node",
    "unknown_measurement": "measurement not in the schema",
    "unknown_tag": "tag not in the measurement's schema",
    "missing_tag": "required tag absent",
    "unknown_field": "field not in the measurement's schema",
    "field_type": "field value of the wrong type",
    "no_fields": "record without fields",
    "bad_time": "timestamp not positive",
    "time_future": "timestamp more than max_future_s ahead of the collector's clock",
    "time_past": "timestamp older than max_age_s",
    "unencodable": "not representable in line protocol (see fabricscope.lineproto)",
    "schema": "other schema violation",
    "sink_rejected": "refused by InfluxDB itself (HTTP 400)",
    "oversized": "batch message over max_message_bytes (whole batch refused)",
}

# SchemaError carries only a message; map it onto a reason (first match wins).
_SCHEMA_REASONS = [("unknown measurement", "unknown_measurement"), ("time_ns", "bad_time"),
                   ("unknown tag", "unknown_tag"), ("missing tag", "missing_tag"),
                   ("no fields", "no_fields"), ("unknown field", "unknown_field"),
                   ("must be", "field_type")]


class Invalid(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Limits:
    max_future_ns: int
    max_age_ns: int

    @classmethod
    def from_config(cls, config) -> "Limits":
        return cls(int(config.max_future_s * 1e9), int(config.max_age_s * 1e9))


@dataclass
class Checked:
    """The outcome for one batch."""

    lines: list[str] = field(default_factory=list)       # valid records, encoded
    max_time_ns: int = 0                                  # latest valid timestamp (0: none)
    rejected: collections.Counter = field(default_factory=collections.Counter)
    first_problem: str = ""                               # detail of the first refusal
    first_reason: str = ""                                # its reason (a key of REASONS)
    batch_error: str = ""                                 # set: the whole batch is refused

    def refuse(self, reason: str, detail: str, count: int = 1) -> None:
        self.rejected[reason] += count
        if not self.first_problem:
            self.first_problem, self.first_reason = detail, reason

    @property
    def rejected_count(self) -> int:
        return sum(self.rejected.values())


def schema_reason(error: schema.SchemaError) -> str:
    text = str(error)
    return next((reason for key, reason in _SCHEMA_REASONS if key in text), "schema")


def check_batch(batch, now_ns: int, limits: Limits) -> Checked:
    out = Checked()
    problem = _batch_problem(batch)
    if problem:
        reason, out.batch_error = problem
        if batch.records or batch.lines:
            out.rejected[reason] = len(batch.records) + len(batch.lines)
        out.first_problem, out.first_reason = out.batch_error, reason
        return out
    _check_records(batch, now_ns, limits, out)
    if batch.lines:
        _check_lines(batch, now_ns, limits, out)
    return out


@functools.lru_cache(maxsize=1)
def _validator() -> LineValidator:
    return LineValidator()


def _check_lines(batch, now_ns: int, limits: Limits, out: Checked) -> None:
    node = lineproto._escaped(batch.node, False)    # checked by _batch_problem
    validator = _validator()
    received = list(batch.lines)       # protobuf makes a new str at every access
    latest = validator.check_all(received, node, now_ns, limits.max_future_ns,
                                 limits.max_age_ns)
    if latest:                         # every line valid: the common case, in one pass
        out.lines.extend(received)
        out.max_time_ns = max(out.max_time_ns, latest)
        return
    check = validator.check
    first, lines, latest = len(batch.records), out.lines, out.max_time_ns
    for index, line in enumerate(received, first):
        ts, verdict = check(line, node, now_ns, limits.max_future_ns, limits.max_age_ns)
        if verdict is not None:
            out.refuse(verdict.reason, f"record {index}: {verdict.detail}")
            continue
        lines.append(line)
        if ts > latest:
            latest = ts
    out.max_time_ns = latest


def _check_records(batch, now_ns: int, limits: Limits, out: Checked) -> None:
    for index, msg in enumerate(batch.records):
        try:
            record = check_record(msg, batch.node, now_ns, limits)
            out.lines.append(lineproto.encode(record))
        except lineproto.LineProtocolError as exc:
            out.refuse("unencodable", f"record {index}: {exc}")
            continue
        except Invalid as exc:
            out.refuse(exc.reason, f"record {index}: {exc.detail}")
            continue
        out.max_time_ns = max(out.max_time_ns, record.time_ns)


def _batch_problem(batch) -> tuple[str, str] | None:
    if batch.schema_version != schema.SCHEMA_VERSION:
        return ("schema_version",
                f"schema_version {batch.schema_version} is not the collector's "
                f"{schema.SCHEMA_VERSION}; fix: run agent and collector of one fabricscope release")
    if not batch.node:
        return "bad_batch", "batch has no node"
    if lineproto._escaped(batch.node, False) is None:
        return "bad_batch", (f"node {batch.node[:80]!r} cannot be a tag value (empty, "
                             "backslash or control character)")
    if batch.seq == 0:
        return "bad_batch", "batch seq must be > 0"
    return None


def check_record(msg, node: str, now_ns: int, limits: Limits) -> Record:
    """The record, completed and normalized; raise Invalid naming the first problem."""
    try:
        record = record_from_pb(msg)
    except ValueError as exc:
        raise Invalid("no_value", f"{msg.measurement}: {exc}") from None
    tagged = record.tags.setdefault("node", node)
    if tagged != node:
        raise Invalid("node_mismatch", f"{record.measurement}: tag node={tagged!r} in a batch "
                      f"from node {node!r}")
    try:
        schema.validate(record)
    except schema.SchemaError as exc:
        raise Invalid(schema_reason(exc), str(exc)) from None
    if record.time_ns > now_ns + limits.max_future_ns:
        raise Invalid("time_future", f"{record.measurement}: timestamp "
                      f"{(record.time_ns - now_ns) / 1e9:.0f} s in the future")
    if record.time_ns < now_ns - limits.max_age_ns:
        raise Invalid("time_past", f"{record.measurement}: timestamp "
                      f"{(now_ns - record.time_ns) / 1e9:.0f} s in the past")
    spec = schema.measurements()[record.measurement].fields
    for name, value in record.fields.items():
        if spec[name].type is float and isinstance(value, int):
            record.fields[name] = float(value)
    return record
