"""Drop reasons from tracepoint skb/kfree_skb: names, layout, attribution, deltas.

The tracepoint's record (format file) has `reason` (enum skb_drop_reason) but no
interface and no network namespace, and reading the skb's device would mean
reading kernel structs. So the counts are host-wide and only an agent in the
initial network namespace (the host's) reports them; an agent inside a
namespace (a lab node) skips them, because every node's agent would report the
same host-wide drops. Reason names come from the format's __print_symbolic
table, so they match the running kernel, not the headers. SKB_CONSUMED (a
normal free) is not a drop and is not reported.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

FORMAT = Path("/sys/kernel/tracing/events/skb/kfree_skb/format")
NOT_DROPS = {"NOT_DROPPED_YET", "CONSUMED"}
_FIELD = re.compile(r"field:[^;]*\breason;\s*offset:(\d+);\s*size:(\d+);")
_SYMBOL = re.compile(r"\{\s*(\d+)\s*,\s*\"(\w+)\"\s*\}")


def reason_layout(text: str) -> tuple[int, dict[int, str]] | None:
    """(offset of the 4-byte `reason` field, {value: name}) from the format text, or
    None when the tracepoint has no 4-byte reason (kernels before 5.17)."""
    match = _FIELD.search(text)
    if match is None or int(match.group(2)) != 4:
        return None
    fmt = text[text.find("print fmt:"):]
    return int(match.group(1)), {int(v): name for v, name in _SYMBOL.findall(fmt)}


def read_layout(path: Path = FORMAT) -> tuple[int, dict[int, str]] | None:
    try:
        return reason_layout(path.read_text())
    except OSError:
        return None


#: the fixed inode number of the initial network namespace (PROC_NET_INIT_INO, Linux 6.x)
NET_INIT_INO = 0xEFFFFFF9


def in_initial_netns(self_ns: str = "/proc/self/ns/net", init_ns: str = "/proc/1/ns/net") -> bool:
    """True when this process is in the host's network namespace: the one of PID 1 (`ip
    netns exec` keeps the host's PID namespace), or, where PID 1's is not readable
    (sandboxes deny it even to root), the one with the initial namespace's fixed inode."""
    try:
        own = os.stat(self_ns).st_ino
    except OSError:
        return False
    try:
        return own == os.stat(init_ns).st_ino
    except OSError:
        return own == NET_INIT_INO


class DropCounts:
    """Per-reason growth of the per-CPU drop counters between reads."""

    def __init__(self, names: dict[int, str], other_slot: int):
        self.names = dict(names)
        self.other_slot = other_slot
        self._prev: dict[int, int] = {}

    def name(self, slot: int) -> str:
        return "OTHER" if slot == self.other_slot else self.names.get(slot, f"REASON_{slot}")

    def update(self, totals: list[int]) -> dict[str, int]:
        """totals[slot] = sum over CPUs; returns {reason name: drops since last update}."""
        out: dict[str, int] = {}
        for slot, total in enumerate(totals):
            grown = total - self._prev.get(slot, 0)
            self._prev[slot] = total
            name = self.name(slot)
            if grown > 0 and name not in NOT_DROPS:
                out[name] = out.get(name, 0) + grown
        return out
