"""Hostile NCCL log lines: no input raises out of the parser or the log source, a bad
line is counted `garbled` (or another outcome), and the good lines around it always
come through (property-tested over the fixture's real NCCL lines)."""

from __future__ import annotations

import re
from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabricscope.agent.probes.base import Clock, ProbeContext
from fabricscope.agent.probes.nccl.log_source import NcclLogSource
from fabricscope.agent.probes.nccl.logparse import GARBLED, RECORD, parse_line
from tests.unit.test_nccl_logparse import NOW, fixture_lines

#: fixture lines that make a record, each with at least one number in it
GOOD = [ln for ln in fixture_lines() if parse_line(ln, NOW)[0] == RECORD and re.search(r"\d", ln)]
DIGITS = re.compile(r"\d+")


def test_a_number_of_over_4300_digits_is_garbled_not_an_exception():
    line = "h:1:2 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x1 recvbuff 0x2 count " \
           + "9" * 5000 + " datatype 7 op 0 root 0 comm 0x3 [nranks=2] stream 0x4"
    assert parse_line(line, NOW) == (GARBLED, [])
    big_pid = "h:" + "1" * 4400 + ":2 [0] x.cc:3 NCCL WARN boom"
    assert parse_line(big_pid, NOW) == (GARBLED, [])
    # inside int64 it still parses; one past is garbled, as InfluxDB could not store it
    assert parse_line(line.replace("9" * 5000, str(2**63 - 1)), NOW)[0] in (RECORD, GARBLED)
    assert parse_line(line.replace("9" * 5000, str(2**63)), NOW) == (GARBLED, [])


def corrupted(line: str, which: int, replacement: str) -> str:
    """`line` with its which-th digit run (modulo their number) replaced."""
    runs = list(DIGITS.finditer(line))
    m = runs[which % len(runs)]
    return line[:m.start()] + replacement + line[m.end():]


replacements = st.one_of(
    st.integers(4301, 20000).map(lambda n: "7" * n),          # over Python's int limit
    st.integers(2**63, 2**80).map(str),                       # outside int64
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),   # anything
)


#: launcher and shipper prefixes seen before NCCL's own (see nccl_fixtures/golden)
PREFIXES = ["", "(RayTrainWorker pid=615, ip=10.72.7.6) ", "[rank0]:", "[1,3]<stdout>:",
            "worker-0: ", "  | 2024-12-04T05:27:48.128Z | "]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(before=st.sampled_from(GOOD), bad=st.sampled_from(GOOD), after=st.sampled_from(GOOD),
       which=st.integers(0, 30), replacement=replacements, prefix=st.sampled_from(PREFIXES))
def test_good_lines_around_a_bad_one_always_come_through(tmp_path, before, bad, after, which,
                                                         replacement, prefix):
    before, after = prefix + before, prefix + after
    hostile = corrupted(prefix + bad, which, replacement).replace("\n", " ").replace("\r", " ")
    path = tmp_path / "nccl.log"
    path.write_text("")
    src = NcclLogSource(ProbeContext("n", frozenset(), Clock(), SimpleNamespace()),
                        paths=[str(path)], rescan_s=0)
    src.attach()
    try:
        counts0 = {k: v for k, v in src.stats().items() if k.startswith("lines_")}
        with open(path, "a") as fh:
            fh.write(f"{before}\n{hostile}\n{after}\n")
        records = src.poll()
        counts = {k: v - counts0.get(k, 0) for k, v in src.stats().items()
                  if k.startswith("lines_")}
    finally:
        src.detach()
    hostile_outcome = parse_line(hostile, NOW)[0]
    hostile_records = len(parse_line(hostile, NOW)[1])
    expected = parse_line(before, NOW)[1] + parse_line(after, NOW)[1]
    got = [(r.measurement, r.tags, r.fields) for r in records]
    # both good lines' records are there, whatever the middle line did; every line counted
    assert len(records) == len(expected) + hostile_records
    assert all((r.measurement, r.tags, r.fields) in got for r in expected)
    assert sum(counts.values()) == 3 and counts[f"lines_{hostile_outcome}"] >= 1
