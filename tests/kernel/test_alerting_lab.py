"""Live: a real lab's faults page through a real Prometheus and a real Alertmanager.

One 3-node lab with wire-sized frames, InfluxDB + a collector running the live
diagnosis engine + one agent per node (fabricscope.lab.stack), and one long DDP job over gloo.
Prometheus scrapes the collector (honor_labels: a finding's `job` is the training
job) and the agents every second and evaluates the generated rules
(deploy/prometheus/fabricscope-alerts.yaml); Alertmanager, with the example's
routes and inhibitions at timings of seconds, delivers to a webhook receiver the
test runs (tests/support/alerting.py alerting_pipeline). The job is driven by its own
steps, in three phases:
1. healthy: once the engine has the job's baseline and exports its gauges, the
   job runs HEALTHY_S seconds and HEALTHY_STEPS steps more; no notification may
   arrive (info alerts are held back by the inhibitor, nothing else fires);
2. 2 % random loss on node 1's switch port pages FabricscopeLossyLink at node1;
   clearing it brings the alert's resolved notification;
3. node 2's ranks get a CPU quota on every other step, shrinking step by step
   (JITTER_QUOTAS), lifted on the steps between: the spread of step times grows
   while no rank is late two steps in a row (what the straggler rule wants), and
   FabricscopeJitterAccumulating pages for the job.
It prints a timeline (phases and the first notification of each alert) and each
alert's time from fault to page and from clearing to resolved.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from dataclasses import dataclass, field

import pytest

from tests.support.servers import ALERTMANAGER, PROMETHEUS

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not (os.access(PROMETHEUS, os.X_OK) and os.access(ALERTMANAGER, os.X_OK)),
                       reason=f"{PROMETHEUS} or {ALERTMANAGER} missing (make setup installs "
                              "Debian's prometheus and prometheus-alertmanager)"),
    pytest.mark.timeout(420),
]

STEPS = 500                  # more than the test needs; ended by terminate
#: samples per rank per step, four times the default: a throttled rank has that much
#: more to compute, and a 5 % quota makes its step late by about 0.8 s instead of 0.4 s
BATCH = 128
MASTER_PORT = 29500          # each lab node is a namespace of its own: no clash
#: the healthy phase watches this long at least (and HEALTHY_STEPS steps): as long as
#: the loss's fault-to-page time (15-20 s here), so that a false finding of the healthy
#: job would have paged in it as the loss did
HEALTHY_S = 20
HEALTHY_STEPS = 25
BASELINE_WITHIN_STEPS = 60   # the engine's baseline is steps 3-10 of every rank
LOSSY_NODE, SLOW_NODE = 1, 2
#: node 2's CPU share (% of one CPU) on the even steps of phase 3, lifted on the odd ones.
#: A rank here needs a small share of a CPU (its steps wait on the ring most of the
#: time), so shares above ~20 % change little; 40/k % makes each throttled step late
#: by about k units: the spread grows step by step
JITTER_QUOTAS = (40, 20, 13, 10, 8, 7, 6, 5)
#: a quota of every CPU cannot throttle: the quota lifted in a millisecond, where
#: faults.clear (which also rewrites the port's nft rules and qdisc) takes tens, which
#: would spill into node 2's next step (it computes already when rank 0's line comes)
#: and make it late twice in a row
NO_QUOTA = 100 * (os.cpu_count() or 1)
#: generous: a page takes `for` (10 s or 30 s) plus detection, scrape, evaluation and
#: grouping; a slow machine stretches it, and the test waits for the event
PAGE_TIMEOUT_S = 150


@dataclass
class Live:
    lab: object
    stack: object
    training: object
    alerting: object             # tests.support.alerting.AlertingPipeline
    store: object
    job: str
    #: phase 3, per step: (step, seconds, quota, spread gauge, open findings)
    trace: list = field(default_factory=list)
    marks: list = field(default_factory=list)    # (what, time.monotonic(), rank 0's step)
    phase3_ns: int = 0

    def mark(self, what: str) -> float:
        at = time.monotonic()
        self.marks.append((what, at, self.training.records[-1]["step"]
                           if self.training.records else None))
        return at

    def timeline(self) -> str:
        """The marks and the first notification of each alert and status, in time order."""
        first: dict[tuple, float] = {}
        for note in self.alerting.hook.matching(lambda n: True):
            for a in note.alerts:
                key = (a["labels"]["alertname"], a["labels"].get("severity"), a["status"])
                first.setdefault(key, note.received_at)
        events = self.marks + [(f"webhook: {name} ({severity}) {status}", at, None)
                               for (name, severity, status), at in first.items()]
        start = self.marks[0][1]
        return "\n".join(f"  {at - start:6.1f} s  {'' if step is None else f'step {step}':9} "
                         f"{what}" for what, at, step in sorted(events, key=lambda e: e[1]))

    def collector_metrics(self) -> str:
        from fabricscope.lab.stack import http_get
        return http_get(self.stack.collector_metrics_url)[1]

    def gauge(self, name: str, text: str | None = None) -> float | None:
        """The job's gauge on the collector's /metrics (or in `text`), None if absent."""
        from fabricscope.lab.stack import metric_value
        text = self.collector_metrics() if text is None else text
        return metric_value(text, name, {"job": self.job}) if \
            f'{name}{{job="{self.job}"}}' in text else None

    def open_findings(self, text: str | None = None) -> list[tuple[str, str]]:
        """(cause, severity) of the job's findings the collector exports as open."""
        from fabricscope.diagnosis.metrics import FINDING_ACTIVE
        from prometheus_client.parser import text_string_to_metric_families
        text = self.collector_metrics() if text is None else text
        return sorted((s.labels["cause"], s.labels["severity"])
                      for f in text_string_to_metric_families(text) if f.name == FINDING_ACTIVE
                      for s in f.samples if s.labels.get("job") == self.job)

    def new_steps(self):
        """Rank 0's step lines from the next one on (the queue also holds older ones)."""
        last = self.training.records[-1]["step"] if self.training.records else -1
        for rec in self.training.steps():
            if rec["step"] > last:
                yield rec
        raise AssertionError(f"the job ended: {self.training.error}")

    def diagnostics(self) -> str:
        """What the engine exports and wrote: for a failure's message."""
        gauges = [ln for ln in self.collector_metrics().splitlines()
                  if ln.startswith(("fabricscope_job_", "fabricscope_finding_active"))]
        findings = [(r.get("cause"), r.get("node"), r.get("severity"), r.get("open"),
                     r.get("summary"))
                    for r in self.store.query(f"SELECT * FROM finding WHERE job = '{self.job}'")]
        trace = "\n".join(f"  step {s} {sec:.3f} s quota {q} spread {sp} open {op}"
                          for s, sec, q, sp, op in self.trace)
        if self.phase3_ns:      # the steps as the engine reads them (agents' gloo_step)
            trace += "\nrank 0's gloo_step in the store:\n" + "\n".join(
                f"  {r['time']} {r.get('seconds')} sync {r.get('sync_seconds')}"
                for r in self.store.query(
                    "SELECT seconds, sync_seconds FROM gloo_step WHERE job = "
                    f"'{self.job}' AND rank = '0' AND time > {self.phase3_ns - 10**10}"))
        return (f"\ntimeline:\n{self.timeline()}\ncollector gauges:\n  " +
                "\n  ".join(gauges) + "\nfindings:\n  " + "\n  ".join(map(str, findings)) +
                (f"\nphase 3 steps:\n{trace}" if trace else ""))


