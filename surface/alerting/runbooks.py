"""docs/runbooks.md from the catalog: one section per alert, its heading the alert's
name, so that `runbook_url` (base + '#' + name in lower case) lands on it."""

from __future__ import annotations

from fabricscope.surface.alerting.catalog import ALERTS
from fabricscope.surface.metrics import COLLECTOR_SCRAPE_JOB
from fabricscope.surface.alerting.model import BOARDS, FROM_FINDING, NONE, Alert, Rule

RUNBOOKS_FILE = "docs/runbooks.md"

_INTRO = f"""\
# fabricscope alert runbooks

Rendered from `surface/alerting/catalog.py` by `python -m fabricscope.surface.alerting`; do not edit by
hand. Every alert's `runbook_url` points at its section here. The rules are in
`deploy/prometheus/fabricscope-alerts.yaml`, their promtool tests next to them, an
Alertmanager example in `deploy/alertmanager/`.

**Severity** comes in three bands that never fire together for one condition:
`critical` (act now: the job or fabricscope itself is badly hurt), `warning` (act
today), `info` (context). A rule on a finding carries the finding's own severity;
every other rule has one fixed band. Info alerts reach a person only next to a
warning or critical alert of the same job at the same node (a job-wide info alert:
next to any of its job): FabricscopeInfoInhibitor mutes them otherwise.

**Labels.** Finding alerts carry the finding's `job` (the training job), `cause`,
`id` and its place: `node`, `interface`, `peer`, `tor`, `rank` (those it has).
Pipeline alerts carry the scrape job (`{COLLECTOR_SCRAPE_JOB}` or the agents') and
`instance` or `node`. An alert with several conditions names the one that fired
in `signal`. The `id` opens the finding: `fabricscope explain ID`.
"""


def _severity(rule: Rule) -> str:
    if rule.severity == FROM_FINDING:
        return "the finding's"
    if rule.severity == NONE:
        return "none (never pages)"
    return rule.severity


def _pages_on(alert: Alert) -> str:
    return ", ".join(f"finding `{c}`" for c in alert.causes) or "metrics"


def _index() -> list[str]:
    out = ["| alert | severity | pages on | board |", "|---|---|---|---|"]
    for a in ALERTS:
        bands = ", ".join(dict.fromkeys(_severity(r) for r in a.rules))
        out.append(f"| [{a.name}](#{a.anchor}) | {bands} | {_pages_on(a)} | "
                   f"{BOARDS[a.board][1]} |")
    return out


def _rules(alert: Alert) -> list[str]:
    out = []
    for rule in alert.rules:
        out += [f"Severity {_severity(rule)}, for {rule.for_}:", "", "```promql",
                rule.expr.rstrip("\n"), "```", ""]
    return out


def section(alert: Alert) -> list[str]:
    rb = alert.runbook
    out = [f"## {alert.name}", "", f"**What it means.** {rb.meaning}", "",
           "**How to confirm.**", ""]
    out += [f"{i}. {step}" for i, step in enumerate(rb.confirm, 1)]
    out += ["", "**What to change.**", ""]
    out += [f"- {step}" for step in rb.change]
    out += ["", f"**Rules** (pages on {_pages_on(alert)}; board "
                f"*{BOARDS[alert.board][1]}*, uid `{BOARDS[alert.board][0]}`):", ""]
    return out + _rules(alert)


def render_runbooks() -> str:
    out = [_INTRO, *_index(), ""]
    for alert in ALERTS:
        out += section(alert)
    return "\n".join(out).rstrip("\n") + "\n"
