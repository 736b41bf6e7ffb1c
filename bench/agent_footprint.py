"""agent-footprint: what one agent costs its node, idle and under DDP traffic.

A 3-node lab with InfluxDB, a collector and one agent per node (the agent's
default probes, shipping), all real (fabricscope.lab.stack). Baseline round:
the agents idle for `--steps` x 1 s. Subject round: a real gloo DDP run of
`--steps` steps (8 MiB model) on the three nodes. The figure: agent CPU seconds
per wall second (utime + stime from /proc/PID/stat, mean over the 3 agents) over
the round; ratio = busy / idle.

Extra figures (medians of the subject rounds):
- agent_rss_mib: the largest agent's resident memory at the end of the round;
- wire_pkts_per_s: TCP segments in + out of the three nodes (nstat TcpInSegs +
  TcpOutSegs deltas: every packet the kernel's TCP handled);
- user_events_per_s: what reached the agents' user space from the kernel (ring
  buffer events + flow map entries read, from the probes' own counters);
- aggregation_ratio: wire packets per user-space event.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid

from fabricscope.bench.harness import Benchmark

_TICK = os.sysconf("SC_CLK_TCK")
#: probe counters that are records or map entries crossing into user space
_USER_EVENTS = ("emitted", "flow_events_emitted", "flows_read")


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK      # utime, stime


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class _Sides:
    def __init__(self, stack, steps: int):
        self.stack, self.steps = stack, steps
        self._extra: dict[str, float] = {}

    def _pids(self) -> list[int]:
        return [p.popen.pid for p in self.stack.agents.values()]

    def _user_events(self) -> float:
        return sum(self.stack.agent_metric(i, "fabricscope_agent_probe_events_total",
                                           {"probe": "tcp_flows", "event": e})
                   for i in self.stack.agents for e in _USER_EVENTS)

    def _wire(self) -> int:
        from fabricscope.lab.stack import nstat_counter
        return sum(nstat_counter(n.netns, c) for n in self.stack.lab.nodes
                   for c in ("TcpInSegs", "TcpOutSegs"))

    def _measure(self, work) -> float:
        pids = self._pids()
        cpu0 = [cpu_seconds(p) for p in pids]
        wire0, events0, t0 = self._wire(), self._user_events(), time.monotonic()
        work()
        seconds = time.monotonic() - t0
        cpu = sum(cpu_seconds(p) - c for p, c in zip(pids, cpu0)) / len(pids) / seconds
        wire, events = self._wire() - wire0, self._user_events() - events0
        self._extra = {"agent_rss_mib": max(rss_mib(p) for p in pids),
                       "wire_pkts_per_s": wire / seconds,
                       "user_events_per_s": events / seconds,
                       "aggregation_ratio": wire / events if events else float("nan")}
        return cpu

    def baseline(self) -> float:
        return self._measure(lambda: time.sleep(self.steps))

    def subject(self) -> float:
        from fabricscope.lab.training import start_training

        def train():
            with start_training(self.stack.lab, self.steps, model_mb=8) as run:
                list(run.steps())
                if run.wait() != 0:
                    raise RuntimeError(f"training failed: {run.error}")
            time.sleep(1.5)          # the last window is cut and read
        return self._measure(train)

    def extra(self) -> dict[str, float]:
        return dict(self._extra)     # of the last round: the subject's


@contextlib.contextmanager
def environment(args):
    from fabricscope.lab.stack import running_stack
    from fabricscope.lab.running import running_lab
    steps = getattr(args, "steps", None) or 10
    with running_lab(f"bfp{uuid.uuid4().hex[:4]}", 3) as lab:
        with running_stack(lab) as stack:
            yield _Sides(stack, steps)


BENCH = Benchmark(
    name="agent-footprint",
    description="agent CPU s/s and RSS, idle vs under 3-node gloo DDP; events to user "
                "space vs wire packets",
    unit="CPU s/s",
    baseline_label="idle agents",
    subject_label="agents under DDP",
    environment=environment,
    repeats=3,
)
