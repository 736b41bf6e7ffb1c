"""The report's text parts as HTML: the summary, every finding's chain of evidence
(what fabricscope.diagnosis.present.explain says, as headed lists and tables), the compare
table and the links table. Every value from the store is escaped here."""

from __future__ import annotations

import statistics
import time
from html import escape

from fabricscope.diagnosis.compare import VERDICT_RULE
from fabricscope.diagnosis.finding import Finding, ordered, primary, severity_rank, taken_over_note
from fabricscope.surface import jobclass
from fabricscope.surface.report.data import ReportData

SECOND = 1_000_000_000


def hms(ns: int | None) -> str:
    return "-" if not ns else time.strftime("%H:%M:%S", time.localtime(ns / SECOND))


def num(v, fmt: str = ".4g") -> str:
    return "-" if v is None else format(v, fmt)


def badge(severity: str) -> str:
    return f'<span class="badge sev-{escape(severity)}">{escape(severity.upper())}</span>'


def _when(f: Finding) -> str:
    return (f"{hms(f.start_ns)}\u2013{hms(f.end_ns)}" if f.end_ns
            else f"open since {hms(f.start_ns)}")


def _impact(f: Finding) -> str:
    if not f.step_seconds_added:
        return ""
    return f"+{f.step_seconds_added:.3f} s per step ({f.share_of_step:.0%} of the step)"


# -- summary --------------------------------------------------------------------------------

def step_numbers(data: ReportData) -> list[tuple[str, str]]:
    seconds = [s.seconds for s in data.steps if s.seconds is not None]
    shares = [s.sync_seconds / s.seconds for s in data.steps if s.seconds]
    resent = sum(s.retrans_segs for s in data.steps)
    out = [("steps seen", f"{len(seconds)} over {len(data.node_of_rank)} ranks")]
    if seconds:
        q = statistics.quantiles(seconds, n=10) if len(seconds) > 1 else [seconds[0]] * 9
        out += [("step time", f"median {statistics.median(seconds):.3f} s, "
                              f"p90 {q[8]:.3f} s, max {max(seconds):.3f} s"),
                ("gradient sync share", f"median {statistics.median(shares):.0%}")]
    out.append(("segments resent inside steps", f"{resent}"))
    return out


def summary(data: ReportData) -> str:
    serious = [f for f in data.findings
               if severity_rank(f.severity) >= 1 and not f.superseded_by]
    top = primary(serious)
    open_ = sum(1 for f in data.findings if f.open)
    zone = time.strftime("UTC%z", time.localtime(data.span.start_ns / SECOND))
    facts = [("job", escape(data.job)),
             ("window", f"{escape(str(data.span))} ({data.span.seconds / 60:.1f} min; "
                        f"local times, {escape(zone)})"),
             ("ranks", escape(", ".join(f"{r} on {n}" for r, n in sorted(
                 data.node_of_rank.items())))),
             *((k, escape(v)) for k, v in step_numbers(data)),
             ("findings", f"{len(data.findings)} ({open_} open, {len(serious)} warning or "
                          "critical)")]
    if data.job_class is not None:
        facts += [(k, escape(v)) for k, v in job_class_facts(data.job_class)]
    if data.other_jobs:
        facts.append(("other jobs in the window", escape(", ".join(data.other_jobs))
                      + " (pick one with --job)"))
    rows = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts)
    return (primary_card(top) if top else
            '<div class="primary healthy"><h3>No warning or critical findings</h3><p>Every '
            "signal of the job stayed within its own baseline in this window.</p></div>") \
        + f'<table class="facts">{rows}</table>'


def job_class_facts(classification) -> list[tuple[str, str]]:
    """The summary's rows for the job's classification (surface/jobclass.py): its class
    and the rule that decided it, then the model (mix, sizes, timing)."""
    view = jobclass.read(classification)
    return [("job class", view.headline)] + [(f"class: {k}", v) for k, v in view.facts]


