"""The shape of an alert in the catalog: conditions, texts, runbook and test cases.

An `Alert` is one name (`Fabricscope<Condition>`) with one or more `Rule`s, each a
PromQL condition in one severity band; its summary and description are Python
format strings over the alert's labels (surface/alerting/templates.py turns them into Go
templates for Prometheus and renders them for the promtool tests). `Case`s are the
promtool unit tests of the alert: input series, a time, and the alerts that must
be firing then (none: it stays quiet).
"""

from __future__ import annotations

from dataclasses import dataclass

SEVERITIES = ("info", "warning", "critical")
#: a rule without a fixed band: the finding's own `severity` label passes through
FROM_FINDING = "from_finding"
#: the severity of the meta alert that holds info alerts back (it never pages)
NONE = "none"

#: Grafana boards an alert sends its reader to: key -> (uid, title), as
#: surface/grafana/boards.py and boards_ops.py build them
BOARDS = {
    "job": ("fabricscope-job", "fabricscope / Training job"),
    "fabric": ("fabricscope-fabric", "fabricscope / Fabric"),
    "collectives": ("fabricscope-collectives", "fabricscope / Collectives"),
    "topology": ("fabricscope-topology", "fabricscope / Topology"),
    "pipeline": ("fabricscope-pipeline", "fabricscope / Pipeline"),
}


def board(key: str) -> str:
    """How a runbook names a board."""
    return f"Board *{BOARDS[key][1]}*"


@dataclass(frozen=True)
class Rule:
    """One alerting rule of an alert: a condition and its band."""

    expr: str
    for_: str
    severity: str                  # info | warning | critical | FROM_FINDING | NONE
    summary: str = ""              # empty: the alert's
    description: str = ""          # empty: the alert's
    #: names the condition among the alert's rules of one band (label `signal`):
    #: rules of one name and the same labels would be duplicates to Prometheus
    signal: str = ""

    def __post_init__(self) -> None:
        if self.severity not in (*SEVERITIES, FROM_FINDING, NONE):
            raise ValueError(f"unknown severity {self.severity!r}")


@dataclass(frozen=True)
class Runbook:
    """What an operator reads behind the alert's runbook_url."""

    meaning: str                   # what fired and why it matters
    confirm: tuple[str, ...]       # steps, with fabricscope's own commands and boards
    change: tuple[str, ...]        # what to change, most likely first


@dataclass(frozen=True)
class Expect:
    """An alert a case expects firing: its labels (alertname aside), the rule whose
    annotations it carries (index into Alert.rules) and the value $value renders."""

    labels: dict[str, str]
    rule: int = 0
    value: float = 1.0


@dataclass(frozen=True)
class Case:
    """One promtool test: series (selector -> promtool values, 1 s apart), an
    evaluation time, and every alert of this name firing then."""

    name: str
    series: dict[str, str]
    at: str
    expect: tuple[Expect, ...] = ()

    @property
    def quiet(self) -> bool:
        return not self.expect


@dataclass(frozen=True)
class Alert:
    name: str
    group: str                     # the rule group (surface/alerting/rules.py)
    summary: str
    description: str
    rules: tuple[Rule, ...]
    runbook: Runbook
    board: str                     # key of BOARDS: the Grafana board to open
    cases: tuple[Case, ...]
    causes: tuple[str, ...] = ()   # finding causes it pages on

    @property
    def anchor(self) -> str:
        """The heading's anchor in docs/runbooks.md (GitHub lower-cases a heading)."""
        return self.name.lower()

    def summary_of(self, rule: Rule) -> str:
        return rule.summary or self.summary

    def description_of(self, rule: Rule) -> str:
        return rule.description or self.description


def static_labels(rule: Rule) -> dict[str, str]:
    """The labels a rule adds to its alerts (a finding's severity is its own)."""
    out = {} if rule.severity == FROM_FINDING else {"severity": rule.severity}
    return out | ({"signal": rule.signal} if rule.signal else {})
