"""InfluxDB line protocol encoding: the one implementation every writer uses.

    measurement,tag1=v1,tag2=v2 field1=1i,field2=0.5,field3="text",field4=true 1700000000000000000

Escaping follows the InfluxDB line protocol reference (identical in 1.x and 2.x):
measurement names escape comma and space; tag keys, tag values and field keys
escape comma, equals sign and space; string field values escape double quote and
backslash and are quoted. Integers carry the `i` suffix, floats are written with
Python's shortest round-trip repr, booleans as `true`/`false`, timestamps as
integer nanoseconds. Tags are sorted by key (InfluxDB's recommended order) and so
are fields, so one record always gives one line (protobuf maps have no order).

What cannot be written faithfully raises LineProtocolError instead of being
mangled, so the caller can reject and count it:
- a backslash in a measurement, key or tag value: InfluxDB 1.x does not unescape
  `\\\\` there (it stores both backslashes) and a trailing backslash makes the
  line unparseable, so no encoding round-trips on every server;
- control characters (newline, tab, ...) in a measurement, key or tag value;
- empty names or tag values, no fields, the reserved key `time`;
- NaN or infinite floats and integers outside int64 (InfluxDB refuses both).
Newlines inside string field values are legal (the value is quoted).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable

from fabricscope.records import Record

_MEASUREMENT = str.maketrans({",": r"\,", " ": r"\ "})
_KEY = str.maketrans({",": r"\,", "=": r"\=", " ": r"\ "})
_STRING = str.maketrans({"\\": "\\\\", '"': '\\"'})
_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f\\]")
_INT64 = (-(1 << 63), (1 << 63) - 1)


class LineProtocolError(ValueError):
    """A record that line protocol cannot represent; the message names the part."""


@functools.lru_cache(maxsize=1 << 16)
def _escaped(text, measurement: bool) -> str | None:
    """Escaped form of a name or tag value, None when it cannot be written.

    Cached: measurement names, keys and most tag values (addresses, ports, node
    names) repeat on every record, and escaping is most of the encoding time."""
    if not isinstance(text, str) or not text or _FORBIDDEN.search(text):
        return None
    return text.translate(_MEASUREMENT if measurement else _KEY)


def _name(text, what: str, measurement: bool = False, key: bool = False, of=None) -> str:
    try:
        out = _escaped(text, measurement)
    except TypeError:           # unhashable, so certainly not a str
        out = None
    if out is None:
        what = what if of is None else f"{what} of {of!r}"   # built only when failing
        if not isinstance(text, str) or not text:
            raise LineProtocolError(f"{what} is empty" if text == "" or text is None
                                    else f"{what} {text!r} is not a string")
        bad = _FORBIDDEN.search(text)
        raise LineProtocolError(f"{what} {text!r} contains {bad.group()!r} "
                                "(backslash and control characters are not representable)")
    if key and text == "time":
        raise LineProtocolError(f"{what} 'time' is reserved by InfluxDB")
    return out


def _value(value, name: str) -> str:
    kind = type(value)            # the common exact types first (no isinstance chain)
    if kind is int and _INT64[0] <= value <= _INT64[1]:
        return f"{value}i"
    if kind is float and math.isfinite(value):
        return repr(value)
    # bool before int: bool is a subclass of int.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise LineProtocolError(f"field {name!r}: integer {value} outside int64")
        return f"{value}i"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise LineProtocolError(f"field {name!r}: {value} is not a finite number")
        return repr(value)
    if isinstance(value, str):
        if '"' in value or "\\" in value:
            value = value.translate(_STRING)
        return '"' + value + '"'
    raise LineProtocolError(f"field {name!r}: unsupported value type {type(value).__name__}")


def _head(measurement, tags: dict) -> str:
    parts = [_name(measurement, "measurement", measurement=True)]
    for key in sorted(tags):
        parts.append("," + _name(key, "tag key", key=True) + "="
                     + _name(tags[key], "tag value", of=key))
    return "".join(parts)


#: measurement and tags (as given) -> "measurement,k=v,..." ; only valid heads are kept
_HEADS: dict = {}
#: field key -> its escaped form followed by "="
_FIELD_KEYS: dict = {}


def _cached_head(measurement, tags: dict) -> str:
    """The head of a line, cached: a series (one measurement and tag set) repeats on
    every window, and sorting and escaping the tags was half of encoding a record."""
    try:
        key = (measurement, *tags.items())
        head = _HEADS.get(key)
    except TypeError:             # an unhashable tag value: certainly not a string
        return _head(measurement, tags)
    if head is None:
        head = _head(measurement, tags)
        if len(_HEADS) >= 1 << 14:
            _HEADS.clear()
        _HEADS[key] = head
    return head


def _field_key(key) -> str:
    try:
        out = _FIELD_KEYS.get(key)
    except TypeError:
        out = None
    if out is None:
        out = _name(key, "field key", key=True) + "="
        if len(_FIELD_KEYS) < 1 << 12:
            _FIELD_KEYS[key] = out
    return out


def encode(record: Record) -> str:
    """One line (without the trailing newline). Raises LineProtocolError."""
    head = _cached_head(record.measurement, record.tags)
    fields = record.fields
    if not fields:
        raise LineProtocolError(f"{record.measurement}: no fields")
    body = ",".join(_field_key(k) + _value(fields[k], k) for k in sorted(fields))
    if type(record.time_ns) is not int or not _INT64[0] <= record.time_ns <= _INT64[1]:
        raise LineProtocolError(f"timestamp {record.time_ns!r} is not an int64 of nanoseconds")
    return head + " " + body + " " + str(record.time_ns)


def encode_many(records: Iterable[Record]) -> bytes:
    """Newline-separated lines, UTF-8, ready for a /write body. Raises on the first bad one."""
    return "\n".join(encode(r) for r in records).encode()


def chunks(lines: list, size: int) -> Iterable[list]:
    """Split into lists of at most `size` (InfluxDB's advice: ~5000 lines per write)."""
    for start in range(0, len(lines), size):
        yield lines[start:start + size]