def primary_card(f: Finding) -> str:
    advice = "".join(f"<li><b>{escape(a.knob)}</b>: {escape(a.value)}</li>"
                     for a in f.advice[:3])
    impact = _impact(f)
    return (f'<div class="primary sev-{escape(f.severity)}" data-finding="{escape(f.id)}">'
            f'<div class="kicker">Primary finding</div>'
            f"<h3>{badge(f.severity)} {escape(f.cause)} at {escape(f.where)}</h3>"
            f'<p class="lead">{escape(f.summary)}</p>'
            f'<p class="meta">{escape(_when(f))}'
            f"{' &middot; ' + escape(impact) if impact else ''}"
            f' &middot; <a href="#finding-{escape(f.id)}">evidence and advice</a></p>'
            + (f'<h4>What to change</h4><ul class="advice">{advice}</ul>' if advice else "")
            + "</div>")


# -- findings -------------------------------------------------------------------------------

def finding_html(f: Finding) -> str:
    """One finding's whole chain: what was seen, what it costs, what it rules out, what
    to change (fabricscope.diagnosis.present.explain's content)."""
    facts = [("place", f.where), ("when", _when(f)), ("first raised", hms(f.first_seen_ns)),
             ("id", f.id)]
    if f.step_seconds_added or f.share_of_step:
        facts.append(("what it costs", f"{_impact(f) or '-'}; explains "
                                       f"{f.explained_share:.0%} of the time the steps lost "
                                       "against the job's baseline"))
    if f.retransmit_amplification is not None:
        facts.append(("retransmit amplification", f"grad sync slowed "
                      f"{f.retransmit_amplification:.1f}x more than the share of bytes resent"))
    waited = ", ".join(f"rank {v['rank']} ({v['node']}) +{v['waited_s']:.3f} s"
                       for v in f.victims if v.get("waited_s"))
    if waited:
        facts.append(("who waited, per step", waited))
    parts = [f'<h3>{badge(f.severity)} {escape(f.cause)} at {escape(f.where)}</h3>',
             f'<p class="lead">{escape(f.summary)}</p>',
             '<table class="facts">' + "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td>"
                                               "</tr>" for k, v in facts) + "</table>"]
    if f.evidence:
        rows = "".join(
            f"<tr><td>{escape(e.what)}</td><td class=num>{e.value:g} {escape(e.unit)}</td>"
            f"<td>{escape(', '.join(e.nodes))}</td><td>{hms(e.start_ns)}\u2013{hms(e.end_ns)}"
            f"</td><td><code>{escape(e.measurement)}</code></td></tr>" for e in f.evidence)
        parts.append("<h4>What was seen</h4><table class=\"rows evidence\"><tr><th>what</th>"
                     "<th>value</th><th>nodes</th><th>when</th><th>from</th></tr>"
                     f"{rows}</table>")
    if f.ruled_out:
        parts.append("<h4>Why not something else</h4><ul class=\"ruled-out\">" + "".join(
            f"<li>not <b>{escape(str(r.get('cause')))}</b>: {escape(str(r.get('why')))}</li>"
            for r in f.ruled_out) + "</ul>")
    if f.superseded_by:
        parts.append(f'<p class="note">Superseded: {escape(taken_over_note(f))} (<a '
                     f'href="#finding-{escape(f.superseded_by)}">go to it</a>).</p>')
    elif f.advice:
        parts.append("<h4>What to change</h4><table class=\"rows advice\"><tr><th>knob</th>"
                     "<th>set to</th><th>because</th></tr>" + "".join(
                         f"<tr><td><b>{escape(a.knob)}</b></td><td>{escape(a.value)}</td>"
                         f"<td>{escape(a.why)}</td></tr>" for a in f.advice) + "</table>")
    body = "".join(parts)
    if severity_rank(f.severity) == 0 or f.superseded_by:
        moved = " (superseded)" if f.superseded_by else ""
        return (f'<details class="finding sev-info" id="finding-{escape(f.id)}"><summary>'
                f"{badge(f.severity)} {escape(f.cause)} at {escape(f.where)}{moved}: "
                f"{escape(f.summary)}</summary>{body}</details>")
    return f'<article class="finding sev-{escape(f.severity)}" id="finding-{escape(f.id)}">' \
           f"{body}</article>"


def findings_html(data: ReportData) -> str:
    return "".join(finding_html(f) for f in ordered(data.findings))


