"""`fabricscope agent` at run time: prepare, attach, run the pipeline, stop cleanly.

Order: kernel preparation (only when a BPF probe is enabled; before any
`import bcc`), node addresses, /metrics + /readyz, probes attached one by one (an
unavailable probe is one log line and probe_attached=0, not a failure), ready,
pipeline until SIGTERM/SIGINT, then: last poll, detach probes, flush outputs
(bounded by shutdown_timeout_s), exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

from fabricscope.agent import addresses
from fabricscope.agent.metrics import AgentMetrics
from fabricscope.agent.outputs import JsonlOutput
from fabricscope.agent.pipeline import run_pipeline
from fabricscope.agent.priority import lower_priority
from fabricscope.agent.probes import load_class
from fabricscope.agent.probes.base import (Clock, Probe, ProbeContext, ProbeUnavailable,
                               effective_poll_interval)
from fabricscope.agent.training_join import TrainingJoin
from fabricscope.selfmetrics import Readiness, SelfMetricsServer

log = logging.getLogger("fabricscope.agent")


def build_context(cfg) -> tuple[dict[str, type], ProbeContext]:
    classes = {name: load_class(name) for name in cfg.probes}
    needs_bpf = any(getattr(c, "needs_bpf", False) for c in classes.values())
    if needs_bpf:
        from fabricscope.agent import kernel
        kernel.prepare(cfg.kernel_headers, {name: c.capabilities for name, c in classes.items()})
        addrs = addresses.node_addresses(cfg.addresses)
    else:
        addrs = addresses.parse_addresses(cfg.addresses)
    from fabricscope.agent.kube.setup import build_resolver
    from fabricscope.agent.procmaps import Environments, MapsCache
    return classes, ProbeContext(cfg.node, addrs, Clock(), cfg, maps_cache=MapsCache(),
                                 environments=Environments(), pods=build_resolver(cfg))


def attach_all(classes: dict[str, type], ctx: ProbeContext, metrics) -> list[Probe]:
    attached = []
    for name, cls in classes.items():
        probe = cls(ctx)
        try:
            probe.attach()
        except ProbeUnavailable as exc:
            log.warning("probe %s unavailable: %s", name, exc)
            probe.detach()
            metrics.probe_attached.labels(name).set(0)
            continue
        except Exception as exc:   # a probe bug: report it, run on without that probe
            log.warning("probe %s failed to attach: %s: %s", name, type(exc).__name__, exc,
                        exc_info=log.isEnabledFor(logging.DEBUG))
            probe.detach()
            metrics.probe_attached.labels(name).set(0)
            continue
        metrics.probe_attached.labels(name).set(1)
        attached.append(probe)
    return attached


def detach_all(probes: list[Probe]) -> None:
    for probe in probes:
        try:
            probe.detach()
        except Exception as exc:
            log.warning("probe %s: detach failed: %s", probe.name, exc)


def _load_record_schema() -> None:
    """Import the measurement schema and the line encoder now, not at the first batch:
    their first use would otherwise land (about 50 ms of CPU, more without cached
    bytecode) in the first second after the agent says it is ready."""
    from fabricscope import lineschema, schema
    schema.measurements()
    assert lineschema.canonical_line


async def _serve(cfg, classes, ctx, metrics: AgentMetrics, readiness: Readiness) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    shipper = None
    if cfg.collector:   # before the probes: an unusable spool or credential fails fast
        from fabricscope.agent.shipper import build_shipper
        shipper = build_shipper(cfg, metrics)
    if ctx.pods is not None:    # its first list before the probes name any process
        ctx.pods.cache.on_relist.append(
            lambda: metrics.probe_stats.update("kube", ctx.pods.stats()))
        ctx.pods.cache.start()
        await asyncio.to_thread(ctx.pods.cache.first_done.wait, 5.0)
    probes = await asyncio.to_thread(attach_all, classes, ctx, metrics)
    lower_priority(cfg.nice, cfg.cpu_policy)
    _load_record_schema()
    readiness.mark_ready()
    log.info("agent %s running probes: %s", cfg.node,
             ", ".join(p.name for p in probes) or "none")
    outputs = []
    if cfg.output == "jsonl":
        outputs.append(JsonlOutput(metrics))
    if shipper is not None:
        # Sources that can replay (synthetic) learn which records are safely spooled.
        shipper.on_durable += [p.durable for p in probes if hasattr(p, "durable")]
        outputs.append(shipper.start())
    names = {p.name for p in probes}
    join = TrainingJoin(retransmits_known=bool(names & {"tcp_retransmit", "tcp_flows"}),
                        transfers_per_s=cfg.tcp_transfers_per_s,
                        tail_s=cfg.tcp_transfer_tail_us / 1e6,
                        wall_ns=lambda: ctx.clock.to_wall(time.monotonic_ns()))
    interval = effective_poll_interval(cfg.poll_interval_s, probes)
    if interval < cfg.poll_interval_s:
        log.info("polling every %.3g s, not %.3g s (config poll_interval_s): what probes "
                 "hold in the kernel needs it", interval, cfg.poll_interval_s)
    try:
        await run_pipeline(probes, outputs, node=cfg.node, poll_interval_s=interval,
                           batch_max_records=cfg.batch_max_records,
                           flush_interval_s=cfg.flush_interval_s, metrics=metrics, stop=stop,
                           after_poll=lambda: detach_all(probes), join=join)
    finally:
        detach_all(probes)      # no-op after a normal stop; frees BPF on errors
        if ctx.pods is not None:
            ctx.pods.cache.stop()
        readiness.mark_not_ready("stopped")
    log.info("agent %s counters: %s", cfg.node, all_counts(metrics.probe_stats))
    log.info("agent %s stopped; %s", cfg.node, final_counts(metrics.probe_stats))
    return 0


def final_counts(probe_stats) -> str:
    """The counters worth a line in the log at stop (all are exported as metrics too):
    what each probe lost or skipped, and what the training join did with transfers."""
    def worth(probe: str, key: str) -> bool:
        if probe == "join":
            return key.startswith("transfers_")
        return key in ("lost", "missed_hits", "decode_errors", "handler_errors",
                       "unattributed") or key.endswith(("_recovered_bytes", "_unacked_bytes",
                                                    "_at_close_bytes"))
    return _counter_line(probe_stats, worth) or "nothing lost"


def all_counts(probe_stats) -> str:
    """Every probe's non-zero counters at stop, the line before final_counts': what a
    run saw, filtered and attributed, for a reader without the /metrics of a stopped agent."""
    return _counter_line(probe_stats, lambda probe, key: True) or "none"


def _counter_line(probe_stats, worth) -> str:
    """'probe: key n, ...; ...' of the non-zero counters worth(probe, key) keeps."""
    parts = []
    for probe in probe_stats.names():
        shown = {k: v for k, v in probe_stats.get(probe).items() if v and worth(probe, k)}
        if shown:
            parts.append(f"{probe}: " + ", ".join(f"{k} {v}" for k, v in sorted(shown.items())))
    return "; ".join(parts)


def run_agent(cfg) -> int:
    classes, ctx = build_context(cfg)
    metrics = AgentMetrics()
    readiness = Readiness()
    server = SelfMetricsServer(cfg.metrics_host, cfg.metrics_port, readiness,
                               metrics.registry).start()
    log.info("agent %s serving /metrics and /readyz on %s:%d", cfg.node, cfg.metrics_host,
             server.port)
    try:
        return asyncio.run(_serve(cfg, classes, ctx, metrics, readiness))
    finally:
        server.stop()
