"""Every fabricscope alert, as data: the one list the rules, their promtool tests,
the runbooks, the Alertmanager example and the dashboards are made from.

    from fabricscope.surface.alerting.catalog import ALERTS, runbook_url
    for alert in ALERTS:
        alert.name, alert.rules[0].expr, alert.causes, runbook_url(alert)

Names follow kubernetes-mixin: `Fabricscope<Condition>`. Severity comes in three
bands (info, warning, critical) that never fire together for one condition: a
rule on a finding passes the finding's own severity through, other rules have one
fixed band each. Info alerts are context: FabricscopeInfoInhibitor holds them back
unless a warning or critical alert fires for the same job at the same place.
"""

from __future__ import annotations

from fabricscope.diagnosis.causes import Cause
from fabricscope.surface.alerting.cases import OPEN
from fabricscope.surface.alerting.finding_alerts import FINDING_ALERTS, GROUP as FINDINGS_GROUP
from fabricscope.surface.alerting.finding_alerts import MICROBURST, NETWORK_BOUND
from fabricscope.surface.alerting.pipeline_alerts import PIPELINE_ALERTS
from fabricscope.surface.alerting.trend_alerts import TREND_ALERTS
from fabricscope.surface.alerting.model import BOARDS, NONE, Alert, Case, Expect, Rule, Runbook
from fabricscope.surface.alerting.promql import FindingSeries
from fabricscope.surface.yamlout import generated_header

#: Where docs/runbooks.md is published; every runbook_url is this plus `#<anchor>`.
#: `python -m fabricscope.surface.alerting --runbook-base URL` renders a copy for another home.
RUNBOOK_BASE = "https://github.com/fabricscope/fabricscope/blob/main/docs/runbooks.md"
#: the first lines of every YAML file made from this list
GENERATED = generated_header("python -m fabricscope.surface.alerting", "surface/alerting/catalog.py",
                             "what the catalog renders")


_FABRICSCOPE = 'alertname=~"Fabricscope.+"'
_PAGING = f'ALERTS{{{_FABRICSCOPE}, alertstate="firing", severity=~"warning|critical"}}'
_INFO = f'max without(alertstate) (ALERTS{{{_FABRICSCOPE}, severity="info", node%s""}})'
# Pending info alerts count too, so the inhibitor is in place before its info alert
# can fire; only firing warnings and criticals release it.
_INFO_INHIBITOR = f"""\
(
  {_INFO % "!="}
  unless on(job, node)
  {_PAGING}
)
or
(
  {_INFO % "="}
  unless on(job)
  {_PAGING}
)
"""


def _inhibitor_cases() -> tuple[Case, ...]:
    node1 = FindingSeries(Cause.MICROBURST, "info", node="node1", interface="eth0", tor="tor0",
                          id="c1b2c3d4e5f6")
    node2 = FindingSeries(Cause.MICROBURST, "info", node="node2", interface="eth0", tor="tor0",
                          id="c2b2c3d4e5f6")
    lossy = FindingSeries(Cause.LOSSY_LINK, "warning", node="node1", interface="eth0", tor="tor0",
                          id="a1b2c3d4e5f6")
    bound = FindingSeries(Cause.NETWORK_BOUND, "info", id="d1b2c3d4e5f6")
    other_job = FindingSeries(Cause.NETWORK_BOUND, "info", job="train-b", id="d2b2c3d4e5f6")

    def held(*findings: FindingSeries) -> tuple[Expect, ...]:
        return tuple(Expect(f.labels(NONE)) for f in findings)

    return (
        Case("an info alert alone, still pending", {node1.series(): OPEN}, at="5s",
             expect=held(node1)),
        Case("an info alert alone, firing", {node1.series(): OPEN}, at="20s",
             expect=held(node1)),
        Case("a warning at the same node releases it",
             {node1.series(): OPEN, lossy.series(): OPEN}, at="20s"),
        Case("a warning at another node does not",
             {node2.series(): OPEN, lossy.series(): OPEN}, at="20s", expect=held(node2)),
        Case("a job-wide info alert alone", {bound.series(): OPEN}, at="20s",
             expect=held(bound)),
        Case("any warning of the job releases a job-wide info alert",
             {bound.series(): OPEN, lossy.series(): OPEN}, at="20s"),
        Case("a warning of another job does not",
             {other_job.series(): OPEN, lossy.series(): OPEN}, at="20s",
             expect=held(other_job)),
    )


INFO_INHIBITOR = Alert(
    "FabricscopeInfoInhibitor", FINDINGS_GROUP,
    "Info alerts at {place} in job {job} held back",
    "No warning or critical alert fires for job {job} at {place}, so Alertmanager holds "
    "back the info alert there ({cause}). Meta alert: it never pages.",
    rules=(Rule(_INFO_INHIBITOR, "0s", NONE),),
    runbook=Runbook(
        "Not a problem to act on. Info alerts (FabricscopeMicroburst, "
        "FabricscopeNetworkBound) describe the normal shape of training; they matter as "
        "context of a warning or critical alert at the same place. This alert fires for "
        "every info alert without one, and Alertmanager's inhibit rule mutes the info "
        "alert it names. Its route goes to a receiver that notifies nobody. A place is a "
        "node of a job; an info alert without a node (job-wide) is released by any "
        "warning or critical alert of its job.",
        ("Alertmanager's UI (or `amtool alert query --inhibited`): the info alerts it "
         "holds back.",),
        ("Nothing. To see info alerts on their own, silence this alert.",),
    ),
    board="job",
    cases=_inhibitor_cases())

__all__ = ["ALERTS", "BOARDS", "INFO_ALERTS", "RUNBOOK_BASE", "by_name", "paged_causes",
           "runbook_url"]

#: In rule-group order: an info alert precedes the inhibitor in its group, so the
#: inhibitor sees it in the same evaluation.
ALERTS: tuple[Alert, ...] = FINDING_ALERTS + (INFO_INHIBITOR,) + TREND_ALERTS + PIPELINE_ALERTS

INFO_ALERTS = (MICROBURST, NETWORK_BOUND)

def runbook_url(alert: Alert, base: str = RUNBOOK_BASE) -> str:
    return f"{base}#{alert.anchor}"


def by_name(name: str) -> Alert:
    for alert in ALERTS:
        if alert.name == name:
            return alert
    raise KeyError(name)


def paged_causes() -> dict[str, str]:
    """finding cause -> the alert that pages on it"""
    return {cause: a.name for a in ALERTS for cause in a.causes}
