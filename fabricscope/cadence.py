"""Periodic work aligned to the wall clock, so that the stages of the pipeline meet.

Every agent polls just after each second begins: the NIC probe's window of the
second before has closed at the boundary, and the tcp probe cuts its window there,
so a node's records of one second (its nic_window and its tcp_flow and tcp_node
windows) cover the same second and leave together. The collector's diagnosis reads
the store once those batches have landed. Run at free phases, each stage waited
for the next for half a period on average (agent poll, then engine tick): about a
second added to every finding, and a window's last second often read half in.
Hosts keep their clocks in step (NTP/PTP) as the collector's agent_lag already
assumes; a host whose clock is off only loses the alignment, never data.
"""

from __future__ import annotations

import time


#: a wait shorter than this share of the period goes on to the instant after: a sleep
#: timed on the monotonic clock can end a hair before the wall clock's instant (NTP
#: slews the wall clock by up to 0.5 ms a second), and the work must not run twice
EARLY_SHARE = 0.01


def until_next(period_s: float, offset_s: float, now_s: float | None = None) -> float:
    """Seconds from now_s (the wall clock when None) to the next instant
    k * period_s + offset_s after it (k an integer), at least EARLY_SHARE of the
    period away (else the one after)."""
    now_s = time.time() if now_s is None else now_s
    wait = period_s - (now_s - offset_s) % period_s
    return wait if wait >= EARLY_SHARE * period_s else wait + period_s
