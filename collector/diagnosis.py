"""The collector's wiring of the diagnosis engine (diagnosis/live.py): its store, its
replica id, its topology and its metrics in the collector's registry; and, after each
of its ticks, the classes of the jobs it owns (diagnosis/jobclass.py), handed to their
engines for the class causes (diagnosis/detect_class.py)."""

from __future__ import annotations

import socket

from fabricscope.diagnosis.jobclass import JobClassAnalyzer
from fabricscope.diagnosis.live import LiveDiagnosis
from fabricscope.diagnosis.metrics import DiagnosisMetrics
from fabricscope.diagnosis.store import Store
from fabricscope.topology import load_topology


class _ClassifyingDiagnosis(LiveDiagnosis):
    """LiveDiagnosis whose ticks also write the owned jobs' job_class points: the owner
    of a job is the one replica that reads it back, so it classifies it too; each
    engine judges the class causes from its job's latest classification at its next
    evaluation."""

    job_class: JobClassAnalyzer | None = None

    def tick(self):
        found = super().tick()
        if self.job_class is not None:
            self.store.write(self.job_class.records(list(self.engines), self.clock()))
            for job, engine in self.engines.items():
                engine.classified(self.job_class.latest(job))
        return found


def start_diagnosis(config, registry, grpc_port: int) -> LiveDiagnosis:
    """A LiveDiagnosis for this collector (not started: `await it.start()`)."""
    tor_of = load_topology(config.topology_file).tor_of if config.topology_file else \
        (lambda node: None)
    replica = config.replica_id or f"{socket.gethostname()}:{grpc_port}"
    store = Store(config.influx_url, config.influx_db, config.influx_token,
                  config.influx_timeout_s)
    live = _ClassifyingDiagnosis(store, DiagnosisMetrics(registry), replica, tor_of,
                                 config.diagnosis_interval_s)
    if config.job_class:
        live.job_class = JobClassAnalyzer(store, registry)
    return live
