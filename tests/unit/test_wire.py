"""fabricscope.wire: Record <-> protobuf, every field type, through real bytes."""

import pytest

from fabricscope.records import Record
from fabricscope.schema import SCHEMA_VERSION
from fabricscope.wire import make_batch, pb, record_from_pb, record_to_pb

RECORDS = [
    Record("m", 1, {}, {"i": 42}),
    Record("m", 1_700_000_000_000_000_001, {"node": "n1", "saddr": "198.18.0.1"},
           {"i": -7, "f": 0.25, "s": "text \"q\" é\n", "b": True, "b0": False}),
    Record("m", 2, {"t": ""}, {"big": 2**63 - 1, "small": -2**63, "zero": 0, "fz": 0.0}),
    Record("m", 3, {}, {"empty": ""}),
]


@pytest.mark.parametrize("record", RECORDS)
def test_record_round_trip_through_bytes(record):
    data = record_to_pb(record).SerializeToString()
    back = record_from_pb(pb.Record.FromString(data))
    assert back == record
    # Types survive, not only values: 1 vs 1.0 vs True are different InfluxDB types.
    assert {k: type(v) for k, v in back.fields.items()} == \
        {k: type(v) for k, v in record.fields.items()}


def test_bool_is_not_int_and_int_is_not_float():
    msg = record_to_pb(Record("m", 1, {}, {"b": True, "i": 1, "f": 1.0}))
    assert msg.fields["b"].WhichOneof("kind") == "b"
    assert msg.fields["i"].WhichOneof("kind") == "i"
    assert msg.fields["f"].WhichOneof("kind") == "f"


def test_field_without_value_is_an_error():
    msg = pb.Record(measurement="m", time_ns=1)
    msg.fields["x"].SetInParent()
    with pytest.raises(ValueError, match="field 'x' has no value"):
        record_from_pb(msg)


def test_unsupported_value_type_is_an_error():
    with pytest.raises(TypeError, match="unsupported field value"):
        record_to_pb(Record("m", 1, {}, {"x": [1]}))


def test_make_batch_carries_every_header_field():
    batch = make_batch(node="n1", agent_id="boot-1", seq=7, records=RECORDS, dropped_before=3)
    back = pb.Batch.FromString(batch.SerializeToString())
    assert (back.schema_version, back.node, back.agent_id, back.seq, back.dropped_before) == \
        (SCHEMA_VERSION, "n1", "boot-1", 7, 3)
    assert [record_from_pb(r) for r in back.records] == RECORDS
    assert make_batch(node="n", agent_id="a", seq=1, records=[], schema_version=9) \
        .schema_version == 9


def test_ack_statuses_are_the_contract_values():
    assert (pb.Ack.OK, pb.Ack.REJECTED, pb.Ack.RETRY) == (0, 1, 2)
