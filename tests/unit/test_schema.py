"""fabricscope.schema: validation errors, and docs/SCHEMA.md rendered from it."""

from pathlib import Path

import pytest

from fabricscope import schema
from fabricscope.records import Record
from fabricscope.schema import SchemaError, validate

ROOT = Path(__file__).resolve().parents[2]
TCP_TAGS = {"node": "n1", "saddr": "198.18.0.1", "daddr": "198.18.0.2", "sport": "40000",
            "dport": "5201", "state": "ESTABLISHED"}


def good(**changes) -> Record:
    record = Record("tcp_retransmit", 1_700_000_000_000_000_000, dict(TCP_TAGS), {"segs": 1})
    for key, value in changes.items():
        setattr(record, key, value)
    return record


def test_valid_records_pass():
    validate(good())
    validate(Record("train_step", 5, {"node": "n", "job": "j", "rank": "0"},
                    {"step": 3, "seconds": 0.5}))
    # an int is accepted where a float is declared (the collector converts it)
    validate(Record("train_step", 5, {"node": "n", "job": "j", "rank": "0"}, {"seconds": 2}))


@pytest.mark.parametrize("record,message", [
    (good(measurement="nope"), "unknown measurement 'nope'"),
    (good(time_ns=0), "tcp_retransmit: time_ns must be positive"),
    (good(time_ns=-5), "time_ns must be positive"),
    (good(tags={**TCP_TAGS, "extra": "x"}), "tcp_retransmit: unknown tag 'extra'"),
    (good(tags={k: v for k, v in TCP_TAGS.items() if k != "dport"}), "missing tag 'dport'"),
    (good(tags={k: v for k, v in TCP_TAGS.items() if k != "node"}), "missing tag 'node'"),
    (good(fields={}), "tcp_retransmit: no fields"),
    (good(fields={"segs": 1, "bytes": 2}), "unknown field 'bytes'"),
    (good(fields={"segs": 1.0}), "field 'segs' must be int"),
    (good(fields={"segs": True}), "field 'segs' must be int"),
    (good(fields={"segs": "1"}), "field 'segs' must be int"),
    (Record("train_step", 5, {"node": "n", "job": "j", "rank": "0"}, {"seconds": True}),
     "field 'seconds' must be float"),
])
def test_invalid_records_name_the_first_problem(record, message):
    with pytest.raises(SchemaError) as err:
        validate(record)
    assert message in str(err.value)


def test_every_measurement_is_documented_completely():
    for m in schema.measurements().values():
        assert m.doc and m.source and m.fields, m.name
        assert all(f.doc and f.type in (int, float, str, bool)
                   for f in m.fields.values()), m.name
        assert set(m.optional_tags) <= set(m.all_tags()), m.name
        assert "node" in m.all_tags()


def test_docs_schema_md_is_current():
    path = ROOT / "docs" / "SCHEMA.md"
    assert path.exists(), "docs/SCHEMA.md is missing; fix: make docs"
    assert path.read_text() == schema.render_markdown(), \
        "docs/SCHEMA.md is stale (the schema changed); fix: make docs"
    for name in schema.measurements():
        assert f"## `{name}`" in path.read_text()
