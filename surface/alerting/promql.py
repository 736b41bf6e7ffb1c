"""PromQL pieces the catalog's rules share, and the series its test cases feed them."""

from __future__ import annotations

from dataclasses import dataclass

from fabricscope.surface.metrics import FINDING_ACTIVE, FINDING_LABELS, REPLICA_LABELS


def across_replicas(expr: str) -> str:
    """One series per finding or job, whichever collector replica exports it now: the
    owner changes when replicas come and go, the finding's labels do not."""
    return f"max without({', '.join(REPLICA_LABELS)}) ({expr})"


def cause_matcher(causes: tuple[str, ...]) -> str:
    return f'cause="{causes[0]}"' if len(causes) == 1 else f'cause=~"{"|".join(causes)}"'


def finding_open(*causes: str) -> str:
    """An open finding of these causes, one alert per finding."""
    return f"{across_replicas(f'{FINDING_ACTIVE}{{{cause_matcher(causes)}}}')} > 0"


def selector(metric: str, labels: dict[str, str]) -> str:
    """A promtool series: metric{label="value",...}, in the order given."""
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{metric}{{{inner}}}"


@dataclass(frozen=True)
class FindingSeries:
    """A `fabricscope_finding_active` series as a collector replica exports it."""

    cause: str
    severity: str
    job: str = "train-a"
    node: str = ""
    interface: str = ""
    peer: str = ""
    tor: str = ""
    rank: str = ""
    id: str = "f0c0ffee0001"

    def series(self, instance: str = "collector-0") -> str:
        labels = {k: getattr(self, k) for k in FINDING_LABELS}
        return selector(FINDING_ACTIVE, {**labels, "instance": instance})

    def labels(self, severity: str | None = None) -> dict[str, str]:
        """The labels of the alert it raises: empty place parts and replicas gone; a
        rule with a fixed band overrides the severity."""
        out = {k: getattr(self, k) for k in FINDING_LABELS if getattr(self, k)}
        if severity:
            out["severity"] = severity
        return out
