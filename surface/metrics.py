"""The metric names alerts are written against: the collector's /metrics contract.

The finding and job gauges are set by the diagnosis engine on the collector replica
that owns the job; the pipeline metrics are the collector's and the agents' own
(collector/metrics.py, agent/metrics.py). Names live here once so that the rules,
the test exporter (tests/support/alerting.py) and the dashboards cannot drift apart.
"""

from __future__ import annotations

from fabricscope.diagnosis.metrics import FINDING_ACTIVE, FINDING_LABELS, JOB_GAUGES  # noqa: F401 (re-exported)
from fabricscope.diagnosis.metrics import FINDINGS_OPENED as _OPENED

#: 1 while a finding is open; the series disappears when it closes. Absent place parts
#: are empty strings, which Prometheus drops from the label set.
FINDINGS_OPENED = _OPENED + "_total"

# Per job (label `job`, the training job), from the owning replica (diagnosis/metrics.py).
JOB_STEP = JOB_GAUGES["step_s"][0]                        # median of the last steps
JOB_JITTER = JOB_GAUGES["spread_s"][0]                    # MAD of the last 10 steps
JOB_JITTER_BASELINE = JOB_GAUGES["baseline_spread_s"][0]  # MAD of its baseline steps
JOB_GRAD_SYNC_SLOWDOWN = JOB_GAUGES["sync_slowdown"][0]   # grad-sync time / baseline
JOB_RETRANSMIT_RATIO = JOB_GAUGES["retransmit_ratio"][0]  # resent / sent, last seconds
JOB_RETRANSMIT_AMPLIFICATION = JOB_GAUGES["amplification"][0]
JOB_GAUGE_NAMES = tuple(name for name, _doc in JOB_GAUGES.values())

# The collector's pipeline health (collector/metrics.py).
AGENT_LAST_SEEN = "fabricscope_collector_agent_last_seen_timestamp_seconds"
AGENT_DROPPED = "fabricscope_collector_agent_dropped_records"
RECORDS_REJECTED = "fabricscope_collector_records_rejected_total"
RECORDS_DROPPED = "fabricscope_collector_records_dropped_total"
SPOOL_OLDEST_AGE = "fabricscope_collector_spool_oldest_age_seconds"
BATCHES_THROTTLED = "fabricscope_collector_batches_throttled_total"

# The agents' own (agent/metrics.py), scraped on each node's :9471.
EVENTS_LOST = "fabricscope_agent_events_lost_total"

#: Scrape job names, as deploy/prometheus/prometheus.example.yaml declares them. The
#: collector's job is scraped with honor_labels, so the `job` label of a finding is
#: the training job and a pipeline series without one gets this scrape job's name.
COLLECTOR_SCRAPE_JOB = "fabricscope-collector"
AGENT_SCRAPE_JOB = "fabricscope-agent"

#: Labels that tell collector replicas apart. Only the owner of a job exports its
#: findings, and ownership moves between replicas, so rules aggregate them away
#: (`pod` is what Kubernetes service discovery adds next to `instance`).
REPLICA_LABELS = ("instance", "pod")
