"""Alerts on the telemetry pipeline itself: agents, what they lose, the collectors.

When these fire, the finding alerts can be silent for lack of data, not for lack
of faults. Their `job` label is the scrape job (fabricscope-collector or
fabricscope-agent), which Alertmanager routes to the team that runs fabricscope.
"""

from __future__ import annotations

from fabricscope.diagnosis.causes import Cause
from fabricscope.surface.alerting.cases import finding_cases
from fabricscope.surface.alerting.finding_alerts import DIAGNOSE, EXPLAIN, FOR
from fabricscope.surface.metrics import (AGENT_DROPPED, AGENT_LAST_SEEN, AGENT_SCRAPE_JOB, BATCHES_THROTTLED,
                             COLLECTOR_SCRAPE_JOB, EVENTS_LOST, RECORDS_DROPPED, RECORDS_REJECTED,
                             SPOOL_OLDEST_AGE)
from fabricscope.surface.alerting.model import FROM_FINDING, Alert, Case, Expect, Rule, Runbook, board
from fabricscope.surface.alerting.promql import FindingSeries, across_replicas, finding_open, selector

GROUP = "fabricscope-pipeline"
SILENT_S = 30             # agents send a batch every second or so
GONE_S = 600              # after this an agent counts as removed, not down
BACKLOG_WARNING_S = 60
BACKLOG_CRITICAL_S = 300

_COLLECTOR = {"job": COLLECTOR_SCRAPE_JOB, "instance": "collector-0"}
_AGENT = {"job": AGENT_SCRAPE_JOB, "instance": "198.18.0.13:9471", "node": "node3"}
_PIPELINE_BOARD = (f"{board('pipeline')}: records per node, lag, losses and the "
                   "collectors' spool over time.")


def _series(metric: str, base: dict[str, str], **labels: str) -> str:
    return selector(metric, {**base, **labels})


def _expect(base: dict[str, str], severity: str = "warning", rule: int = 0,
            value: float = 1.0, **labels: str) -> Expect:
    return Expect({**base, **labels, "severity": severity}, rule=rule, value=value)


_SEEN = _series(AGENT_LAST_SEEN, _COLLECTOR, node="node3")
_SEEN_ELSEWHERE = _series(AGENT_LAST_SEEN, {**_COLLECTOR, "instance": "collector-1"},
                          node="node3")
_NODE3 = {"job": COLLECTOR_SCRAPE_JOB, "node": "node3"}

AGENT_DOWN = Alert(
    "FabricscopeAgentDown", GROUP,
    "Agent on {node} stopped reporting",
    "",
    rules=(
        Rule(f"time() - {across_replicas(AGENT_LAST_SEEN)} > {SILENT_S} < {GONE_S}", "0s",
             "warning", signal="last_seen",
             description="No collector has had a batch from the agent on node {node} for "
             "{value:.0f} s (scrape job {job}): fabricscope is blind on that node, and the "
             "findings there can close for lack of data."),
        Rule(f'up{{job="{AGENT_SCRAPE_JOB}"}} == 0', "1m", "warning", signal="scrape",
             summary="Agent on {node} cannot be scraped",
             description="Prometheus has not scraped the agent at {instance} (node {node}, "
             "scrape job {job}) for a minute: it is down, or its /metrics port is blocked."),
    ),
    runbook=Runbook(
        f"An agent that reported within the last {GONE_S // 60} minutes has sent nothing "
        f"to any collector replica for {SILENT_S} s (the freshest time any replica saw "
        "it, so moving between replicas is not an outage), or Prometheus cannot scrape "
        f"it. After {GONE_S // 60} minutes of silence a node counts as removed and the "
        "first rule resolves; the scrape rule keeps firing while the node is still a "
        "target.",
        ("`kubectl -n fabricscope get pods -o wide --field-selector spec.nodeName=NODE`: "
         "is the agent pod running, restarting, pending?",
         "Its log: probe attach errors, `collector unreachable`, TLS or token refusals "
         "(`fabricscope_collector_auth_failures_total` on the collectors).",
         "`curl NODE:9471/readyz` and `/metrics`: `fabricscope_agent_collector_connected` "
         "0 means it runs but cannot reach a collector.", _PIPELINE_BOARD),
        ("Restart the agent pod; if it cannot attach its BPF programs, check the node's "
         "kernel (BPF, tracefs) as the log says.",
         "Connected 0: check the path and the Service to the collectors, and the node's "
         "token."),
    ),
    board="pipeline",
    cases=(
        Case("an agent silent for 80 s", {_SEEN: "0+1x40 40x200"}, at="120s",
             expect=(_expect(_NODE3, value=80.0),)),
        Case("an agent reporting", {_SEEN: "0+1x200"}, at="120s"),
        Case("an agent that moved to another replica", {
            _SEEN: "0+1x40 40x200", _SEEN_ELSEWHERE: "_x40 41+1x160"}, at="120s"),
        Case(f"an agent silent for over {GONE_S} s counts as removed",
             {_SEEN: f"0+1x10 10x{GONE_S + 100}"}, at=f"{GONE_S + 50}s"),
        Case("an agent scrape failing for a minute", {_series("up", _AGENT): "0x90"},
             at="70s", expect=(_expect(_AGENT, rule=1, value=0.0),)),
        Case("an agent scraped", {_series("up", _AGENT): "1x90"}, at="70s"),
    ))

