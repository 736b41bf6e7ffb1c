"""fabricscope/cadence.py: waits to the next aligned instant."""

from __future__ import annotations

import pytest

from fabricscope.cadence import until_next


@pytest.mark.parametrize("now, period, offset, wait", [
    (100.50, 1.0, 0.02, 0.52),      # mid-second: to the next second's start + offset
    (101.005, 1.0, 0.02, 0.015),    # before the offset: the same second's
    (101.0195, 1.0, 0.02, 1.0005),  # woken a hair early: not twice in a row
    (101.02, 1.0, 0.02, 1.00),      # exactly on it: the next one, never 0
    (101.07, 1.0, 0.02, 0.95),      # a poll that took 50 ms: the next second's
    (100.10, 0.25, 0.0, 0.15),      # periods under a second: their own multiples
    (100.45, 1.0, 0.5, 0.05)])
def test_the_wait_ends_at_the_next_multiple_of_the_period_plus_the_offset(now, period,
                                                                          offset, wait):
    got = until_next(period, offset, now)
    assert got == pytest.approx(wait, abs=1e-9)
    assert period / 100 <= got <= period * 1.01
