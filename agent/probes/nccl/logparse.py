"""Parse NCCL_DEBUG=INFO output into typed facts and records: pure functions, no I/O.

A line is NCCL's when it carries NCCL's prefix (logparse_prefix: `host:pid:tid [dev]
NCCL INFO ...`, anywhere after a launcher's or log shipper's text) or is the bare
`NCCL version ...` line older releases print. Its message is read by the first
reader that knows its form (logparse_topology, logparse_net, logparse_settings;
each names the NCCL format strings it follows) into facts (logparse_facts), and
each fact becomes one record (logparse_records). A "Trees" line gives one fact per
channel.

Outcomes: `record` (one or more facts), `ignored` (an NCCL line of a kind not
read), `foreign` (not NCCL's), `garbled` (an NCCL line of a kind read whose text
or numbers do not fit it), `blank`. Nothing here raises on bad input.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from fabricscope.agent.probes.nccl import logparse_net as net
from fabricscope.agent.probes.nccl import logparse_settings as settings
from fabricscope.agent.probes.nccl import logparse_topology as topology
from fabricscope.agent.probes.nccl.logparse_prefix import (
    Garbled, Launcher, LogLine, parse_timestamp, read_launcher, split_line)
from fabricscope.agent.probes.nccl.logparse_records import to_record
from fabricscope.records import Record

__all__ = ["BLANK", "FOREIGN", "GARBLED", "IGNORED", "RECORD", "Outcome", "Parsed",
           "parse_facts", "parse_line", "parse_timestamp", "split_line"]


class Outcome(StrEnum):
    RECORD = "record"
    IGNORED = "ignored"
    FOREIGN = "foreign"
    GARBLED = "garbled"
    BLANK = "blank"


RECORD, IGNORED, FOREIGN, GARBLED, BLANK = (Outcome.RECORD, Outcome.IGNORED, Outcome.FOREIGN,
                                            Outcome.GARBLED, Outcome.BLANK)


@dataclass(frozen=True)
class Parsed:
    """One line read: its outcome, its prefix (None for a bare version line or a line
    not NCCL's), the launcher its head names, and its facts."""

    outcome: Outcome
    line: LogLine | None = None
    launcher: Launcher | None = None
    facts: tuple = ()


def _info_facts(msg: str) -> list | None:
    """Facts of an INFO message; None when no reader knows its form."""
    if msg.startswith("Channel "):
        got = topology.channel(msg)
        if got is None:
            raise Garbled("Channel line")
        return got
    if msg.startswith("Ring "):
        got = topology.ring(msg)
        if got is None and not ("<-" in msg or "[" in msg):   # TRACE-only P2P ring lines
            raise Garbled("Ring line")
        return got
    if msg.startswith("Trees"):
        return topology.trees(msg)
    if msg.startswith("Tree "):
        return topology.tree(msg)
    for reader in (topology.coll, topology.comm, net.network, settings.setting, net.error_trace):
        got = reader(msg)
        if got is not None:
            return got
    return None


def _read(text: str) -> Parsed:
    ll = split_line(text)
    if ll is None:
        m = settings.VERSION.search(text)
        if m is None:
            return Parsed(FOREIGN)
        head = text[:m.start()].strip()
        return Parsed(RECORD, None, read_launcher(head), tuple(settings.version(m)))
    if ll.level == "WARN":
        return Parsed(RECORD, ll, ll.launcher, tuple(net.warn(ll)))
    facts = _info_facts(ll.message) if ll.level == "INFO" else None
    if not facts:
        return Parsed(IGNORED, ll, ll.launcher)
    return Parsed(RECORD, ll, ll.launcher, tuple(facts))


def parse_facts(text: str) -> Parsed:
    """The facts of one line. Never raises: a line whose text or numbers do not fit
    its kind is GARBLED."""
    if not text.strip():
        return Parsed(BLANK)
    try:
        return _read(text.rstrip("\r\n"))
    except (Garbled, ValueError):
        return Parsed(GARBLED)


def parse_line(text: str, now_ns: int) -> tuple[Outcome, list[Record]]:
    """(outcome, records) for one line; `now_ns` stamps lines without a timestamp."""
    parsed = parse_facts(text)
    try:
        return parsed.outcome, [to_record(fact, parsed.line, parsed.launcher, now_ns)
                                for fact in parsed.facts]
    except Garbled:
        return GARBLED, []
