"""Records as canonical line protocol, and their validation at regex speed.

Agents send records as lines (Batch.lines): `canonical_line(record)` is
fabricscope.lineproto.encode after the schema's one normalization (an int
value of a float field becomes a float, so a field never has two types). The
collector must check every line against fabricscope.schema without paying for
a decode into Python objects: `LineValidator.check(line, node, now_ns)` matches
it against one compiled regular expression per measurement, built from the
schema, that accepts exactly the canonical lines of valid records:

    <measurement>(,<tag>=<value>)* <field>=<value>(,<field>=<value>)* <timestamp>

tags in sorted order, every required tag present and no unknown tag; a
non-empty, sorted subset of the measurement's fields, each with its type's
canonical form (int `-12i`, float as Python's repr, string quoted with `"` and
`\\` escaped, bool `true`/`false`); a positive timestamp. The node tag is then
compared with the batch's node and the timestamp with the accepted window. A
line that does not match is diagnosed by `diagnose` (slow path, only for
refused lines) to give the same reasons fabricscope.collector.validate uses for records.

A whole batch is first tried at once (`LineValidator.check_all`): its lines,
joined, against one expression of every measurement's lines with the batch's
node in place, and the window checked on the lowest and highest timestamp. That
costs one call into the regex engine per batch instead of a Python call, a match
object and four comparisons per line (5x faster on the load generator's lines);
it accepts a subset of what `check` accepts, and a batch it does not accept is
checked line by line.

Equivalence with the record path (schema.validate + lineproto.encode) is
property-tested in tests/unit/test_transport_lineschema.py.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from fabricscope import lineproto, schema
from fabricscope.records import Record

# An escaped tag value as lineproto writes it: no backslash or control character
# except the escapes of comma, equals sign and space; non-empty. Written as an
# "unrolled loop" (plain run, then escape + plain run, ...): 3x faster than a
# per-character alternation in Python's regex engine.
_PLAIN = r"[^,= \\\x00-\x1f\x7f]"
_TAG_VALUE = rf"(?:{_PLAIN}|\\[,= ]){_PLAIN}*(?:\\[,= ]{_PLAIN}*)*"
_VALUES = {
    # Up to 18 digits, or 19 starting 1-8: always inside int64. Integers of magnitude
    # >= 9e18 (int64 ends at 9.22e18) take the slow path and are refused as unencodable.
    int: r"-?(?:0|[1-9][0-9]{0,17}|[1-8][0-9]{18})i",
    float: r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+|)(?:e[+-][0-9]{2,3}|)",
    str: r'"(?:[^"\\]|\\["\\])*"',
    bool: r"(?:true|false)",
}
# What check_all accepts, a subset of _VALUES that needs no second look: strings without
# a newline (so the joined batch has one line per newline), floats in the shapes of
# Python's repr that cannot overflow a double (<= 16 integer digits, or one digit and an
# exponent up to e+307), and below, timestamps of exactly 19 digits (2001-2286), whose
# order as text is their order as numbers.
_BATCH_VALUES = {
    **_VALUES,
    str: r'"(?:[^"\\\n]|\\["\\])*"',
    float: r"-?(?:(?:0|[1-9][0-9]{0,15})(?:\.[0-9]+|)"
           r"|[1-9](?:\.[0-9]+|)e(?:-[0-9]{2,3}|\+(?:[0-2]?[0-9]{2}|30[0-7])))",
}
_TS_DIGITS = 19
_INT64_MAX = (1 << 63) - 1
_HEAD = re.compile(r"((?:[^, \\]|\\[, ])+)[, ]")


def canonical_line(record: Record) -> str:
    """The one line the collector accepts for a valid record (raises LineProtocolError)."""
    spec = schema.measurements().get(record.measurement)
    if spec is not None:
        for name, value in record.fields.items():
            field = spec.fields.get(name)
            if field is not None and field.type is float and type(value) is int:
                record.fields[name] = float(value)
    return lineproto.encode(record)


def _escape_key(text: str) -> str:
    return re.escape(lineproto._name(text, "key", key=True))


def _fields_pattern(fields: dict, values: dict = _VALUES) -> str:
    """A non-empty, sorted subset: one alternative per first field present.

    Optional parts here and in the tags are written `(?:x|)`, not `(?:x)?`: the same
    language, but Python's engine runs a branch about twice as fast as a repeat of a
    group (measured on 21-field tcp_flow lines)."""
    names = sorted(fields)
    part = {n: _escape_key(n) + "=" + values[fields[n].type] for n in names}
    alternatives = []
    for i, first in enumerate(names):
        alternatives.append(part[first] + "".join(f"(?:,{part[n]}|)" for n in names[i + 1:]))
    return "(?:" + "|".join(alternatives) + ")"


def _measurement_regex(m: schema.Measurement) -> re.Pattern:
    tags = m.all_tags()
    out = [re.escape(lineproto._name(m.name, "measurement", measurement=True))]
    for key in sorted(tags):
        group = "(?P<node>" if key == "node" else "(?:"
        piece = f",{_escape_key(key)}={group}{_TAG_VALUE})"
        out.append(f"(?:{piece}|)" if key in m.optional_tags else piece)
    out.append(" " + _fields_pattern(m.fields) + r" (?P<ts>[1-9][0-9]{0,18})")
    return re.compile("".join(out), re.DOTALL)


def _batch_line_pattern(m: schema.Measurement) -> str:
    """One line of `m` as check_all accepts it: the node tag required and equal to the
    batch's (the backreference to the text's first line), values as in _BATCH_VALUES."""
    out = [re.escape(_measurement_head(m.name))]
    for key in sorted(m.all_tags()):
        if key == "node":
            out.append(",node=(?P=node)")
            continue
        piece = f",{_escape_key(key)}=(?:{_TAG_VALUE})"
        out.append(f"(?:{piece}|)" if key in m.optional_tags else piece)
    out.append(" " + _fields_pattern(m.fields, _BATCH_VALUES)
               + rf" [1-9][0-9]{{{_TS_DIGITS - 1}}}")
    return "".join(out)


def _batch_regex(measurements: list[schema.Measurement]) -> re.Pattern:
    """The batch's node, then one or more lines, each after a newline. Measurements are
    grouped by first letter so that a line tries a handful of names, not all."""
    groups: dict[str, list[str]] = {}
    for m in measurements:
        groups.setdefault(m.name[0], []).append(_batch_line_pattern(m))
    line = "|".join("(?:" + "|".join(group) + ")" for group in groups.values())
    return re.compile(rf"(?P<node>[^\n]*)(?:\n(?:{line}))+")


@dataclass(frozen=True)
class LineVerdict:
    """Why a line is refused."""

    reason: str                # a key of fabricscope.collector.validate.REASONS
    detail: str


class LineValidator:
    """Compiled once per schema; check() is safe to call from any thread."""

    def __init__(self) -> None:
        plain = [m for m in schema.measurements().values()
                 if _measurement_head(m.name) == m.name]
        self._measurements = {m.name: m for m in plain}
        # Per-line expressions are compiled when a line first needs one (valid batches
        # pass check_all alone): compiling all of them costs as much as the batch's.
        self._regex: dict[str, re.Pattern] = {}
        self._batch = _batch_regex(plain)

    def check_all(self, lines: list[str], node_escaped: str, now_ns: int, max_future_ns: int,
                  max_age_ns: int) -> int:
        """The latest timestamp when every line is valid (check() accepts each one), 0
        when this fast check cannot say so: then check the lines one by one. `lines`
        must not be empty."""
        text = "\n".join(lines)
        # One newline per line (node + "\n" + each line): no line may hide a newline,
        # which would make the regex's lines differ from the batch's.
        if text.count("\n") != len(lines) - 1 \
                or self._batch.fullmatch(node_escaped + "\n" + text) is None:
            return 0
        stamps = [line[-_TS_DIGITS:] for line in lines]
        oldest, latest = int(min(stamps)), int(max(stamps))
        if latest > now_ns + max_future_ns or latest > _INT64_MAX \
                or oldest < now_ns - max_age_ns:
            return 0
        return latest

    def check(self, line: str, node_escaped: str, now_ns: int, max_future_ns: int,
              max_age_ns: int) -> tuple[int, LineVerdict | None]:
        """(timestamp, None) for a valid line, (0, verdict) for a refused one.

        `node_escaped`: the batch's node as it appears in a tag (lineproto-escaped)."""
        # Schema measurement names need no escaping, so the name ends at the first comma.
        regex = self._line_regex(line.partition(",")[0])
        match = regex.fullmatch(line) if regex is not None else None
        if match is None:
            return 0, diagnose(line)
        node = match.group("node")
        if node != node_escaped:
            return 0, LineVerdict("node_mismatch", f"tag node={node!r} in a batch from node "
                                  f"{node_escaped!r}")
        if _MAYBE_HUGE.search(line) and not _floats_finite(line[:match.start("ts")]):
            return 0, LineVerdict("unencodable", f"{line.partition(',')[0]}: a float field "
                                  "overflows to infinity")
        ts = int(match.group("ts"))
        if ts > now_ns + max_future_ns or ts > _INT64_MAX:
            return 0, LineVerdict("time_future", f"{line.partition(',')[0]}: timestamp "
                                  f"{(ts - now_ns) / 1e9:.0f} s in the future")
        if ts < now_ns - max_age_ns:
            return 0, LineVerdict("time_past", f"{line.partition(',')[0]}: timestamp "
                                  f"{(now_ns - ts) / 1e9:.0f} s in the past")
        return ts, None

    def _line_regex(self, name: str) -> re.Pattern | None:
        regex = self._regex.get(name)
        if regex is None and name in self._measurements:
            # Threads may race to compile the same one: the results are equal.
            regex = self._regex[name] = _measurement_regex(self._measurements[name])
        return regex


