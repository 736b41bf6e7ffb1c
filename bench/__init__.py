"""Benchmarks (`fabricscope bench NAME`): ratios against a baseline in the same run.

Registry: benchmark name -> module exposing BENCH (a bench.harness.Benchmark), or
"module:NAME" for another Benchmark of that module.
Modules are imported only when their benchmark runs or is listed.
"""

REGISTRY: dict[str, str] = {
    "ddp-overhead": "bench.ddp_overhead",
    "ddp-overhead-pinned": "bench.ddp_overhead:PINNED",
    "ddp-overhead-one-node": "bench.ddp_overhead:ONE_NODE",
    "ddp-idle-spinner": "bench.ddp_overhead:SPINNER",
    "ddp-tc-hook": "bench.ddp_overhead:TC_HOOK",
    "iperf3-overhead": "bench.iperf3_lab",
    "iperf3-overhead-nic": "bench.iperf3_overhead",
    "marker-cost": "bench.marker_cost",
    "uprobe-cost": "bench.uprobe_cost",
    "collector-ingest": "bench.collector_ingest",
    "influx-write": "bench.influx_write",
    "wire-bytes": "bench.wire_bytes",
    "agent-footprint": "bench.agent_footprint",
    "startup": "bench.startup",
    "diagnosis-matrix": "bench.diagnosis_matrix",
    "diagnosis-cost": "bench.diagnosis_cost",
}