@pytest.fixture(scope="module")
def live():
    from fabricscope.diagnosis.store import Store
    from fabricscope.lab.stack import running_stack
    from fabricscope.lab.running import running_lab
    from fabricscope.lab.training import start_training
    from fabricscope.surface.metrics import AGENT_SCRAPE_JOB, COLLECTOR_SCRAPE_JOB
    from tests.support.alerting import alerting_pipeline

    began = [("lab and stack starting", time.monotonic(), None)]
    with running_lab(nodes=3, wire_frames=True) as lab, running_stack(lab) as stack:
        collector = urllib.parse.urlsplit(stack.collector_metrics_url).netloc
        agents = [urllib.parse.urlsplit(stack.agent_url(n.index, "")).netloc for n in lab.nodes]
        with alerting_pipeline({COLLECTOR_SCRAPE_JOB: [collector],
                                AGENT_SCRAPE_JOB: agents}) as alerting, \
                start_training(lab, STEPS, model_mb=8, batch=BATCH, master_port=MASTER_PORT,
                               timeout_s=400) as training:
            run = Live(lab, stack, training, alerting, Store(stack.influx.url),
                       f"{lab.nodes[0].address}:{MASTER_PORT}", marks=began)
            run.mark("job started")
            yield run
            training.terminate()


def _healthy(live: Live) -> float:
    """Until the engine has the job's baseline, then HEALTHY_S and HEALTHY_STEPS more:
    nothing may page. Returns the seconds watched after the baseline."""
    from fabricscope.surface.metrics import JOB_JITTER_BASELINE, JOB_STEP
    steps = live.new_steps()
    for n, _ in enumerate(steps):
        if live.gauge(JOB_STEP) and live.gauge(JOB_JITTER_BASELINE):
            break
        assert n < BASELINE_WITHIN_STEPS, "no baseline gauges" + live.diagnostics()
    since = live.mark("baseline and job gauges exported")
    for n, _ in enumerate(steps, 1):
        if n >= HEALTHY_STEPS and time.monotonic() - since >= HEALTHY_S:
            break
    watched = time.monotonic() - since
    paged = [(n.receiver, [(a["labels"]["alertname"], a["labels"].get("severity"))
                           for a in n.alerts]) for n in live.alerting.hook.matching(lambda n: True)]
    assert paged == [], f"a healthy job paged: {paged}" + live.diagnostics()
    return watched


