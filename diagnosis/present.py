"""Findings and comparisons for a person: `diagnose`, `explain`, `compare` and the demo.

One or two lines per finding (what, where, how much, since when), its evidence,
the causes it rules out and why, and what to change; `explain` gives the whole
chain. Plain text that reads in a terminal, a CI log or an e-mail.
"""

from __future__ import annotations

import time

from fabricscope.diagnosis.compare import VERDICT_RULE
from fabricscope.diagnosis.finding import Finding, ordered, primary, taken_over_note
from fabricscope.jobs import job_label

SECOND = 1_000_000_000
MARK = {"critical": "!!", "warning": "! ", "info": "  "}


def _t(ns: int | None) -> str:
    if not ns:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(ns / SECOND))


def one_finding(f: Finding, width: int = 100) -> list[str]:
    when = f"{_t(f.start_ns)}-{_t(f.end_ns) if f.end_ns else 'now'}"
    impact = (f", +{f.step_seconds_added:.2f} s/step ({f.share_of_step:.0%})"
              if f.step_seconds_added else "")
    out = [f"{MARK[f.severity]} {f.severity.upper():8s} {f.cause} at {f.where}  [{when}{impact}]"
           f"  id {f.id}",
           f"   {f.summary}"]
    if f.superseded_by:
        out.append(f"   ({taken_over_note(f)})")
        return out
    for a in f.advice[:3]:
        out.append(f"   -> {a.knob}: {a.value}")
    return out


def findings_text(findings: list[Finding], show_info: bool = True) -> str:
    if not findings:
        return "No findings: every job's evidence is within its own baseline.\n"
    shown = ordered([f for f in findings if show_info or f.severity != "info"])
    lines = []
    top = primary(shown)
    if top is not None and top.severity != "info":
        lines.append(f"Primary: {top.cause} at {top.where} ({top.severity})")
        lines.append("")
    for f in shown:
        lines += one_finding(f)
        lines.append("")
    hidden = len(findings) - len(shown)
    if hidden:
        lines.append(f"({hidden} info findings not shown)")
    return "\n".join(lines).rstrip() + "\n"


def explain(f: Finding) -> str:
    """The finding's chain of evidence: seen, where, when, what it rules out, what to do."""
    lines = [f"{f.cause} ({f.severity}) at {f.where}, job {job_label(f.job)}",
             f"id {f.id}; started {_t(f.start_ns)}, first raised {_t(f.first_seen_ns)}, "
             + (f"ended {_t(f.end_ns)}" if f.end_ns else "still open"),
             "", f.summary]
    if f.superseded_by:
        lines += ["", f"Superseded: {taken_over_note(f)}."]
    lines += ["", "What was seen:"]
    for e in f.evidence:
        nodes = f" on {', '.join(e.nodes)}" if e.nodes else ""
        span = f" ({_t(e.start_ns)}-{_t(e.end_ns)})" if e.start_ns else ""
        lines.append(f"  - {e.what}: {e.value:g} {e.unit}{nodes}{span}  [{e.measurement}]")
    if f.step_seconds_added or f.share_of_step:
        lines += ["", f"What it costs: {f.step_seconds_added:.3f} s of every step "
                      f"({f.share_of_step:.0%}); it explains {f.explained_share:.0%} of the time "
                      "the steps lost against the job's baseline."]
    if f.retransmit_amplification is not None:
        lines.append(f"Retransmit amplification: grad sync slowed {f.retransmit_amplification:.1f}"
                     "x more than the share of bytes resent.")
    if f.victims:
        waited = ", ".join(f"rank {v['rank']} ({v['node']}) +{v['waited_s']:.3f} s"
                           for v in f.victims if v.get("waited_s"))
        if waited:
            lines += ["", f"Who waited: {waited} per step."]
    if f.ruled_out:
        lines += ["", "Why not something else:"]
        lines += [f"  - not {r['cause']}: {r['why']}" for r in f.ruled_out]
    if f.advice and not f.superseded_by:
        lines += ["", "What to change:"]
        for a in f.advice:
            lines += [f"  - {a.knob}: {a.value}", f"      because {a.why}"]
    return "\n".join(lines) + "\n"


def compare_text(job: str, before, after, results) -> str:
    lines = [f"job {job_label(job)}", f"before {before}  |  after {after}", "",
             f"{'metric':<18}{'before':>12}{'after':>12}{'change':>11}{'95% CI of change':>26}"
             f"{'p (adj.)':>10}{'drift b/a':>20}  verdict"]
    for r in results:
        def num(v):
            return "-" if v is None else f"{v:.4g}"
        ci = "-" if r.ci95 is None else f"[{r.ci95[0]:+.3g}, {r.ci95[1]:+.3g}]"
        # a resent share from 6e-5 to 1e-2 is +16685.5 %: the column keeps a space free
        change = "-" if r.change_pct is None else f"{r.change_pct:+.1f}%"
        drift = "-" if r.drift_before is None else f"{r.drift_before:+.3g}/{r.drift_after:+.3g}"
        lines.append(f"{r.metric:<18}{num(r.before_median):>12}{num(r.after_median):>12}"
                     f"{change:>11}{ci:>26}{num(r.p_holm):>10}{drift:>20}  {r.verdict}"
                     f"  (n {r.n_before}/{r.n_after})")
    lines += ["", VERDICT_RULE]
    return "\n".join(lines) + "\n"
