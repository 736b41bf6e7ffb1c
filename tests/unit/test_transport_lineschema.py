"""fabricscope.lineschema: the line path accepts exactly what the record path accepts."""

from __future__ import annotations

import math

import pytest

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fabricscope.collector.validate import REASONS, Invalid, Limits, check_batch, check_record
from fabricscope import lineproto, schema
from fabricscope.lineschema import LineValidator, canonical_line, diagnose
from fabricscope.records import Record
from fabricscope.wire import make_batch, record_to_pb

NOW = 1_800_000_000_000_000_000
LIMITS = Limits(max_future_ns=3600 * 10**9, max_age_ns=7 * 86400 * 10**9)
VALIDATOR = LineValidator()
MEASUREMENTS = sorted(schema.measurements())

tag_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)),
                   min_size=0, max_size=12)
ints = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
floats = st.floats(allow_nan=True, allow_infinity=True)
values = {int: ints, float: st.one_of(floats, st.integers(-10**6, 10**6)),
          str: st.text(max_size=20), bool: st.booleans()}


safe_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"),
                                          exclude_characters="\\"), min_size=1, max_size=12)
good_values = {int: st.integers(-10**17, 10**17), float: st.floats(allow_nan=False,
                                                                   allow_infinity=False),
               str: st.text(max_size=20), bool: st.booleans()}


@st.composite
def records(draw, valid: bool = False):
    """Records of the schema: mostly valid, with hostile text and edge values; or all
    valid (then only the text and values vary)."""
    m = schema.measurements()[draw(st.sampled_from(MEASUREMENTS))]
    tags = {}
    for key in m.all_tags():
        # An agent tags every line with its node, also where the schema makes it
        # optional (annotation, finding): the line path requires it, the record path adds it.
        if key in m.optional_tags and key != "node" and draw(st.booleans()):
            continue
        text = safe_text if valid else tag_text
        tags[key] = "n1" if key == "node" and valid else draw(
            st.one_of(st.just("n1") if key == "node" else st.just("v"), text))
    if not valid and draw(st.integers(0, 9)) == 0:
        tags[draw(st.sampled_from(["extra", "node"]))] = draw(tag_text)
    names = draw(st.lists(st.sampled_from(sorted(m.fields)), unique=True,
                          min_size=1 if valid else 0, max_size=len(m.fields)))
    pick = good_values if valid else values
    fields = {n: draw(pick[m.fields[n].type]) for n in names}
    if not valid and draw(st.integers(0, 9)) == 0 and m.fields:   # a value of a wrong type
        name = draw(st.sampled_from(sorted(m.fields)))
        fields[name] = draw(st.one_of(*values.values()))
    time_ns = draw(st.integers(NOW - 86400 * 10**9, NOW + 1800 * 10**9) if valid else
                   st.one_of(st.integers(NOW - 8 * 86400 * 10**9, NOW + 7200 * 10**9),
                             st.integers(-5, 5)))
    return Record(m.name, time_ns, tags, fields)


def record_path(record: Record) -> str | None:
    """What the collector writes for this record sent as a Record message."""
    try:
        msg = record_to_pb(Record(record.measurement, record.time_ns, dict(record.tags),
                                  dict(record.fields)))
    except (TypeError, ValueError):
        return None
    try:
        return lineproto.encode(check_record(msg, "n1", NOW, LIMITS))
    except (Invalid, lineproto.LineProtocolError):
        return None


def line_path(record: Record) -> str | None:
    """What the collector writes for this record sent as the agent's canonical line."""
    try:
        line = canonical_line(Record(record.measurement, record.time_ns, dict(record.tags),
                                     dict(record.fields)))
    except lineproto.LineProtocolError:
        return None
    ts, verdict = VALIDATOR.check(line, "n1", NOW, LIMITS.max_future_ns, LIMITS.max_age_ns)
    assert verdict is None or verdict.reason in REASONS
    return line if verdict is None else None


def huge_int(record: Record) -> bool:
    return any(type(v) is int and abs(v) >= 9 * 10**18 for v in record.fields.values())


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records())
def test_line_path_accepts_exactly_what_the_record_path_accepts(record):
    assume(not huge_int(record))     # documented: |int| >= 9e18 is refused on the line path
    if any(isinstance(v, float) and not math.isfinite(v) for v in record.fields.values()):
        assert line_path(record) is None
    assert line_path(record) == record_path(record)


@settings(max_examples=600, deadline=None)
@given(records(valid=True), st.integers(0, 200), st.sampled_from(["insert", "delete", "replace"]),
       st.characters(codec="utf-8", exclude_categories=("Cs",)))
