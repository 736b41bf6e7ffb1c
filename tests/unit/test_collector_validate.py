"""fabricscope.collector.validate: what is written, what is refused, with which reason (no server)."""

import pytest

from fabricscope.collector.validate import REASONS, Limits, check_batch, schema_reason
from fabricscope import schema
from fabricscope.records import Record
from fabricscope.wire import make_batch, record_to_pb

NOW = 1_800_000_000_000_000_000
LIMITS = Limits(max_future_ns=3600 * 10**9, max_age_ns=7 * 86400 * 10**9)
TAGS = {"saddr": "198.18.0.1", "daddr": "198.18.0.2", "sport": "1", "dport": "2",
        "state": "ESTABLISHED"}


def tcp(time_ns=NOW, **tags) -> Record:
    return Record("tcp_retransmit", time_ns, {**TAGS, **tags}, {"segs": 1})


def check(records, **batch):
    args = {"node": "n1", "agent_id": "a", "seq": 1, **batch}
    return check_batch(make_batch(records=records, **args), NOW, LIMITS)


def test_valid_records_become_lines_with_the_node_tag():
    out = check([tcp(), tcp(NOW + 1)])
    assert out.lines == [
        "tcp_retransmit,daddr=198.18.0.2,dport=2,node=n1,saddr=198.18.0.1,sport=1,"
        f"state=ESTABLISHED segs=1i {NOW + i}" for i in (0, 1)]
    assert (out.rejected_count, out.max_time_ns, out.batch_error) == (0, NOW + 1, "")


def test_int_values_of_float_fields_are_written_as_float():
    out = check([Record("train_step", NOW, {"job": "j", "rank": "0"}, {"step": 3, "seconds": 2})])
    assert out.lines == [f"train_step,job=j,node=n1,rank=0 seconds=2.0,step=3i {NOW}"]


@pytest.mark.parametrize("record,reason,detail", [
    (Record("nope", NOW, {}, {"x": 1}), "unknown_measurement", "unknown measurement 'nope'"),
    (tcp(node="other"), "node_mismatch", "tag node='other' in a batch from node 'n1'"),
    (tcp(extra="x"), "unknown_tag", "unknown tag 'extra'"),
    (Record("tcp_retransmit", NOW, {"saddr": "a"}, {"segs": 1}), "missing_tag", "missing tag"),
    (Record("tcp_retransmit", NOW, TAGS, {"segs": 1, "x": 2}), "unknown_field", "'x'"),
    (Record("tcp_retransmit", NOW, TAGS, {"segs": "1"}), "field_type", "must be int"),
    (Record("tcp_retransmit", NOW, TAGS, {}), "no_fields", "no fields"),
    (tcp(time_ns=-1), "bad_time", "must be positive"),
    (tcp(time_ns=NOW + 3601 * 10**9), "time_future", "3601 s in the future"),
    (tcp(time_ns=NOW - 8 * 86400 * 10**9), "time_past", "691200 s in the past"),
    (tcp(state="A\\B"), "unencodable", "contains"),
    (tcp(state=""), "unencodable", "empty"),
])
def test_each_invalid_record_is_refused_with_its_reason(record, reason, detail):
    out = check([tcp(), record, tcp(NOW + 5)])
    assert out.rejected == {reason: 1}
    assert len(out.lines) == 2                      # valid neighbours still written
    assert out.first_problem.startswith("record 1: ") and detail in out.first_problem
    assert reason in REASONS


def test_time_window_edges_are_accepted():
    out = check([tcp(NOW + 3600 * 10**9), tcp(NOW - 7 * 86400 * 10**9)])
    assert out.rejected_count == 0 and len(out.lines) == 2


def test_field_without_value_is_refused():
    batch = make_batch(node="n1", agent_id="a", seq=1, records=[tcp()])
    msg = batch.records.add()
    record_to_pb(tcp(), msg)
    msg.fields["segs"].Clear()
    out = check_batch(batch, NOW, LIMITS)
    assert out.rejected == {"no_value": 1} and len(out.lines) == 1


@pytest.mark.parametrize("batch,reason,detail", [
    (dict(schema_version=99), "schema_version", "schema_version 99 is not the collector's"),
    (dict(node=""), "bad_batch", "no node"),
    (dict(seq=0), "bad_batch", "seq must be > 0"),
])
def test_batch_level_problems_refuse_every_record(batch, reason, detail):
    out = check([tcp(), tcp()], **batch)
    assert out.lines == [] and out.rejected == {reason: 2}
    assert detail in out.batch_error


def test_empty_batch_is_valid():
    out = check([])
    assert (out.lines, out.rejected_count, out.batch_error) == ([], 0, "")


def test_every_schema_error_maps_to_a_specific_reason():
    # Guards the message matching in schema_reason against wording changes in schema.py.
    cases = {"unknown_measurement": Record("x", 1, {}, {"a": 1}),
             "bad_time": tcp(time_ns=0, node="n"),
             "unknown_tag": tcp(node="n", zzz="1"),
             "missing_tag": Record("tcp_retransmit", 1, {"node": "n"}, {"segs": 1}),
             "no_fields": Record("tcp_retransmit", 1, {**TAGS, "node": "n"}, {}),
             "unknown_field": Record("tcp_retransmit", 1, {**TAGS, "node": "n"}, {"q": 1}),
             "field_type": Record("tcp_retransmit", 1, {**TAGS, "node": "n"}, {"segs": 0.5})}
    for reason, record in cases.items():
        with pytest.raises(schema.SchemaError) as err:
            schema.validate(record)
        assert schema_reason(err.value) == reason

