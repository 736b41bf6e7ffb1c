"""ddp-overhead: DDP step time in the lab with the agents attached / without.

A 3-node lab, real DDP over gloo, ONE training run for the whole benchmark; the
agents (one per node, every default probe, shipping to a real collector and
InfluxDB) are started and stopped around it. Baseline round: the median time of
`--steps` consecutive steps with no agent running. Subject round: the agents
start, and once every one is ready (BCC compiled, probes attached) the median
time of the next `--steps` steps; then the agents stop. After every switch SETTLE
steps are skipped (an agent's start or exit, the kernel detaching its programs),
and a subject round begins only once every agent has polled its probes
SETTLE_POLLS times: an agent's first polls drain what piled up while it started
(the NIC bins since its first probe attached, two seconds of them; the step
markers the job wrote before), which is start-up work. Measured on this lab, an
agent uses 2-3x its steady CPU in the first 3 s after it is ready (`startup`
measures start-up itself). FABRICSCOPE_BENCH_SETTLE_POLLS=0 measures from
readiness on, as this benchmark did before.

`ddp-overhead-pinned` is the same with the ranks on CPUs of their own (all but
the last) and everything else (agents, collector, InfluxDB) on the last one: how a
GPU node runs training under Kubernetes' static CPU manager (a Guaranteed pod gets
exclusive cores, DaemonSets share the rest). What the agents then cost the
training is what runs in the ranks' own context: the TC programs on their sends,
the TCP tracepoints in their stack processing, the uprobes on their collectives.
Three agents share this one kernel, so each tracepoint and uprobe fires three
times (two of them exit at the namespace check): a node of its own has a third of
that.

`ddp-overhead-one-node` starts one agent only, on node 1 (every default probe;
nodes 0 and 2 go unobserved): what one node's agent costs the job. On a cluster
each node has a kernel and cores of its own, so a rank pays for its own node's
agent; in `ddp-overhead` every rank pays for all three, which share this kernel
and these two cores. The one agent still shares the cores with all three ranks,
so this too overstates what a node with cores to spare pays.

FABRICSCOPE_BENCH_AGENTS_STOPPED=1: the agents are frozen (SIGSTOP) once ready,
so their programs run in the kernel while their user space does nothing: what
the kernel side alone costs. FABRICSCOPE_AGENT_PROBES=...: agents with only those
probes. `ddp-idle-spinner` puts a SCHED_IDLE busy loop in place of the agents: on
a machine where idle-priority work is free, its ratio is 1.00. `ddp-tc-hook` puts
TC programs that return at once on every node's NIC in their place, no agent:
the floor any TC-based probe pays here.

Why one run and not a fresh training per round: on this 2-core machine three
ranks share two cores, and how the scheduler places them differs from run to run
by +-5 % of the step time, more than the effect measured. Within one run the
placement, the model and the sockets stay the same, so what changes between
rounds is only whether the agents run. What an agent costs while it starts is
`fabricscope bench startup`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import statistics
import subprocess
import sys
import uuid

from fabricscope.bench.harness import Benchmark
from fabricscope.errors import UserError

SETTLE = 10                 # steps skipped after every switch
SETTLE_POLLS = 4            # polls every agent has done before a subject round measures
DEFAULT_BLOCK = 100         # steps per round (--steps)
ENDLESS = 10**7             # the training's step count: ended by the benchmark


class _Sides:
    def __init__(self, stack, run, block: int, subject: str = "agents",
                 agent_nodes: list[int] | None = None):
        self.stack, self.run, self.block, self.kind = stack, run, block, subject
        #: indexes of the lab nodes that get an agent (None: every node)
        self.agent_nodes = agent_nodes

    def _measure(self) -> float:
        from fabricscope.lab.stack import await_condition
        run, first = self.run, len(self.run.records) + SETTLE
        want = first + self.block

        def enough() -> bool:
            if len(run.records) >= want:
                return True
            if run.poll() is not None:
                raise RuntimeError(f"the training ended after {len(run.records)} steps: "
                                   f"{run.error or 'no error reported'}")
            return False

        await_condition(enough, 60 + self.block, f"{self.block} training steps", 0.05)
        return statistics.median(r["seconds"] for r in run.records[first:want])

    def baseline(self) -> float:
        return self._measure()

    def subject(self) -> float:
        if self.kind == "spinner":
            return self._with_spinner()
        if self.kind == "tc-hook":
            return self._with_bare_hooks()
        from fabricscope.lab.stack import await_agent_polls, await_agents_ready, start_agent
        nodes = self.stack.lab.nodes
        for node in (nodes if self.agent_nodes is None else [nodes[i] for i in self.agent_nodes]):
            start_agent(self.stack, node)
        stopped = []
        try:
            await_agents_ready(self.stack)
            await_agent_polls(self.stack, int(os.environ.get("FABRICSCOPE_BENCH_SETTLE_POLLS",
                                                             SETTLE_POLLS)))
            if self.kind == "agents-stopped":
                # the programs stay attached and run in the kernel; user space is frozen
                for proc in self.stack.agents.values():
                    os.kill(proc.popen.pid, signal.SIGSTOP)
                    stopped.append(proc.popen.pid)
            return self._measure()
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
            for proc in self.stack.agents.values():
                proc.stop()
            self.stack.agents.clear()

    def _with_bare_hooks(self) -> float:
        """TC programs that return at once (bench/nic_parts.py, FS_NIC_PARTS=0) on both
        directions of every node's NIC, no agent: what any TC-based probe pays.
        FABRICSCOPE_BENCH_NIC_PARTS=mask attaches that variant instead (7: the whole nic
        program, with no agent reading what it counts)."""
        from fabricscope.bench.nic_parts import attached
        from fabricscope.lab import exec_argv
        parts = int(os.environ.get("FABRICSCOPE_BENCH_NIC_PARTS", "0"))
        with contextlib.ExitStack() as hooks:
            for node in self.stack.lab.nodes:
                hooks.enter_context(attached(parts, node.ifname, exec_argv(node, [])))
            return self._measure()

    def _with_spinner(self) -> float:
        """A busy loop at the lowest priority there is (SCHED_IDLE)."""
        spin = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                preexec_fn=lambda: os.sched_setscheduler(
                                    0, os.SCHED_IDLE, os.sched_param(0)))
        try:
            return self._measure()
        finally:
            spin.kill()
            spin.wait()


def split_cpus() -> tuple[set[int], set[int]]:
    """(training CPUs, the rest's CPUs): all but the highest-numbered allowed CPU, and it."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        raise UserError(f"ddp-overhead-pinned needs 2 CPUs, this process may use {len(allowed)}",
                        "run it on a machine with more CPUs, or run ddp-overhead")
    return set(allowed[:-1]), {allowed[-1]}


