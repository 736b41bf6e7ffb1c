"""Benchmarks (`fabricscope bench NAME`): ratios against a baseline in the same run.

Registry: benchmark name -> module exposing BENCH (a fabricscope.bench.harness.Benchmark), or
"module:NAME" for another Benchmark of that module.
Modules are imported only when their benchmark runs or is listed.
"""

REGISTRY: dict[str, str] = {
    "ddp-overhead": "fabricscope.bench.ddp_overhead",
    "ddp-overhead-pinned": "fabricscope.bench.ddp_overhead:PINNED",
    "ddp-overhead-one-node": "fabricscope.bench.ddp_overhead:ONE_NODE",
    "ddp-idle-spinner": "fabricscope.bench.ddp_overhead:SPINNER",
    "ddp-tc-hook": "fabricscope.bench.ddp_overhead:TC_HOOK",
    "iperf3-overhead": "fabricscope.bench.iperf3_lab",
    "iperf3-overhead-nic": "fabricscope.bench.iperf3_overhead",
    "marker-cost": "fabricscope.bench.marker_cost",
    "uprobe-cost": "fabricscope.bench.uprobe_cost",
    "collector-ingest": "fabricscope.bench.collector_ingest",
    "influx-write": "fabricscope.bench.influx_write",
    "wire-bytes": "fabricscope.bench.wire_bytes",
    "agent-footprint": "fabricscope.bench.agent_footprint",
    "startup": "fabricscope.bench.startup",
    "diagnosis-matrix": "fabricscope.bench.diagnosis_matrix",
    "diagnosis-cost": "fabricscope.bench.diagnosis_cost",
}
