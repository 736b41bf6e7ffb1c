"""iperf3-overhead: iperf3 TCP throughput across the lab with every probe attached / without.

What the issue's goal names: a 2-node lab (fabricscope.lab.topology: each node a namespace
whose NIC is a veth to the lab's bridge; links unshaped, so one TCP stream runs
as fast as the CPUs carry it; RPS off, see _receive_on_sender_cpu), an iperf3
server on node 1 for the whole benchmark, a real collector and InfluxDB.
Baseline round: `iperf3 -c node1 -t T` from node 0, no agent. Subject round: one
agent per node with every default probe (fabricscope.agent.config.DEFAULT_PROBES: tcp_flows,
which includes the retransmits, nic, markers, gloo, nccl), shipping to the
collector, started before the round; the round runs once every agent is ready
and has polled SETTLE_POLLS times (its first polls drain what piled up while it
started: that is `startup`'s cost), and the agents stop after it. Figure:
bits/s received.

Both ends of the link, the bridge between them, both agents, the collector and
InfluxDB share this machine's kernel and CPUs: the sender's CPU runs the egress
programs of node 0 and the ingress programs of node 1 on every data skb, which
on a cluster run on two hosts. `iperf3-overhead-nic` (bench/iperf3_overhead.py)
is the nic probe alone on a bare veth pair, with no agent: the TC program's own
cost. `--steps N` sets T in seconds (default 3).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from pathlib import Path

from fabricscope.bench.agent_footprint import cpu_seconds
from fabricscope.bench.harness import Benchmark
from fabricscope.bench.iperf3_overhead import iperf3_server

SETTLE_POLLS = 4
PORT = 5201


def _receive_on_sender_cpu(lab) -> None:
    """RPS off on every veth of the lab: a frame is received on the CPU that sent it,
    as on the bare pair. With the lab's RPS (up(): every CPU) the stream's hash picks
    the receiving CPU anew for each iperf3 connection, and the throughput splits into
    two modes (17 Gbit/s on the sender's CPU, 10 on the other here)."""
    from fabricscope.lab import exec_argv
    for node in lab.nodes:
        Path(f"/sys/class/net/{node.port}/queues/rx-0/rps_cpus").write_text("0\n")
        subprocess.run(exec_argv(node, ["sh", "-c", f"echo 0 > /sys/class/net/{node.ifname}"
                                        "/queues/rx-0/rps_cpus"]), check=True)


class _Sides:
    def __init__(self, stack, seconds: int):
        self.stack, self.seconds = stack, seconds
        self._extra: dict[str, float] = {}

    def _iperf(self) -> float:
        from fabricscope.lab import exec_argv
        client, server = self.stack.lab.nodes[0], self.stack.lab.nodes[1]
        out = subprocess.run(exec_argv(client, ["iperf3", "-c", server.address, "-p", PORT,
                                                "-t", self.seconds, "-J"]),
                             capture_output=True, text=True, check=True)
        return float(json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"])

    def baseline(self) -> float:
        return self._iperf()

    def subject(self) -> float:
        from fabricscope.lab.stack import await_agent_polls, await_agents_ready, start_agent
        for node in self.stack.lab.nodes:
            start_agent(self.stack, node)
        try:
            await_agents_ready(self.stack)
            await_agent_polls(self.stack, int(os.environ.get("FABRICSCOPE_BENCH_SETTLE_POLLS",
                                                             SETTLE_POLLS)))
            pids = [proc.popen.pid for proc in self.stack.agents.values()]
            cpu0, start = sum(cpu_seconds(p) for p in pids), time.monotonic()
            bps = self._iperf()
            cpu = sum(cpu_seconds(p) for p in pids) - cpu0
            self._extra = {"agents_cpu_pct_of_core": 100 * cpu / (time.monotonic() - start)}
            return bps
        finally:
            for proc in self.stack.agents.values():
                proc.stop()
            self.stack.agents.clear()

    def extra(self) -> dict[str, float]:
        return self._extra


@contextlib.contextmanager
def environment(args):
    from fabricscope.lab.stack import running_stack
    from fabricscope.lab.running import running_lab
    seconds = getattr(args, "steps", None) or 3
    with running_lab(f"bip{uuid.uuid4().hex[:4]}", 2, shape_links=False) as lab, \
            running_stack(lab, agents=False) as stack, iperf3_server(lab.nodes[1].netns, PORT):
        _receive_on_sender_cpu(lab)
        sides = _Sides(stack, seconds)
        sides.baseline()            # warm-up: the first stream after the lab is up
        yield sides


BENCH = Benchmark(
    name="iperf3-overhead",
    description="iperf3 TCP throughput across a 2-node lab with one agent per node (every "
                "default probe) / without",
    unit="bit/s",
    baseline_label="no agent",
    subject_label="agents, every probe",
    environment=environment,
    repeats=5,
    goal="ratio >= 0.97",
)