def test_mutated_lines_are_refused_or_still_canonical(record, where, how, char):
    """A line the validator accepts always means a valid record (possibly spelled
    differently: `-0i`, `1.50`; InfluxDB reads the same values)."""
    line = line_path(record)
    assert line is not None and line == record_path(record)
    at = where % (len(line) + 1)
    mutant = {"insert": line[:at] + char + line[at:], "delete": line[:at] + line[at + 1:],
              "replace": line[:at] + char + line[at + 1:]}[how]
    ts, verdict = VALIDATOR.check(mutant, "n1", NOW, LIMITS.max_future_ns, LIMITS.max_age_ns)
    if verdict is not None:
        assert verdict.reason in REASONS
        return
    parsed = parse_line(mutant)
    canonical = record_path(parsed)
    assert canonical is not None and parse_line(canonical) == parsed


def parse_line(line: str) -> Record:
    """An independent, test-only parser of canonical lines (the fields' types from the
    schema), to check that an accepted line means what it says."""
    from fabricscope.lineschema import _split_unescaped
    head, fieldset, ts = _split_unescaped(line, " ")[0], None, None
    rest = line[len(head) + 1:]
    ts = int(rest.rsplit(" ", 1)[1])
    fieldset = rest.rsplit(" ", 1)[0]
    parts = _split_unescaped(head, ",")
    unescape = (lambda s: s.replace("\\,", ",").replace("\\=", "=").replace("\\ ", " "))
    tags = {unescape(k): unescape(v) for k, v in (p.split("=", 1) for p in parts[1:])}
    m = schema.measurements()[parts[0]]
    fields = {}
    for piece in split_fields(fieldset):
        key, value = piece.split("=", 1)
        typ = m.fields[key].type
        fields[key] = (int(value[:-1]) if typ is int else float(value) if typ is float
                       else value == "true" if typ is bool
                       else value[1:-1].replace('\\"', '"').replace("\\\\", "\\"))
    return Record(parts[0], ts, tags, fields)


def split_fields(text: str) -> list[str]:
    out, current, quoted, i = [], "", False, 0
    while i < len(text):
        c = text[i]
        if quoted and c == "\\":
            current += text[i:i + 2]
            i += 2
            continue
        if c == '"':
            quoted = not quoted
        if c == "," and not quoted:
            out.append(current)
            current = ""
        else:
            current += c
        i += 1
    return out + [current]


def test_refusal_reasons_name_the_problem():
    tcp = ("tcp_retransmit,daddr=b,dport=2,node=n1,saddr=a,sport=1,state=E segs=1i "
           f"{NOW}")
    check = lambda line, node="n1": VALIDATOR.check(line, node, NOW, LIMITS.max_future_ns,  # noqa
                                                     LIMITS.max_age_ns)
    assert check(tcp) == (NOW, None)
    assert check(tcp, "n2")[1].reason == "node_mismatch"
    assert check(tcp.replace(f" {NOW}", f" {NOW + 7200 * 10**9}"))[1].reason == "time_future"
    assert check(tcp.replace(f" {NOW}", " 5"))[1].reason == "time_past"
    assert check(tcp.replace(f" {NOW}", " -5"))[1].reason == "bad_time"
    assert check(tcp.replace("segs=1i", "segs=1"))[1].reason == "field_type"
    assert check(tcp.replace("segs=1i", "zz_unknown=1i"))[1].reason == "unknown_field"
    assert check(tcp.replace("state=E", "state=E,zz=1"))[1].reason == "unknown_tag"
    assert check(tcp.replace(",dport=2", ""))[1].reason == "missing_tag"
    assert check("nope,node=n1 v=1i 5")[1].reason == "unknown_measurement"
    assert check(tcp.replace("sport=1,state", "state=E,sport=1,x"))[1].reason == "unknown_tag"
    assert diagnose("garbage").reason == "unencodable"


def test_a_batch_of_lines_is_checked_line_by_line():
    good = canonical_line(Record("tcp_retransmit", NOW, {
        "node": "n1", "saddr": "a", "daddr": "b", "sport": "1", "dport": "2", "state": "E"},
        {"segs": 2}))
    batch = make_batch(node="n1", agent_id="a", seq=1,
                       records=[Record("train_step", NOW + 1, {"job": "j", "rank": "0"},
                                       {"seconds": 1})],
                       lines=[good, "nope,node=n1 v=1i 5", good.replace("node=n1", "node=n2")])
    out = check_batch(batch, NOW, LIMITS)
    assert out.lines == [f"train_step,job=j,node=n1,rank=0 seconds=1.0 {NOW + 1}", good]
    assert dict(out.rejected) == {"unknown_measurement": 1, "node_mismatch": 1}
    assert out.first_problem == "record 2: unknown measurement 'nope'"
    assert out.max_time_ns == NOW + 1