# A float literal the regex accepts may still overflow a double (1e+309, or a mantissa
# of 310 digits); such lines take a slow, exact check. Python's repr of a finite
# double never matches this, so canonical lines stay on the fast path.
_MAYBE_HUGE = re.compile(r"e\+[3-9][0-9]{2}|[0-9]{300}")


def _floats_finite(head_and_fields: str) -> bool:
    """Every unquoted, non-integer, non-bool field value parses to a finite float.
    `head_and_fields`: the line up to its timestamp."""
    # The head ends at the first unescaped space; a `"` in a tag value is a plain
    # character there (only field values are quoted), so the head is split without quotes.
    text = head_and_fields.rstrip(" ")
    head = _split_unescaped(text, " ")[0]
    fields = text[len(head) + 1:]
    for item in _split_unescaped(fields, ",", quotes=True):
        v = item.partition("=")[2]
        if v.startswith('"') or v.endswith("i") or v in ("true", "false"):
            continue
        try:
            if not math.isfinite(float(v)):
                return False
        except ValueError:
            return False
    return True


def _measurement_head(name: str) -> str:
    return lineproto._name(name, "measurement", measurement=True)


def diagnose(line: str) -> LineVerdict:
    """Why a line is not canonical for the schema (the first problem found)."""
    head = _HEAD.match(line)
    if head is None:
        return LineVerdict("unencodable", f"not a line protocol line: {line[:80]!r}")
    name = head.group(1).replace("\\,", ",").replace("\\ ", " ")
    m = schema.measurements().get(name)
    if m is None:
        return LineVerdict("unknown_measurement", f"unknown measurement {name!r}")
    parts = _split_unescaped(line, " ")
    if len(parts) < 3:
        return LineVerdict("unencodable", f"{name}: expected tags, fields and a timestamp")
    tagset = _split_unescaped(parts[0], ",")[1:]
    keys = [t.split("=", 1)[0] for t in tagset]
    known = m.all_tags()
    for key in keys:
        if key not in known:
            return LineVerdict("unknown_tag", f"{name}: unknown tag {key!r}")
    for key in known:
        if key not in keys and key not in m.optional_tags:
            return LineVerdict("missing_tag", f"{name}: missing tag {key!r}")
    fieldset = " ".join(parts[1:-1])
    if not fieldset:
        return LineVerdict("no_fields", f"{name}: no fields")
    for piece in _split_unescaped(fieldset, ","):
        key, _, value = piece.partition("=")
        spec = m.fields.get(key)
        if spec is None:
            return LineVerdict("unknown_field", f"{name}: unknown field {key!r}")
        if not re.fullmatch(_VALUES[spec.type], value, re.DOTALL):
            return LineVerdict("field_type", f"{name}: field {key!r} must be "
                               f"{spec.type.__name__} in canonical form, not {value[:40]!r}")
    if not re.fullmatch(r"[1-9][0-9]{0,18}", parts[-1]):
        return LineVerdict("bad_time", f"{name}: timestamp {parts[-1][:30]!r} is not a "
                           "positive integer of nanoseconds")
    return LineVerdict("unencodable", f"{name}: not canonical line protocol for the schema "
                       "(escaping or order of tags and fields)")


def _split_unescaped(text: str, sep: str, quotes: bool = False) -> list[str]:
    """Split on `sep` where it is not backslash-escaped (nor, with `quotes`, inside a
    double-quoted string value)."""
    out, current, i, quoted = [], [], 0, False
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            current.append(text[i:i + 2])
            i += 2
            continue
        if quotes and c == '"':
            quoted = not quoted
        if c == sep and not quoted:
            out.append("".join(current))
            current = []
        else:
            current.append(c)
        i += 1
    out.append("".join(current))
    return out
