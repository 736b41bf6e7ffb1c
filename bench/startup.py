"""startup: agent start-up time, process start to /readyz 200, BCC compilation included.

In a lab node's namespace (as a DaemonSet pod runs in its node's), no collector.
Baseline round: the agent with `--probes markers` (no BPF: Python start, imports,
config, /metrics server). Subject round: the agent with its default probes
(tcp_flows: kernel preparation, `import bcc`, compiling bpf/tcp_flows.bpf.c,
loading and attaching it, TC egress). Each round starts one agent, polls /readyz
every 10 ms, then stops it (SIGTERM). Extra figure: `python -c 'import bcc'`
alone (seconds), the floor under any BCC-based agent.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import uuid

from fabricscope.bench.harness import Benchmark


class _Sides:
    def __init__(self, stack):
        self.stack = stack
        self._import_bcc: float = 0.0

    def _round(self, probes: list[str]) -> float:
        from fabricscope.lab.stack import await_condition, http_get, start_agent
        node = self.stack.lab.nodes[0]
        args = ["--output", "none"] + (["--probes", ",".join(probes)] if probes else [])
        start = time.monotonic()
        proc = start_agent(self.stack, node, args)
        try:
            def ready():
                if not proc.alive():
                    raise RuntimeError(f"agent exited: {proc.log_tail(5)}")
                return http_get(self.stack.agent_url(0, "/readyz"), 0.5)[0] == 200
            await_condition(ready, 120, "the agent to be ready", interval_s=0.01)
            return time.monotonic() - start
        finally:
            proc.stop()
            self.stack.agents.clear()

    def baseline(self) -> float:
        return self._round(["markers"])

    def subject(self) -> float:
        seconds = self._round([])
        start = time.monotonic()
        subprocess.run([sys.executable, "-c", "import bcc"], check=True)
        self._import_bcc = time.monotonic() - start
        return seconds

    def extra(self) -> dict[str, float]:
        return {"import_bcc_s": self._import_bcc}


@contextlib.contextmanager
def environment(_args):
    from fabricscope.lab.stack import running_stack
    from fabricscope.lab.running import running_lab
    with running_lab(f"bst{uuid.uuid4().hex[:4]}", 2) as lab:
        with running_stack(lab, agents=False, collector=False) as stack:
            yield _Sides(stack)


BENCH = Benchmark(
    name="startup",
    description="agent start to /readyz 200: default probes (BCC compile) / markers only",
    unit="s",
    baseline_label="agent, markers only",
    subject_label="agent, default probes",
    environment=environment,
    repeats=5,
)
