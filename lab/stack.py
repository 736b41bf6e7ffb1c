"""The whole system on one machine: InfluxDB, a collector and one agent per lab node.

Used by `fabricscope demo`, the end-to-end tests and the lab benchmarks, so that
all three start the stack the same way. Every process is a real one, started as
a subprocess by pid and stopped by pid; `running_stack` always tears down what it
started, also on errors and Ctrl-C.

Agents run inside their node's network namespace (`ip netns exec`), exactly as
a DaemonSet pod runs in its node's; they reach the collector through the lab's
bridge address, which is the root namespace's address on the lab subnet.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from fabricscope.errors import UserError

AGENT_METRICS_PORT = 9471
#: how the stack runs fabricscope: this interpreter's (a checkout or its install)
FABRICSCOPE = (sys.executable, "-m", "fabricscope")


def await_condition(check, timeout_s: float, what: str, interval_s: float = 0.1):
    """Poll `check()` until it returns a truthy value; raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


def await_stable(read, quiet_s: float, timeout_s: float, what: str, interval_s: float = 0.25):
    """Poll `read()` until its value has not changed for `quiet_s`; return that value.

    For counters that settle after an activity ends (e.g. retransmits of a closing
    connection, records still being shipped)."""
    deadline = time.monotonic() + timeout_s
    value, since = read(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} still changing after {timeout_s:.0f} s (last {value!r})")
        time.sleep(interval_s)
        now = read()
        if now != value:
            value, since = now, time.monotonic()
    return value


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, str]:
    """fabricscope.services.http_get for pollers: text body, and (0, "") when
    nothing answers yet instead of an exception."""
    from fabricscope.services import http_get as get
    try:
        status, body = get(url, timeout=timeout_s)
    except OSError:          # URLError, refused, timed out
        return 0, ""
    return status, body.decode(errors="replace")


@dataclass
class Proc:
    """A subprocess we started, with its log file."""

    name: str
    popen: subprocess.Popen
    log_path: Path
    urls: dict = field(default_factory=dict)    # what it serves ("grpc", "metrics")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout_s: float = 10.0) -> int | None:
        from fabricscope.services import terminate
        return terminate(self.popen, timeout_s)


def start_proc(name: str, argv: list[str], workdir: Path, env: dict | None = None) -> Proc:
    log_path = workdir / f"{name}.log"
    log = open(log_path, "wb")
    popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env={**os.environ, **(env or {})})
    log.close()
    return Proc(name, popen, log_path)


@dataclass
class Stack:
    lab: object                      # fabricscope.lab.topology.Lab
    workdir: Path
    influx: object | None = None     # fabricscope.services.InfluxServer
    collector: Proc | None = None
    collector_addr: str = ""
    collector_metrics_url: str = ""
    replicas: list[Proc] = field(default_factory=list)     # every collector, the first too
    agents: dict[int, Proc] = field(default_factory=dict)
    command: tuple[str, ...] = FABRICSCOPE   # what runs the collectors and agents

    def agent_url(self, node_index: int, path: str) -> str:
        return f"http://{self.lab.nodes[node_index].address}:{AGENT_METRICS_PORT}{path}"

    def agent_metric(self, node_index: int, name: str, labels: dict | None = None) -> float:
        """Sum of one metric's samples on a node's agent /metrics (0 when absent)."""
        return metric_value(http_get(self.agent_url(node_index, "/metrics"))[1], name, labels)


def metric_value(text: str, name: str, labels: dict | None = None) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not m or m.group(1) != name:
            continue
        if labels and not all(f'{k}="{v}"' in (m.group(2) or "") for k, v in labels.items()):
            continue
        total += float(m.group(3))
    return total


def start_collector(stack: Stack, influx_url: str, extra_args: list[str] = (),
                    name: str = "collector") -> Proc:
    """A collector process on the lab's gateway (a free port), reading the lab's
    topology file; the first one started is the stack's `collector`."""
    listen = f"{stack.lab.gateway}:0"
    topology = getattr(stack.lab, "topology_path", "")
    proc = start_proc(name, [*stack.command,
        "collector", "--listen", listen, "--influx-url", influx_url, "--influx-api", "v1",
        "--metrics-host", "127.0.0.1", "--metrics-port", "0",
        *(["--topology-file", topology] if topology and os.path.exists(topology) else []),
        *extra_args], stack.workdir)

    def logged(pattern: str):
        def found():
            if not proc.alive():
                raise UserError(f"{name} exited: {proc.log_tail(5)}", "see the log above")
            m = re.search(pattern, proc.log_path.read_text(errors="replace"))
            return m.group(1) if m else None
        return found
    addr = await_condition(logged(r"collector listening on (\S+:\d+)"), 60,
                           f"the {name} to listen")
    metrics = await_condition(logged(r"collector metrics on (http://\S+/metrics)"), 60,
                              f"the {name}'s /metrics")
    proc.urls = {"grpc": addr, "metrics": metrics}
    if stack.collector is None:
        stack.collector, stack.collector_addr = proc, addr
        stack.collector_metrics_url = metrics
    return proc


