"""The diagnosis engine's metrics on the collector's /metrics (the alerts' inputs).

Only the replica that owns a job exports its findings and gauges; Prometheus
scrapes every replica, so rules aggregate `max without(instance)`. A finding's
series exists while it is open and is removed when it closes, so an alert on it
resolves by itself.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fabricscope.diagnosis.finding import PLACE_KEYS, Finding

FINDING_ACTIVE = "fabricscope_finding_active"
FINDING_LABELS = ("cause", "severity", "job", *PLACE_KEYS, "id")
FINDINGS_OPENED = "fabricscope_findings_opened"      # a counter: exported with _total
JOB_GAUGES = {
    "step_s": ("fabricscope_job_step_seconds", "median step time of the job's last steps"),
    "spread_s": ("fabricscope_job_step_jitter_seconds",
                 "spread of the last steps' time (median absolute deviation)"),
    "baseline_spread_s": ("fabricscope_job_step_jitter_baseline_seconds",
                          "the same spread over the job's baseline steps (its own normal)"),
    "sync_slowdown": ("fabricscope_job_grad_sync_slowdown",
                      "grad-sync time per step now / the job's baseline"),
    "retransmit_ratio": ("fabricscope_job_retransmit_ratio",
                         "segments retransmitted / sent by the job's nodes, last seconds"),
    "amplification": ("fabricscope_job_retransmit_amplification",
                      "(grad-sync slowdown - 1) / retransmit ratio: collective time the "
                      "retransmits cost per share of segments resent; 0 while none"),
}


class DiagnosisMetrics:
    def __init__(self, registry: CollectorRegistry):
        r = registry
        self.active = Gauge(FINDING_ACTIVE, "1 while a finding is open (removed when it "
                            "closes)", FINDING_LABELS, registry=r)
        self.opened = Counter(FINDINGS_OPENED, "findings opened", ["cause", "severity"],
                              registry=r)
        self.job = {attr: Gauge(name, doc, ["job"], registry=r)
                    for attr, (name, doc) in JOB_GAUGES.items()}
        self.jobs_owned = Gauge("fabricscope_diagnosis_jobs_owned", "jobs this replica "
                                "analyses", registry=r)
        self.replicas = Gauge("fabricscope_diagnosis_replicas_live", "collector replicas "
                              "with a recent heartbeat (they share the jobs out)", registry=r)
        self.evaluations = Counter("fabricscope_diagnosis_evaluations", "job evaluations",
                                   registry=r)
        self.tick_seconds = Histogram("fabricscope_diagnosis_tick_seconds", "time of one "
                                      "engine tick (reads, evaluations, writes)", registry=r,
                                      buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
        self.cpu_seconds = Counter("fabricscope_diagnosis_cpu_seconds", "CPU time of the "
                                   "engine's ticks (their thread's, so the ingest beside "
                                   "them is not counted)", registry=r)
        self.errors = Counter("fabricscope_diagnosis_errors", "engine ticks that failed, by "
                              "kind (store: InfluxDB unreachable or refusing)", ["kind"],
                              registry=r)
        self.lag = Gauge("fabricscope_diagnosis_evidence_lag_seconds", "wall clock minus the "
                         "latest second of evidence the engine evaluated, worst owned job",
                         registry=r)
        for kind in ("store", "engine"):
            self.errors.labels(kind)
        self._shown: dict[str, tuple] = {}          # finding id -> label values exported

    def show(self, f: Finding) -> None:
        labels = (f.cause, f.severity, f.job, *[f.place.get(k) or "" for k in PLACE_KEYS], f.id)
        old = self._shown.get(f.id)
        if f.open:
            if old is None:
                self.opened.labels(f.cause, f.severity).inc()
            elif old != labels:
                self.active.remove(*old)
            self.active.labels(*labels).set(1)
            self._shown[f.id] = labels
        elif old is not None:
            self.active.remove(*old)
            del self._shown[f.id]

    def forget_job(self, job: str) -> None:
        """The job moved to another replica or ended: stop exporting it here."""
        for fid, labels in list(self._shown.items()):
            if labels[2] == job:
                self.active.remove(*labels)
                del self._shown[fid]
        for g in self.job.values():
            try:
                g.remove(job)
            except KeyError:
                pass

    def set_job(self, job: str, gauges) -> None:
        for attr, g in self.job.items():
            value = getattr(gauges, attr)
            if value is None:
                try:
                    g.remove(job)
                except KeyError:
                    pass
            else:
                g.labels(job).set(value)