@pytest.mark.parametrize("literal", ["17976931348622317e+308", "1e+999", "1" * 310 + ".0"])
def test_a_float_literal_that_overflows_a_double_is_refused(literal):
    # found by the fuzzer above: deleting the "." of the largest double gives 1.8e+324
    r = Record("gloo_phase", NOW, {"node": "n1", "job": "v", "rank": "0", "phase": "x"},
               {"seconds": 1.5, "bytes": 0, "peer": "a b,c=\"1e+999\""})
    line = canonical_line(r)
    assert VALIDATOR.check(line, "n1", NOW, LIMITS.max_future_ns, LIMITS.max_age_ns)[1] is None
    mutant = line.replace("seconds=1.5", f"seconds={literal}")
    ts, verdict = VALIDATOR.check(mutant, "n1", NOW, LIMITS.max_future_ns, LIMITS.max_age_ns)
    assert verdict is not None and verdict.reason == "unencodable"


def test_a_large_finite_float_after_a_quote_in_a_tag_is_accepted():
    # found by the fuzzer above: a `"` in a tag value made the overflow check read the
    # tags as an open string, so 1e+300 (finite) was refused as overflowing
    r = Record("gloo_collective", NOW, {"node": "n1", "job": "v", "rank": "v", "op": '"'},
               {"algbw_gbs": 1e300})
    line = canonical_line(r)
    assert VALIDATOR.check(line, "n1", NOW, LIMITS.max_future_ns, LIMITS.max_age_ns) == \
        (NOW, None)
    overflow = line.replace("1e+300", "1e+999")
    assert VALIDATOR.check(overflow, "n1", NOW, LIMITS.max_future_ns,
                           LIMITS.max_age_ns)[1].reason == "unencodable"


def check_all(lines: list[str], node: str = "n1") -> int:
    return VALIDATOR.check_all(lines, node, NOW, LIMITS.max_future_ns, LIMITS.max_age_ns)


def one_by_one(lines: list[str], node: str = "n1") -> int:
    """check_all's promise, from check(): the latest timestamp, 0 if a line is refused."""
    stamps = [VALIDATOR.check(line, node, NOW, LIMITS.max_future_ns, LIMITS.max_age_ns)
              for line in lines]
    return 0 if any(verdict for _, verdict in stamps) else max(ts for ts, _ in stamps)


@settings(max_examples=300, deadline=None)
@given(st.lists(records(valid=True), min_size=1, max_size=6))
def test_a_batch_of_canonical_lines_passes_the_fast_check_at_once(batch):
    lines = [line_path(r) for r in batch]
    # What the fast check leaves to check(): newlines in strings, floats near the
    # double's limit (e+308).
    assume(all("\n" not in line and "e+308" not in line for line in lines))
    assert check_all(lines) == one_by_one(lines) == max(r.time_ns for r in batch)


@settings(max_examples=600, deadline=None)
@given(st.lists(records(valid=True), min_size=1, max_size=4), st.integers(0, 3),
       st.integers(0, 200), st.sampled_from(["insert", "delete", "replace"]),
       st.characters(codec="utf-8", exclude_categories=("Cs",)))
def test_the_fast_check_accepts_only_what_check_accepts(batch, which, where, how, char):
    lines = [line_path(r) for r in batch]
    line = lines[which % len(lines)]
    at = where % (len(line) + 1)
    lines[which % len(lines)] = {"insert": line[:at] + char + line[at:],
                                 "delete": line[:at] + line[at + 1:],
                                 "replace": line[:at] + char + line[at + 1:]}[how]
    fast = check_all(lines)
    assert fast in (0, one_by_one(lines))


def test_the_fast_check_leaves_doubtful_batches_to_check():
    line = f"synthetic,node=n1,stream=0 n=1i,value=0.5 {NOW}"
    assert check_all([line, line]) == NOW
    assert check_all([line + "\n" + line]) == 0                # two lines in one
    assert check_all([line, line.replace("node=n1", "node=n2")]) == 0
    assert check_all([line], node="n") == 0                    # n is a prefix of n1
    assert check_all([line.replace(f" {NOW}", f" {NOW + 7200 * 10**9}")]) == 0
    assert check_all([line.replace(f" {NOW}", " 1700")]) == 0  # short: check() decides
    string = f'gloo_phase,job=j,node=n1,phase=p,rank=0 peer="a\nb" {NOW}'
    assert check_all([string]) == 0 and one_by_one([string]) == NOW
