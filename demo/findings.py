"""The demo's last word: what the engine found, and the before/after of the fault.

The collector's live engine wrote its findings to InfluxDB while the job ran; the
demo reads them back (as `fabricscope diagnose` does), prints them for a person,
and compares the steps before and after the annotation it wrote when it switched
the fault on (as `fabricscope compare --around` does)."""

from __future__ import annotations

import time



def await_findings(store, job: str, since_ns: int, timeout_s: float = 30.0) -> list:
    """The job's findings, once a warning or critical one is in (or the timeout)."""
    from fabricscope.diagnosis.cli import recorded
    from fabricscope.diagnosis.finding import severity_rank
    from fabricscope.diagnosis.timespan import Span
    deadline = time.monotonic() + timeout_s
    while True:
        found = [f for f in recorded(store, Span(since_ns, time.time_ns()), job)]
        if any(severity_rank(f.severity) >= 1 for f in found) or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def report(store, job: str, start_ns: int, fault_ns: int, end_ns: int) -> str:
    """Findings and compare as text."""
    from fabricscope.diagnosis import compare as cmp
    from fabricscope.diagnosis.present import compare_text, findings_text
    from fabricscope.diagnosis.timespan import Span
    findings = await_findings(store, job, start_ns)
    lines = ["", "What fabricscope found (the collector's live engine; `fabricscope diagnose`):",
             "", findings_text(findings, show_info=True)]
    before = Span(start_ns, fault_ns)
    after = Span(fault_ns, end_ns)
    results = cmp.compare_samples(cmp.samples(store, job, before, after))
    lines += ["Before/after the fault (`fabricscope compare --around`):", "",
              compare_text(job, before, after, results)]
    return "\n".join(lines)


def write_report(store, job: str, start_ns: int, end_ns: int, annotation: str,
                 out: str) -> str:
    """`fabricscope report` of the run, split at the fault's annotation; its path."""
    from argparse import Namespace

    from fabricscope.surface.report.page import write_report as render
    args = Namespace(since=None, start=str(start_ns / 1e9), end=str(end_ns / 1e9), job=job,
                     compare=annotation, compare_window="2m", out=out)
    path, _account = render(store, args)
    return path


def where_grafana() -> str:
    """The Grafana provisioning folder of this checkout (datasources and boards)."""
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(root, "grafana", "provisioning")
