"""Annotation templates: written once as Python format strings, rendered two ways.

A template names labels (`{job}`, `{node}`), the place (`{place}`) and the alert's
value with a format (`{value:.1f}`). `to_go` turns it into the Go template
Prometheus renders; `render` renders it in Python, as the promtool tests expect it.
The promtool run therefore checks that both agree on real alerts: a rule that
aggregates away a label its text names fails there.
"""

from __future__ import annotations

import string

#: The place of an alert for a person, as fabricscope.diagnosis.finding.Finding.where says it:
#: a ToR (and its interface), else a node (its interface, the peer), else a rank,
#: else the peer, else the job.
PLACE_GO = (
    '{{ if and $labels.tor (not $labels.node) }}{{ $labels.tor }}'
    '{{ if $labels.interface }} {{ $labels.interface }}{{ end }}'
    '{{ else if $labels.node }}{{ $labels.node }}'
    '{{ if $labels.interface }} ({{ $labels.interface }}){{ end }}'
    '{{ if $labels.peer }}, peer {{ $labels.peer }}{{ end }}'
    '{{ else if $labels.rank }}rank {{ $labels.rank }}'
    '{{ if $labels.peer }}, peer {{ $labels.peer }}{{ end }}'
    '{{ else if $labels.peer }}peer {{ $labels.peer }}'
    '{{ else }}job {{ $labels.job }}{{ end }}')


def place_text(labels: dict[str, str]) -> str:
    """What PLACE_GO renders for these labels (missing and empty are the same)."""
    get = labels.get
    if get("tor") and not get("node"):
        return f"{get('tor')} {get('interface') or ''}".strip()
    head = get("node") or (f"rank {get('rank')}" if get("rank") else "")
    if get("node") and get("interface"):
        head += f" ({get('interface')})"
    parts = [head] + ([f"peer {get('peer')}"] if get("peer") else [])
    return ", ".join(p for p in parts if p) or f"job {get('job') or ''}"


def fields(template: str) -> list[tuple[str, str]]:
    """(name, format spec) of every field, checking what Go can be given."""
    out, text = [], []
    for literal, name, spec, conversion in string.Formatter().parse(template):
        text.append(literal + ("\0" if name is not None else ""))
        if name is None:
            continue
        if conversion or not name.isidentifier():
            raise ValueError(f"field {name!r} must be a plain label name: {template!r}")
        if (name == "value") != bool(spec) or (spec and not _is_fixed_point(spec)):
            raise ValueError(f"only {{value}} takes a format, a fixed one like .1f: "
                             f"{template!r}")
        out.append((name, spec))
    if "{{" in "".join(text) or "}}" in "".join(text):
        raise ValueError(f"literal braces would start a Go action: {template!r}")
    return out


def _is_fixed_point(spec: str) -> bool:
    return spec.startswith(".") and spec.endswith("f") and spec[1:-1].isdigit()


def to_go(template: str) -> str:
    """The Go template (Prometheus' alert templating) of a format string."""
    out = []
    for literal, name, spec, _ in string.Formatter().parse(template):
        out.append(literal)
        if name is None:
            continue
        if name == "place":
            out.append(PLACE_GO)
        elif name == "value":
            out.append(f'{{{{ printf "%{spec}" $value }}}}')
        else:
            out.append(f"{{{{ $labels.{name} }}}}")
    fields(template)
    return "".join(out)


def render(template: str, labels: dict[str, str], value: float = 1.0) -> str:
    """What Prometheus renders from to_go(template) for an alert with these labels."""
    values = {name: labels.get(name, "") for name, _ in fields(template)}
    values.update(place=place_text(labels), value=value)
    return template.format(**values)
