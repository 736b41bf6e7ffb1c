"""promtool cases every rule on a finding needs: it fires once the finding has been
open for the rule's `for`, stays quiet before that, resolves when the finding
closes, and ignores findings of other causes."""

from __future__ import annotations

from fabricscope.diagnosis.causes import Cause
from fabricscope.surface.alerting.model import Case, Expect
from fabricscope.surface.alerting.promql import FindingSeries

#: samples 1 s apart; long enough for every evaluation time below
OPEN = "1x90"


def seconds(duration: str) -> int:
    """'15s' / '2m' -> seconds (the units the catalog uses)."""
    unit = {"s": 1, "m": 60}[duration[-1]]
    return int(duration[:-1]) * unit


def finding_cases(finding: FindingSeries, for_: str, *, rule: int = 0,
                  band: str | None = None, other_cause: Cause = Cause.INPUT_STALL) -> tuple[Case, ...]:
    """The four cases of a rule that pages on `finding`'s cause. `band`: the rule's
    fixed severity (None: the finding's own passes through)."""
    wait = seconds(for_)
    other = FindingSeries(other_cause, "critical", job=finding.job, node=finding.node or "node9",
                          id="f0c0ffee0999")
    return (
        Case(f"{finding.cause} finding open for longer than {for_}", {finding.series(): OPEN},
             at=f"{wait + 5}s", expect=(Expect(finding.labels(band), rule=rule),)),
        Case(f"{finding.cause} finding open for less than {for_}", {finding.series(): OPEN},
             at=f"{max(wait // 2, 1)}s"),
        Case(f"{finding.cause} finding closed", {finding.series(): "1x20 stale"},
             at=f"{20 + wait + 10}s"),
        Case(f"only a {other_cause} finding open", {other.series(): OPEN}, at=f"{wait + 5}s"),
    )
