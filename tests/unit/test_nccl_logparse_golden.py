"""Golden fixtures: real NCCL_DEBUG excerpts from public threads (tests/unit/nccl_fixtures/
golden/*.log, each naming its sources and NCCL versions) and beside each the facts a
careful reader takes from every line (*.json). The parser's facts must equal them
exactly, and every record made from them must fit the schema."""

from __future__ import annotations

import dataclasses
import json
from enum import Enum
from pathlib import Path

import pytest

from fabricscope.agent.probes.nccl.logparse import parse_facts, parse_line
from fabricscope import schema

GOLDEN = Path(__file__).parent / "nccl_fixtures" / "golden"
NOW = 1_800_000_000_000_000_000


def _plain(value):
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value):
        out = {"kind": _plain(value.kind)} if hasattr(value, "kind") else {}
        out.update({f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                    if getattr(value, f.name) is not None})
        return out
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def read_log(path: Path) -> list[dict]:
    """What the parser reads from each non-comment line of a fixture, as plain JSON."""
    out = []
    for text in path.read_text().splitlines():
        if text.startswith("#"):
            continue
        parsed = parse_facts(text)
        entry: dict = {"outcome": parsed.outcome.value}
        if parsed.line is not None:
            ll = parsed.line
            entry["prefix"] = {"host": ll.host, "pid": ll.pid, "tid": ll.tid, "dev": ll.cuda_dev,
                               "level": ll.level}
        if parsed.launcher is not None:
            entry["launcher"] = _plain(parsed.launcher)
        if parsed.facts:
            entry["facts"] = _plain(parsed.facts)
        out.append(entry)
    return out


@pytest.mark.parametrize("log", sorted(GOLDEN.glob("*.log")), ids=lambda p: p.stem)
def test_real_excerpts_give_exactly_the_golden_facts(log: Path):
    expected = json.loads(log.with_suffix(".json").read_text())
    assert read_log(log) == expected


@pytest.mark.parametrize("log", sorted(GOLDEN.glob("*.log")), ids=lambda p: p.stem)
def test_every_golden_fact_becomes_a_valid_record(log: Path):
    for text in log.read_text().splitlines():
        if text.startswith("#"):
            continue
        outcome, records = parse_line(text, NOW)
        assert outcome != "garbled", text
        for rec in records:
            rec.tags["node"] = "n1"
            schema.validate(rec)


if __name__ == "__main__":      # regenerate after a reviewed change: python -m ...
    for log in sorted(GOLDEN.glob("*.log")):
        log.with_suffix(".json").write_text(json.dumps(read_log(log), indent=1) + "\n")