def start_agent(stack: Stack, node, extra_args: list[str] = (),
                collector: str | None = None) -> Proc:
    from fabricscope.lab import exec_argv
    argv = exec_argv(node, [*stack.command,
        "agent", "--node", f"node{node.index}", "--markers-dir", str(node.markers_dir),
        "--metrics-port", str(AGENT_METRICS_PORT),
        # One spool per agent of this stack: labs running side by side never share one,
        # and nothing from an earlier run is resent to this run's collector.
        "--spool-dir", str(stack.workdir / f"spool-node{node.index}"),
        *(["--collector", collector or stack.collector_addr]
          if (collector or stack.collector_addr) else []),
        # a lab shaped to a link rate has one (a veth has none of its own)
        *(["--link-speed-bps", f"{node.ifname}={stack.lab.link_rate_bps}"]
          if stack.lab.link_rate_bps and stack.lab.link_shaped else []),
        *extra_args])
    proc = start_proc(f"agent-node{node.index}", argv, stack.workdir)
    stack.agents[node.index] = proc
    return proc


def await_agents_ready(stack: Stack, timeout_s: float = 120) -> None:
    for index, proc in stack.agents.items():
        def ready(index=index, proc=proc):
            if not proc.alive():
                raise UserError(f"agent on node{index} exited: {proc.log_tail(5)}",
                                "see the agent's log line above")
            return http_get(stack.agent_url(index, "/readyz"))[0] == 200
        await_condition(ready, timeout_s, f"the agent on node{index} to be ready")


def await_agent_polls(stack: Stack, polls: int,
                      metric: str = "fabricscope_agent_poll_seconds_count") -> None:
    """Until every running agent of the stack has polled its probes `polls` times: an
    agent's first polls drain what piled up while it started (benchmarks measure the
    steady state after them)."""
    def polled() -> bool:
        return all(stack.agent_metric(i, metric) >= polls for i in stack.agents)

    if polls > 0:
        await_condition(polled, 60 + 10 * polls, f"{polls} polls of every agent", 0.05)


@contextlib.contextmanager
def running_stack(lab, *, agents: bool = True, collector: bool = True,
                  agent_args: list[str] = (), collector_args: list[str] = (),
                  workdir: str | None = None, collectors: int = 1,
                  command: tuple[str, ...] = FABRICSCOPE):
    """Start InfluxDB + collector + one agent per node (each optional); always tear down.

    collectors > 1: that many collector replicas on one InfluxDB (each its own
    process and port, as a Deployment's pods), the agents dealt out among them
    (node i to replica i mod N), so one job's agents land on different replicas.
    command: what runs them (an installed `fabricscope` script, say)."""
    from fabricscope.services import InfluxServer
    tmp = tempfile.TemporaryDirectory(prefix="fabricscope-stack-") if workdir is None else None
    stack = Stack(lab=lab, workdir=Path(workdir or tmp.name), command=tuple(command))
    try:
        if collector:
            stack.influx = InfluxServer().start()
            for i in range(collectors):
                stack.replicas.append(start_collector(
                    stack, stack.influx.url, list(collector_args),
                    name="collector" if i == 0 else f"collector{i}"))
        if agents:
            for node in lab.nodes:
                target = stack.replicas[node.index % len(stack.replicas)].urls["grpc"] \
                    if stack.replicas else None
                start_agent(stack, node, list(agent_args), collector=target)
            await_agents_ready(stack)
        yield stack
    finally:
        for proc in stack.agents.values():
            proc.stop()
        for proc in stack.replicas:
            proc.stop()
        if stack.influx:
            stack.influx.stop()
        if tmp is not None:
            tmp.cleanup()


def nstat_counter(netns: str, name: str = "TcpRetransSegs") -> int:
    """Absolute value of a kernel SNMP counter in a namespace (nstat -a, no history file)."""
    out = subprocess.run(["ip", "netns", "exec", netns, "nstat", "-a", "-z", "-j"],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "NSTAT_HISTORY": os.devnull}).stdout
    data = json.loads(out)
    for table in data.values():
        if name in table:
            return int(table[name])
    raise KeyError(name)