_GAP = FindingSeries(Cause.TELEMETRY_GAP, "warning", node="node4", id="abb2c3d4e5f6")
_LOST = _series(EVENTS_LOST, _AGENT, probe="tcp")
_REJECTED = _series(RECORDS_REJECTED, _COLLECTOR, reason="unknown_measurement")
_DROPPED = _series(RECORDS_DROPPED, _COLLECTOR, reason="spool_corrupt")
_AGENT_DROPPED = _series(AGENT_DROPPED, _COLLECTOR, node="node3")

TELEMETRY_LOSS = Alert(
    "FabricscopeTelemetryLoss", GROUP,
    "Telemetry lost",
    "",
    rules=(
        Rule(f"increase({EVENTS_LOST}[1m]) > 0", "1m", "warning", signal="events_lost",
             summary="Agent on {node} loses {probe} events",
             description="The {probe} probe of the agent at {instance} (node {node}, scrape "
             "job {job}) lost {value:.0f} kernel events in the last minute, and has kept "
             "losing them for a minute: diagnosis of that node works on partial data."),
        Rule(f"increase({RECORDS_DROPPED}[1m]) > 0", "0s", "warning",
             signal="records_dropped",
             summary="Collector {instance} lost acknowledged records ({reason})",
             description="Collector {instance} (scrape job {job}) dropped {value:.0f} "
             "records it had acknowledged in the last minute ({reason}): they are gone "
             "from InfluxDB."),
        Rule(f"increase({RECORDS_REJECTED}[1m]) > 0", "1m", "warning",
             signal="records_rejected",
             summary="Collector {instance} rejects records ({reason})",
             description="Collector {instance} (scrape job {job}) refused {value:.0f} "
             "records in the last minute ({reason}), and has kept refusing them for a "
             "minute: agents send what this collector's schema does not accept."),
        Rule(f"{across_replicas(f'delta({AGENT_DROPPED}[1m])')} > 0", "1m", "warning",
             signal="agent_dropped",
             summary="Agent on {node} drops records before they reach a collector",
             description="The agent on node {node} reports records it gave up on (spool "
             "full, queue full) for a minute (scrape job {job}): the gap shows in InfluxDB "
             "as agent_loss points."),
        Rule(finding_open(Cause.TELEMETRY_GAP), FOR, FROM_FINDING, signal="telemetry_gap",
             summary="Diagnosis lacks data for job {job} at {place}",
             description="The diagnosis engine lacks data for job {job} at {place} (finding "
             "{id}): what it says about the job there is incomplete. "
             "What is missing: `fabricscope explain {id}`."),
    ),
    runbook=Runbook(
        "Somewhere between the kernel and InfluxDB records are lost, and counted: a probe's "
        "ring buffer overflowed (`fabricscope_agent_events_lost_total`), an agent's spool "
        "or queue was full, a collector refused records (schema version skew, a bad agent) "
        "or lost acknowledged ones from a corrupt spool, or the engine found a node or job "
        "without the data it needs (finding `telemetry_gap`).",
        ("The alert's summary says which counter grew; the labels say where (`probe`, "
         "`reason`, `node`, `instance`).",
         EXPLAIN + " For `signal=\"telemetry_gap\"`: which node or measurement is missing.",
         DIAGNOSE + " Findings of a job with a telemetry gap may be missing or partial.",
         _PIPELINE_BOARD),
        ("Events lost: the node makes more events than its ring buffers hold in one poll; "
         "poll more often (`poll_interval_s`, docs/config.md: rings are sized to one "
         "interval), or turn off a probe the node does not need.",
         "Records rejected: run one fabricscope version on agents and collectors; the "
         "`reason` says what the schema refused.",
         "Agent drops: the collectors cannot keep up or are unreachable; see "
         "FabricscopeCollectorBacklog and FabricscopeAgentDown."),
    ),
    board="pipeline",
    causes=(Cause.TELEMETRY_GAP,),
    cases=finding_cases(_GAP, FOR, rule=4) + (
        Case("a probe losing events for a minute", {_LOST: "0+10x150"}, at="130s",
             expect=(_expect(_AGENT, value=600.0, probe="tcp"),)),
        Case("a probe that lost events once, long ago", {_LOST: "0x10 5x150"}, at="130s"),
        Case("a collector dropping acknowledged records", {_DROPPED: "0x20 3x60"}, at="30s",
             expect=(_expect(_COLLECTOR, rule=1, value=3.0, reason="spool_corrupt"),)),
        Case("a collector rejecting records for a minute", {_REJECTED: "0+1x150"},
             at="130s", expect=(_expect(_COLLECTOR, rule=2, value=60.0,
                                        reason="unknown_measurement"),)),
        Case("an agent dropping records for a minute", {_AGENT_DROPPED: "0+1x150"},
             at="130s", expect=(_expect(_NODE3, rule=3, value=60.0),)),
        Case("nothing lost anywhere", {_LOST: "5x150", _REJECTED: "2x150", _DROPPED: "0x150",
                                       _AGENT_DROPPED: "7x150"}, at="130s"),
    ))