# -- compare and links ----------------------------------------------------------------------

def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1f} %"


def compare_html(data: ReportData) -> str:
    c = data.comparison
    head = ("<tr><th>metric</th><th>before</th><th>after</th><th>change</th>"
            "<th>95 % interval of the change</th><th>p (adjusted)</th><th>drift before / after"
            "</th><th>samples</th><th>verdict</th></tr>")
    rows = []
    for r in c.results:
        ci = "-" if r.ci95 is None else f"[{r.ci95[0]:+.3g}, {r.ci95[1]:+.3g}]"
        drift = "-" if r.drift_before is None else f"{r.drift_before:+.3g} / {r.drift_after:+.3g}"
        rows.append(f'<tr class="verdict-{escape(r.verdict.replace(" ", "-"))}">'
                    f"<td>{escape(r.metric)} <small>({escape(r.unit)})</small></td>"
                    f"<td class=num>{num(r.before_median)}</td>"
                    f"<td class=num>{num(r.after_median)}</td>"
                    f"<td class=num>{_pct(r.change_pct)}</td><td class=num>{ci}</td>"
                    f"<td class=num>{num(r.p_holm, '.3g')}</td>"
                    f"<td class=num>{drift}</td><td class=num>{r.n_before} / {r.n_after}</td>"
                    f"<td><b>{escape(r.verdict)}</b></td></tr>")
    return (f'<p class="meta">Split at {escape(c.label)}: before {escape(str(c.before))}, '
            f"after {escape(str(c.after))}.</p>"
            f'<table class="rows compare">{head}{"".join(rows)}</table>'
            f'<p class="note">{escape(VERDICT_RULE)} (diagnosis/compare.py)</p>')


def links_html(data: ReportData) -> str:
    rows = "".join(
        f'<tr class="{"bad" if e.health < 1 else "ok"}"><td>{escape(e.source)} \u2192 '
        f"{escape(e.target)}</td><td>{escape(e.kind)}</td>"
        f"<td>{'faulty' if e.health < 1 else 'healthy'}</td>"
        f"<td class=num>{num(e.retrans_ratio, '.2%')}</td>"
        f"<td class=num>{num(e.rtt_p90_us, '.0f')}</td></tr>"
        for e in sorted(data.edges, key=lambda e: (e.health, e.kind, e.source, e.target)))
    return ('<table class="rows links"><tr><th>link</th><th>kind</th><th>health</th>'
            "<th>resent</th><th>RTT p90 (\u00b5s)</th></tr>" + rows + "</table>")


def line_rate_html(data: ReportData) -> str:
    """Which links show no utilization because their line rate is unknown."""
    if not data.line_rate_unknown:
        return ""
    return ('<p class="note line-rate-unknown">Line rate unknown (a virtual link, or none '
            "configured): " + escape(", ".join(data.line_rate_unknown))
            + ". Their peaks show as a rate only, not as a share of a guess.</p>")


def traffic_html(data: ReportData) -> str:
    """The traffic model per rank: T, B, B's share of the line rate where there is one, D."""
    if not data.traffic:
        return ""
    rows = "".join(
        f"<tr><td>{escape(m.rank)}</td><td>{escape(m.series)}</td>"
        f"<td class=num>{num(m.period_s, '.3f')}</td>"
        f"<td class=num>{_mbit(m.burst_bytes_per_s)}"
        f"</td><td class=num>{_share(m.burst_util)}</td>"
        f"<td class=num>{num(m.duty_cycle, '.0%')}</td></tr>"
        for m in sorted(data.traffic, key=lambda m: (m.rank, m.series)))
    return ('<h4>Traffic model</h4><table class="rows traffic"><tr><th>rank</th>'
            "<th>fitted to</th><th>T: period (s)</th><th>B: burst (Mbit/s)</th>"
            "<th>B / line rate</th><th>D: duty cycle</th></tr>" + rows + "</table>")


def _mbit(bytes_per_s: float | None) -> str:
    return "-" if bytes_per_s is None else f"{bytes_per_s * 8 / 1e6:.1f}"


def _share(util: float | None) -> str:
    return "line rate unknown" if util is None else f"{util:.0%}"
