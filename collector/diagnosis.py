"""The collector's wiring of the diagnosis engine (diagnosis/live.py): its store, its
replica id, its topology and its metrics in the collector's registry."""

from __future__ import annotations

import socket

from diagnosis.live import LiveDiagnosis
from diagnosis.metrics import DiagnosisMetrics
from diagnosis.store import Store
from fabricscope.topology import load_topology


def start_diagnosis(config, registry, grpc_port: int) -> LiveDiagnosis:
    """A LiveDiagnosis for this collector (not started: `await it.start()`)."""
    tor_of = load_topology(config.topology_file).tor_of if config.topology_file else \
        (lambda node: None)
    replica = config.replica_id or f"{socket.gethostname()}:{grpc_port}"
    store = Store(config.influx_url, config.influx_db, config.influx_token,
                  config.influx_timeout_s)
    return LiveDiagnosis(store, DiagnosisMetrics(registry), replica, tor_of,
                         config.diagnosis_interval_s)