_SPOOL = _series(SPOOL_OLDEST_AGE, _COLLECTOR)
_THROTTLED = _series(BATCHES_THROTTLED, _COLLECTOR, reason="spool_full")

COLLECTOR_BACKLOG = Alert(
    "FabricscopeCollectorBacklog", GROUP,
    "Collector {instance} lags {value:.0f} s behind on InfluxDB writes",
    "The oldest batch in the spool of collector {instance} (scrape job {job}) is "
    "{value:.0f} s old: InfluxDB takes writes slower than the agents send them, or is "
    "down. The data is safe in the spool; dashboards and diagnosis lag behind it.",
    rules=(
        Rule(f"{SPOOL_OLDEST_AGE} > {BACKLOG_WARNING_S} <= {BACKLOG_CRITICAL_S}", "0s", "warning",
             signal="spool_age"),
        Rule(f"{SPOOL_OLDEST_AGE} > {BACKLOG_CRITICAL_S}", "0s", "critical", signal="spool_age"),
        Rule(f"increase({BATCHES_THROTTLED}[1m]) > 0", "1m", "warning", signal="throttled",
             summary="Collector {instance} throttles agents ({reason})",
             description="Collector {instance} (scrape job {job}) has answered batches with "
             "RETRY for a minute ({reason}, {value:.0f} in the last minute): agents keep "
             "data in their own spools until it recovers."),
    ),
    runbook=Runbook(
        "A collector acknowledges batches it has fsynced to its own spool when InfluxDB "
        "fails, and replays them later; the age of the oldest spooled batch is how far "
        f"InfluxDB lags behind. Warning over {BACKLOG_WARNING_S} s, critical over "
        f"{BACKLOG_CRITICAL_S} s (the two bands do not overlap; the age already measures "
        "how long it lasts, so neither waits). Throttling: the spool is full or failing, or "
        "InfluxDB is down with no spool, and the collector asks agents to retry later.",
        ("The collector's log and its sink errors "
         "(`fabricscope_collector_sink_errors_total{kind}` on its /metrics).",
         "InfluxDB itself: `curl INFLUX/ping`, its disk, its write errors.",
         _PIPELINE_BOARD),
        ("Bring InfluxDB back or give it room (disk, memory); the spool replays by itself.",
         "Add collector replicas or spool space (`spool_max_bytes`) if the writes are only "
         "slow."),
    ),
    board="pipeline",
    cases=(
        Case("spool 120 s behind: warning only", {_SPOOL: "120x30"}, at="10s",
             expect=(_expect(_COLLECTOR, value=120.0),)),
        Case("spool 400 s behind: critical only", {_SPOOL: "400x30"}, at="10s",
             expect=(_expect(_COLLECTOR, "critical", rule=1, value=400.0),)),
        Case("spool 30 s behind", {_SPOOL: "30x30"}, at="10s"),
        Case("throttling agents for a minute", {_THROTTLED: "0+2x150"}, at="130s",
             expect=(_expect(_COLLECTOR, rule=2, value=120.0, reason="spool_full"),)),
        Case("no throttling", {_THROTTLED: "0x150"}, at="130s"),
    ))

