"""A job's class (fabricscope/jobclass.py `classify`) as every view shows it.

    view = read(classify(observations))          # or read(a_classification.to_dict())
    view.headline     # "data_parallel: allreduce carries 97% of the exchanged bytes: ..."
    view.facts        # [("mix", "allreduce 97% of bytes (120 calls), ..."), ...]

Each view has one small function that takes a classification (a Classification or
its to_dict(), the shape a stored record would carry) and draws it:
`fabricscope top` (surface/top.py class_lines), the report's summary
(surface/report/html_parts.py job_class_facts) and the Training job board
(surface/grafana/boards.py job_class_panels, with the columns of `columns`). The
collector writes each owned job's class as a `job_class` point
(diagnosis/jobclass.py); `fabricscope diagnose`, `top` and the report read it, and
a stored point is a classification to every view here too (its nested parts are
JSON text there: `from_point`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from fabricscope.errors import UserError
from fabricscope.jobclass import Classification, JobClass

#: the scalar parts of a classification, in the order a person reads them; the columns
#: a stored classification would carry (mix and components are nested, shown as text)
COLUMNS = ("class", "reason", "components", "p50_bytes", "p90_bytes", "period_s",
           "collectives_per_step", "arrival_rate_per_s", "gap_spread", "observations")


@dataclass(frozen=True)
class JobClassView:
    job_class: JobClass
    headline: str                         # the class and the rule that decided it
    facts: list[tuple[str, str]]          # the model: mix, sizes, timing, observations


def from_point(point: dict) -> dict:
    """A stored job_class point (diagnosis/jobclass.py job_class_record) in the shape
    of Classification.to_dict(): its mix and stages are JSON text, its components
    comma-separated text, its drops one total."""
    d = dict(point)
    try:
        if isinstance(d.get("mix"), str):
            d["mix"] = json.loads(d["mix"])
        if isinstance(d.get("stages"), str):
            d["stages"] = {"stages": json.loads(d["stages"]),
                           "bubble_share": d.get("bubble_share"),
                           "slow_stage": d.get("slow_stage"),
                           "cost_share": d.get("stage_cost_share")}
    except json.JSONDecodeError as exc:
        raise UserError(f"a stored job_class point of job {d.get('job')!r} has a field that "
                        f"is not JSON ({exc.msg})", "the collector writes them: check "
                        "what else writes the job_class measurement") from None
    if isinstance(d.get("components"), str):
        d["components"] = [c for c in d["components"].split(",") if c]
    if "dropped" not in d and d.get("rows_dropped"):
        d["dropped"] = {"rows": d["rows_dropped"]}
    return d


def _as_dict(classification) -> dict:
    if isinstance(classification, Classification):
        return classification.to_dict()
    if isinstance(classification, dict):
        return from_point(classification)
    raise UserError(f"a job classification is a {type(classification).__name__}, not a "
                    "Classification or its to_dict()", "pass fabricscope.jobclass.classify's "
                    "result or its to_dict()")


def read(classification) -> JobClassView:
    """The view of one classification; a one-line UserError for one that is not."""
    d = _as_dict(classification)
    try:
        job_class = JobClass(d.get("class"))
    except ValueError:
        raise UserError(f"job class {d.get('class')!r} is none of "
                        f"{', '.join(c.value for c in JobClass)}",
                        "pass a classification fabricscope.jobclass.classify made") from None
    facts = [("mix", _mix(d.get("mix") or {}))]
    if d.get("p50_bytes") is not None:
        facts.append(("message sizes", f"p50 {_bytes(d['p50_bytes'])}, "
                                       f"p90 {_bytes(d.get('p90_bytes'))}"))
    if d.get("period_s") is not None:
        per_step = d.get("collectives_per_step")
        facts.append(("period", f"{d['period_s'] * 1e3:.1f} ms"
                      + (f", {per_step:.1f} collectives per step and rank"
                         if per_step is not None else "")))
    elif d.get("arrival_rate_per_s") is not None:
        facts.append(("arrivals", f"{d['arrival_rate_per_s']:.1f}/s (no period)"))
    if d.get("gap_spread") is not None:
        facts.append(("gap spread", f"{d['gap_spread']:.2f} (a step loop ~0, Poisson 1.58)"))
    stages = d.get("stages") or {}
    if stages.get("stages"):
        slow = stages.get("slow_stage")
        facts.append(("stages", f"{len(stages['stages'])}, bubble "
                      f"{(stages.get('bubble_share') or 0.0):.0%}"
                      + (f", slow stage rank {slow} ({(stages.get('cost_share') or 0.0):.0%} "
                         "of its span)" if slow is not None else ", none slow")))
    dropped = d.get("dropped") or {}
    facts.append(("observations", f"{d.get('observations', 0)} used"
                  + (", dropped: " + ", ".join(f"{k} {v}" for k, v in sorted(dropped.items()))
                     if dropped else "")))
    return JobClassView(job_class, f"{job_class.value}: {d.get('reason', '')}", facts)


def columns(classification) -> dict:
    """The classification as flat columns (COLUMNS): what a board's table shows."""
    d = _as_dict(classification)
    out = {k: d.get(k) for k in COLUMNS}
    out["components"] = ", ".join(d.get("components") or ())
    return out


def _mix(mix: dict) -> str:
    shares = sorted(mix.items(), key=lambda kv: -kv[1].get("bytes_share", 0.0))
    return ", ".join(f"{family} {s.get('bytes_share', 0.0):.0%} of bytes ({s.get('count', 0)} "
                     "calls)" for family, s in shares) or "no collectives"


def _bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"