@contextlib.contextmanager
def environment(args, pinned: bool = False, subject: str | None = None,
                agent_nodes: list[int] | None = None):
    from fabricscope.lab.stack import running_stack
    from fabricscope.lab.running import running_lab
    from fabricscope.lab.training import start_training
    block = getattr(args, "steps", None) or DEFAULT_BLOCK
    train_cpus, rest_cpus = split_cpus() if pinned else (None, None)
    before = os.sched_getaffinity(0)
    try:
        if rest_cpus:
            # inherited by everything started from here: the lab's helpers, collector,
            # InfluxDB and the agents; the ranks are pinned by start_training
            os.sched_setaffinity(0, rest_cpus)
        with running_lab(f"bddp{uuid.uuid4().hex[:4]}", 3) as lab:
            with running_stack(lab, agents=False) as stack:
                # as many steps as the rounds take (an agent's start-up under this load
                # takes hundreds); the run is ended when the benchmark is done
                with start_training(lab, ENDLESS, model_mb=8, cpus=train_cpus) as run:
                    sides = _Sides(stack, run, block, subject or (
                        "agents-stopped" if os.environ.get("FABRICSCOPE_BENCH_AGENTS_STOPPED")
                        else "agents"), agent_nodes)
                    sides._measure()           # warm-up: DDP's first steps, connection set-up
                    yield sides
    finally:
        os.sched_setaffinity(0, before)


BENCH = Benchmark(
    name="ddp-overhead",
    description="DDP step time with one agent per node / without (3-node lab, gloo, one run)",
    unit="s/step",
    baseline_label="no agent",
    subject_label="agents attached",
    environment=environment,
    repeats=8,
    goal="ratio <= 1.02",
)

PINNED = Benchmark(
    name="ddp-overhead-pinned",
    description="ddp-overhead with the ranks on CPUs of their own, agents and the rest on "
                "another (static CPU manager)",
    unit="s/step",
    baseline_label="no agent",
    subject_label="agents attached",
    environment=functools.partial(environment, pinned=True),
    repeats=8,
    goal="ratio <= 1.02",
)

ONE_NODE = Benchmark(
    name="ddp-overhead-one-node",
    description="ddp-overhead with one agent, on node 1 only: what one node's agent costs "
                "the job",
    unit="s/step",
    baseline_label="no agent",
    subject_label="agent on node 1",
    environment=functools.partial(environment, agent_nodes=[1]),
    repeats=8,
)

TC_HOOK = Benchmark(
    name="ddp-tc-hook",
    description="DDP step time with bare TC hooks (programs that return at once) on every "
                "node's NIC / without: the floor of any TC-based probe on this machine",
    unit="s/step",
    baseline_label="no hook",
    subject_label="bare TC hooks",
    environment=functools.partial(environment, subject="tc-hook"),
    repeats=8,
)

SPINNER = Benchmark(
    name="ddp-idle-spinner",
    description="DDP step time with one SCHED_IDLE busy loop / without: what CPU time taken "
                "at the lowest priority costs the training on this machine",
    unit="s/step",
    baseline_label="no spinner",
    subject_label="SCHED_IDLE spinner",
    environment=functools.partial(environment, subject="spinner"),
    repeats=5,
)