def _lossy_link(live: Live) -> tuple[float, float]:
    """Loss on node 1's port pages FabricscopeLossyLink at node1; clearing it resolves
    the alert. Returns (fault to page, clear to resolved) in seconds."""
    from fabricscope.lab import faults
    from fabricscope.surface.alerting.alertmanager import SEVERITY_RECEIVERS
    from tests.support.alerting import alerts_in
    hook, labels = live.alerting.hook, {"job": live.job, "node": f"node{LOSSY_NODE}"}
    faults.loss(live.lab, LOSSY_NODE, 2)
    fault_at = live.mark(f"2 % loss on node{LOSSY_NODE}'s port")
    try:
        page = hook.wait_for(alerts_in("FabricscopeLossyLink", **labels), PAGE_TIMEOUT_S)
    except TimeoutError as exc:
        pytest.fail(f"{exc}{live.diagnostics()}")
    alert = page.alerts_of("FabricscopeLossyLink", **labels)[0]
    assert alert["labels"]["cause"] == "lossy_link"
    assert page.receiver == SEVERITY_RECEIVERS[alert["labels"]["severity"]]
    assert alert["annotations"]["summary"].startswith(f"Lossy link at node{LOSSY_NODE}")
    elsewhere = [a["labels"] for n in hook.matching(alerts_in("FabricscopeLossyLink"))
                 for a in n.alerts_of("FabricscopeLossyLink")
                 if a["labels"].get("node") != f"node{LOSSY_NODE}"]
    assert elsewhere == [], f"lossy link paged elsewhere: {elsewhere}"

    faults.clear(live.lab, LOSSY_NODE)
    cleared_at = live.mark("loss cleared")
    try:
        resolved = hook.wait_for(alerts_in("FabricscopeLossyLink", "resolved", **labels,
                                           id=alert["labels"]["id"]), PAGE_TIMEOUT_S)
    except TimeoutError as exc:
        pytest.fail(f"{exc}{live.diagnostics()}")
    assert resolved.received_at > cleared_at
    return page.received_at - fault_at, resolved.received_at - cleared_at


def _await_no_explaining_finding(live: Live) -> None:
    """The engine starts its jitter trend over while a finding that explains the steps
    is open (diagnosis/engine.py): phase 3 starts once the loss's findings closed."""
    from fabricscope.diagnosis.causes import EXPLAINING_CAUSES
    for _ in live.new_steps():
        if not [c for c, severity in live.open_findings()
                if c in EXPLAINING_CAUSES and severity != "info"]:
            live.mark("no explaining finding open")
            return


def _growing_jitter(live: Live) -> float:
    """Node 2's quota on every other step, shrinking: FabricscopeJitterAccumulating
    pages. Returns fault (first quota) to page in seconds."""
    from fabricscope.lab import faults
    from fabricscope.surface.metrics import JOB_JITTER
    from tests.support.alerting import alerts_in
    hook = live.alerting.hook
    jitter = alerts_in("FabricscopeJitterAccumulating", job=live.job)
    started_at, quota = None, None
    live.phase3_ns = time.time_ns()
    try:
        for n, rec in enumerate(live.new_steps()):
            ran_under = quota
            # first, as the line comes: node 2's ranks are computing the next step already,
            # and a late change would spill into it
            if hook.matching(jitter):
                break
            quota = JITTER_QUOTAS[min(n // 2, len(JITTER_QUOTAS) - 1)] if n % 2 == 0 else None
            faults.cpu(live.lab, SLOW_NODE, quota or NO_QUOTA)
            started_at = started_at or live.mark(f"first CPU quota on node{SLOW_NODE}")
            text = live.collector_metrics()
            live.trace.append((rec["step"], rec["seconds"], ran_under,
                               live.gauge(JOB_JITTER, text), live.open_findings(text)))
            if time.monotonic() - started_at > PAGE_TIMEOUT_S:
                pytest.fail(f"no FabricscopeJitterAccumulating page in {PAGE_TIMEOUT_S} s"
                            f"{live.diagnostics()}")
    finally:
        faults.clear(live.lab, SLOW_NODE)
    page = hook.matching(jitter)[0]
    alert = page.alerts_of("FabricscopeJitterAccumulating", job=live.job)[0]
    assert alert["labels"]["severity"] == "warning", alert["labels"]
    print(f"\njitter page: signal {alert['labels'].get('signal')}, "
          f"{alert['annotations']['summary']}")
    return page.received_at - started_at


def test_lab_faults_page_and_resolve_and_a_healthy_run_pages_nothing(live):
    watched = _healthy(live)
    lossy_page, lossy_resolved = _lossy_link(live)
    _await_no_explaining_finding(live)
    jitter_page = _growing_jitter(live)
    print(f"\ntimeline:\n{live.timeline()}")
    print(f"healthy: {watched:.1f} s after the baseline, no page")
    print(f"{'alert':<32}{'fault -> page s':>18}{'clear -> resolved s':>22}")
    print(f"{'FabricscopeLossyLink':<32}{lossy_page:>18.1f}{lossy_resolved:>22.1f}")
    print(f"{'FabricscopeJitterAccumulating':<32}{jitter_page:>18.1f}{'-':>22}")
    print("paged:", sorted(live.alerting.pages()))
