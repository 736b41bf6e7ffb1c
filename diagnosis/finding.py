"""A finding: what is wrong, where, since when, what it costs, why we think so, and
what to change. The one shape the engine produces and every surface shows (CLI,
/metrics, InfluxDB measurement `finding`, Grafana, the report).

The vocabulary of causes and severities is closed (diagnosis/causes.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

from fabricscope.diagnosis.causes import MEANING, SEVERITIES, Cause, severity_rank  # noqa: F401
from fabricscope.records import Record
from fabricscope.jobs import job_label

#: cause -> what it means
CAUSES = {str(c): meaning for c, meaning in MEANING.items()}
PLACE_KEYS = ("node", "interface", "peer", "tor", "rank")


@dataclass
class Evidence:
    """One number that proves a finding, and where it came from."""

    measurement: str          # the measurement it was computed from (tcp_node, gloo_step, ...)
    what: str                 # what the number is, for a person
    value: float
    unit: str = ""
    start_ns: int = 0
    end_ns: int = 0
    nodes: list[str] = field(default_factory=list)


@dataclass
class Advice:
    knob: str                 # NCCL_IB_TC, bucket_cap_mb, "ECN marking threshold on tor0 uplinks"
    value: str                # what to set it to
    why: str                  # the evidence that chose it


@dataclass
class Finding:
    cause: Cause
    severity: str
    job: str
    place: dict[str, str | None]
    start_ns: int
    summary: str
    first_seen_ns: int = 0
    last_seen_ns: int = 0
    end_ns: int | None = None
    evidence: list[Evidence] = field(default_factory=list)
    ruled_out: list[dict] = field(default_factory=list)     # {cause, why}
    advice: list[Advice] = field(default_factory=list)
    step_seconds_added: float = 0.0
    share_of_step: float = 0.0
    explained_share: float = 0.0
    retransmit_amplification: float | None = None
    victims: list[dict] = field(default_factory=list)       # {rank, node, waited_s}
    id: str = ""
    #: the id of the finding that took this one over: a place that explains every hop
    #: this one was named on, and hops it cannot (one fault, first seen on part of its
    #: hops, localized again), or a cause named since that explains an unexplained
    #: slowdown; such a finding is closed and not the primary
    superseded_by: str | None = None

    def __post_init__(self) -> None:
        if self.cause not in CAUSES:
            raise ValueError(f"unknown cause {self.cause!r}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")
        self.cause = Cause(self.cause)
        self.place = {k: (self.place.get(k) or None) for k in PLACE_KEYS}
        if not self.id:
            self.id = finding_id(self.job, self.cause, self.place, self.start_ns)

    @property
    def open(self) -> bool:
        return self.end_ns is None

    @property
    def key(self) -> tuple:
        return finding_key(self.cause, self.place)

    @property
    def where(self) -> str:
        """The place for a person: 'node1 (eth0)', 'tor0 uplink', 'storage 198.18.0.254:9000'."""
        p = self.place
        if p["tor"] and not p["node"]:
            return f"{p['tor']} {p['interface'] or ''}".strip()
        parts = [p["node"] or (f"rank {p['rank']}" if p["rank"] else "")]
        if p["node"] and p["interface"]:
            parts[0] += f" ({p['interface']})"
        if p["peer"]:
            parts.append(f"peer {p['peer']}")
        return ", ".join(x for x in parts if x) or f"job {job_label(self.job)}"

    def to_json(self) -> dict:
        out = asdict(self)
        out["impact"] = {"step_seconds_added": out.pop("step_seconds_added"),
                         "share_of_step": out.pop("share_of_step")}
        out["start"] = out.pop("start_ns") / 1e9
        out["end"] = None if self.end_ns is None else out["end_ns"] / 1e9
        out.pop("end_ns")
        out["first_seen"] = out.pop("first_seen_ns") / 1e9
        out["last_seen"] = out.pop("last_seen_ns") / 1e9
        return {"id": out.pop("id"), **out}

    @classmethod
    def from_json(cls, obj: dict) -> "Finding":
        obj = dict(obj)
        impact = obj.pop("impact", {}) or {}
        end = obj.pop("end", None)
        return cls(cause=obj["cause"], severity=obj["severity"], job=obj["job"],
                   place=obj.get("place") or {}, start_ns=int(round(obj["start"] * 1e9)),
                   summary=obj.get("summary", ""),
                   first_seen_ns=int(round(obj.get("first_seen", 0) * 1e9)),
                   last_seen_ns=int(round(obj.get("last_seen", 0) * 1e9)),
                   end_ns=None if end is None else int(round(end * 1e9)),
                   evidence=[Evidence(**e) for e in obj.get("evidence", [])],
                   ruled_out=list(obj.get("ruled_out", [])),
                   advice=[Advice(**a) for a in obj.get("advice", [])],
                   step_seconds_added=float(impact.get("step_seconds_added", 0.0)),
                   share_of_step=float(impact.get("share_of_step", 0.0)),
                   explained_share=float(obj.get("explained_share", 0.0)),
                   retransmit_amplification=obj.get("retransmit_amplification"),
                   victims=list(obj.get("victims", [])), id=obj.get("id", ""),
                   superseded_by=obj.get("superseded_by"))

    def to_record(self) -> Record:
        """The `finding` point (fabricscope/measurements/diagnosis.py)."""
        tags = {"id": self.id, "cause": self.cause, "job": self.job}
        tags.update({k: str(v) for k, v in self.place.items() if v})
        fields = {
            "severity": self.severity, "open": self.open,
            "first_seen_ns": int(self.first_seen_ns), "last_seen_ns": int(self.last_seen_ns),
            "summary": self.summary,
            "evidence": json.dumps([asdict(e) for e in self.evidence]),
            "ruled_out": json.dumps(self.ruled_out),
            "advice": json.dumps([asdict(a) for a in self.advice]),
            "step_seconds_added": float(self.step_seconds_added),
            "share_of_step": float(self.share_of_step),
            "explained_share": float(self.explained_share),
            "victims": json.dumps(self.victims),
        }
        if self.end_ns is not None:
            fields["end_ns"] = int(self.end_ns)
        if self.retransmit_amplification is not None:
            fields["retransmit_amplification"] = float(self.retransmit_amplification)
        if self.superseded_by:
            fields["superseded_by"] = self.superseded_by
        return Record("finding", int(self.start_ns), tags, fields)

    @classmethod
    def from_row(cls, row: dict) -> "Finding":
        """A finding from an InfluxQL row of `SELECT * FROM finding` (tags and fields as
        columns, `time` in ns)."""
        return cls(cause=row["cause"], severity=row["severity"], job=row["job"],
                   place={k: row.get(k) for k in PLACE_KEYS}, start_ns=int(row["time"]),
                   summary=row.get("summary") or "",
                   first_seen_ns=int(row.get("first_seen_ns") or 0),
                   last_seen_ns=int(row.get("last_seen_ns") or 0),
                   end_ns=None if row.get("open") else int(row.get("end_ns") or 0),
                   evidence=[Evidence(**e) for e in json.loads(row.get("evidence") or "[]")],
                   ruled_out=json.loads(row.get("ruled_out") or "[]"),
                   advice=[Advice(**a) for a in json.loads(row.get("advice") or "[]")],
                   step_seconds_added=float(row.get("step_seconds_added") or 0.0),
                   share_of_step=float(row.get("share_of_step") or 0.0),
                   explained_share=float(row.get("explained_share") or 0.0),
                   retransmit_amplification=row.get("retransmit_amplification"),
                   victims=json.loads(row.get("victims") or "[]"), id=row["id"],
                   superseded_by=row.get("superseded_by") or None)


def finding_key(cause: str, place: dict) -> tuple:
    """What makes two evaluations' findings the same: the cause and the place."""
    return (cause,) + tuple(place.get(k) or None for k in PLACE_KEYS)


def finding_id(job: str, cause: str, place: dict, start_ns: int) -> str:
    """Stable over rewrites and across replicas: the same finding gets the same id."""
    key = json.dumps([job, cause, [place.get(k) for k in PLACE_KEYS], start_ns // 10**9])
    return hashlib.sha1(key.encode()).hexdigest()[:12]


def taken_over_note(f: Finding) -> str:
    """What a person reads on a finding another one took over (its superseded_by): a
    network fault localized again, or a slowdown whose cause was named since."""
    return (f"finding {f.superseded_by} took it over (the same trouble, placed or explained "
            "better); its advice applies, not this one's")


def ordered(findings: list[Finding]) -> list[Finding]:
    """The order a person reads findings in: current before taken over, then severity,
    impact, start."""
    return sorted(findings, key=lambda f: (bool(f.superseded_by), -severity_rank(f.severity),
                                           -f.step_seconds_added, f.start_ns))


def primary(findings: list[Finding]) -> Finding | None:
    """The finding a person should read first: highest severity, ties by impact; a
    finding another one took over is not it."""
    current = [f for f in findings if not f.superseded_by]
    if not current:
        return None
    return max(current, key=lambda f: (severity_rank(f.severity), f.step_seconds_added))
