"""fabricscope.lineproto: golden lines for escaping and value types, and refusals."""

import pytest

from fabricscope import lineproto
from fabricscope.lineproto import LineProtocolError, encode
from fabricscope.records import Record

GOLDEN = [
    # (record, expected line) -- expectations written from the InfluxDB line protocol reference
    (Record("cpu", 1, {}, {"value": 1}), "cpu value=1i 1"),
    (Record("cpu", 1_700_000_000_123456789, {"b": "2", "a": "1"}, {"x": 0.5}),
     "cpu,a=1,b=2 x=0.5 1700000000123456789"),
    (Record("my measure,x", 5, {}, {"f": True}), r"my\ measure\,x f=true 5"),
    (Record("m=eq", 5, {}, {"f": False}), "m=eq f=false 5"),   # '=' is literal in a measurement
    (Record("m", 5, {"tag key": "a,b=c d"}, {"f": 1.0}), r"m,tag\ key=a\,b\=c\ d f=1.0 5"),
    (Record("m", 5, {"k=1": "v"}, {"field,key x": 2}), r"m,k\=1=v field\,key\ x=2i 5"),
    (Record("m", 5, {}, {"s": 'say "hi" \\ bye'}), r'm s="say \"hi\" \\ bye" 5'),
    (Record("m", 5, {}, {"s": "two\nlines"}), 'm s="two\nlines" 5'),
    (Record("m", 5, {}, {"s": ""}), 'm s="" 5'),
    (Record("m", 5, {"t": "é中"}, {"s": "ü"}), 'm,t=é中 s="ü" 5'),
    (Record("m", 5, {}, {"big": 2**63 - 1, "small": -2**63}),
     "m big=9223372036854775807i,small=-9223372036854775808i 5"),
    (Record("m", 5, {}, {"f": 1e20, "g": 1.5e-7, "h": -0.0}), "m f=1e+20,g=1.5e-07,h=-0.0 5"),
    (Record("m", 5, {}, {"a": 1, "b": 1.0, "c": "1", "d": True}), 'm a=1i,b=1.0,c="1",d=true 5'),
]


@pytest.mark.parametrize("record,line", GOLDEN, ids=[g[1][:30] for g in GOLDEN])
def test_golden_lines(record, line):
    assert encode(record) == line


@pytest.mark.parametrize("record,message", [
    (Record("", 1, {}, {"f": 1}), "measurement is empty"),
    (Record("m", 1, {}, {}), "no fields"),
    (Record("m", 1, {"t": ""}, {"f": 1}), "tag value of 't' is empty"),
    (Record("m", 1, {"": "v"}, {"f": 1}), "tag key is empty"),
    (Record("m", 1, {}, {"": 1}), "field key is empty"),
    (Record("m", 1, {"t": "a\\b"}, {"f": 1}), "contains '\\\\'"),
    (Record("m\\", 1, {}, {"f": 1}), "measurement"),
    (Record("m", 1, {"t": "a\nb"}, {"f": 1}), "contains '\\n'"),
    (Record("m", 1, {"t": "a\tb"}, {"f": 1}), "contains '\\t'"),
    (Record("m", 1, {"time": "x"}, {"f": 1}), "'time' is reserved"),
    (Record("m", 1, {}, {"time": 1}), "'time' is reserved"),
    (Record("m", 1, {}, {"f": float("nan")}), "not a finite number"),
    (Record("m", 1, {}, {"f": float("inf")}), "not a finite number"),
    (Record("m", 1, {}, {"f": 2**63}), "outside int64"),
    (Record("m", 1, {}, {"f": None}), "unsupported value type NoneType"),
    (Record("m", 1.5, {}, {"f": 1}), "not an int64"),
    (Record("m", True, {}, {"f": 1}), "not an int64"),
])
def test_refuses_what_it_cannot_write_faithfully(record, message):
    with pytest.raises(LineProtocolError) as err:
        encode(record)
    assert message in str(err.value)


def test_encode_many_joins_lines_and_chunks_split():
    records = [Record("m", i + 1, {}, {"f": i}) for i in range(5)]
    assert lineproto.encode_many(records) == b"m f=0i 1\nm f=1i 2\nm f=2i 3\nm f=3i 4\nm f=4i 5"
    assert [len(c) for c in lineproto.chunks(list(range(12)), 5)] == [5, 5, 2]
    assert list(lineproto.chunks([], 5)) == []


def test_tags_and_fields_sorted_by_byte_order():
    line = encode(Record("m", 1, {"b": "1", "B": "2", "a": "3", "é": "4"},
                         {"z": 1, "Z": 2, "a": 3}))
    assert line == "m,B=2,a=3,b=1,é=4 Z=2i,a=3i,z=1i 1"
