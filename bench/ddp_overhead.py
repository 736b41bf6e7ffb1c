"""ddp-overhead: DDP step time in the lab with the agents attached / without.

A 3-node lab, real DDP over gloo. Baseline round: K steps with no agent running.
Subject round: the same K steps with one agent per node (all probes the agent
runs by default, shipping to a real collector and InfluxDB). Agents start before
and stop after each subject round, so every round measures the same thing. The
figure is the median step time of the round, skipping the first step (DDP's
parameter broadcast and gloo's connection set-up).
"""

from __future__ import annotations

import contextlib
import statistics
import uuid

from bench.harness import Benchmark


class _Sides:
    def __init__(self, stack, steps: int):
        self.stack, self.steps = stack, steps

    def _round(self) -> float:
        from lab.training import start_training
        with start_training(self.stack.lab, self.steps, model_mb=8) as run:
            seconds = [row["seconds"] for row in run.steps()][1:]
            if run.wait() != 0:
                raise RuntimeError("training failed")
        return statistics.median(seconds)

    def baseline(self) -> float:
        return self._round()

    def subject(self) -> float:
        from fabricscope.labstack import await_agents_ready, start_agent
        for node in self.stack.lab.nodes:
            start_agent(self.stack, node)
        try:
            await_agents_ready(self.stack)
            return self._round()
        finally:
            for proc in self.stack.agents.values():
                proc.stop()
            self.stack.agents.clear()


@contextlib.contextmanager
def environment(args):
    from fabricscope.labstack import running_stack
    from lab.testing import running_lab
    steps = getattr(args, "steps", None) or 12
    with running_lab(f"bddp{uuid.uuid4().hex[:4]}", 3) as lab:
        with running_stack(lab, agents=False) as stack:
            yield _Sides(stack, steps)


BENCH = Benchmark(
    name="ddp-overhead",
    description="DDP step time with one agent per node / without (3-node lab, gloo)",
    unit="s/step",
    baseline_label="no agent",
    subject_label="agents attached",
    environment=environment,
    repeats=5,
    goal="ratio <= 1.02",
)