_UP = 'up{job="%s"}' % COLLECTOR_SCRAPE_JOB
_UP_0 = _series("up", _COLLECTOR)
_UP_1 = _series("up", {**_COLLECTOR, "instance": "collector-1"})

COLLECTOR_DOWN = Alert(
    "FabricscopeCollectorDown", GROUP,
    "Collector {instance} is down",
    "Prometheus has not scraped collector {instance} (scrape job {job}) for a minute; "
    "the other replicas take its agents and its jobs.",
    rules=(
        Rule(f"{_UP} == 0 unless on(job) sum by(job) ({_UP}) == 0", "1m", "warning"),
        Rule(f"sum by(job) ({_UP}) == 0 or absent({_UP})", "1m", "critical",
             summary="No fabricscope collector is up (scrape job {job})",
             description="No collector replica of scrape job {job} has been scraped for a "
             "minute: agents spool, nothing reaches InfluxDB, and no finding alert can "
             "fire."),
    ),
    runbook=Runbook(
        "Collector replicas are stateless and share the agents and the jobs' analysis "
        "between them; one replica down is a warning (the others take over within "
        "seconds), all of them down or none scraped is critical: fabricscope is blind and "
        "its finding alerts are silent.",
        ("`kubectl -n fabricscope get pods -l app.kubernetes.io/name=fabricscope-collector`"
         " and the pods' logs.",
         "Prometheus' targets page: the scrape error of the collector targets.",
         _PIPELINE_BOARD),
        ("Restart or reschedule the replicas; check their memory limit (OOM kills) and "
         "InfluxDB's reachability (a replica that cannot write still answers /metrics).",),
    ),
    board="pipeline",
    cases=(
        Case("one of two replicas down", {_UP_0: "1x90", _UP_1: "0x90"}, at="70s",
             expect=(_expect({**_COLLECTOR, "instance": "collector-1"}, value=0.0),)),
        Case("both replicas down: critical only", {_UP_0: "0x90", _UP_1: "0x90"}, at="70s",
             expect=(_expect({"job": COLLECTOR_SCRAPE_JOB}, "critical", rule=1, value=0.0),)),
        Case("no collector scraped at all", {_series("up", _AGENT): "1x90"}, at="70s",
             expect=(_expect({"job": COLLECTOR_SCRAPE_JOB}, "critical", rule=1),)),
        Case("both replicas up", {_UP_0: "1x90", _UP_1: "1x90"}, at="70s"),
    ))

PIPELINE_ALERTS = (AGENT_DOWN, TELEMETRY_LOSS, COLLECTOR_BACKLOG, COLLECTOR_DOWN)
