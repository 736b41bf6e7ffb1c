"""wire-bytes: agent->collector bytes on the wire per node per second under DDP, gzip / none.

A 3-node lab (lab/), real DDP over gloo (fabricscope.lab.training, `--steps` steps, default
20), the whole stack from fabricscope.lab.stack (influxd, collector, one agent
per node with its default probes). Each round starts the agents, trains, and
stops the agents (which flushes what they hold), counting every byte of every
IP packet sent to the collector's port with an nftables counter in the root
namespace (where the collector listens on the lab bridge): TCP/IP and HTTP/2
framing included, i.e. what the network carries. Figure: bytes / nodes /
seconds of the round.

Baseline: agents with `--compression none`. Subject: the default, gzip. The
ratio is what compression saves on the wire; the subject's median is the
figure to size links and collectors with (extra: batch payload bytes per node
per second, from the collector's received_bytes metric).

Needs root (network namespaces, nftables).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import uuid

from fabricscope.bench.harness import Benchmark


def _nft(script: str) -> None:
    proc = subprocess.run(["nft", "-f", "-"], input=script, text=True, capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"nft failed: {proc.stderr.strip().splitlines()[0]}")


class _Counter:
    """An nftables counter of the bytes of packets to one TCP port (our own table)."""

    def __init__(self, port: int):
        self.table = f"fsbench_wb_{uuid.uuid4().hex[:8]}"
        _nft(f"table inet {self.table} {{\n chain input {{\n"
             f"  type filter hook input priority 0; policy accept;\n"
             f"  tcp dport {port} counter\n }}\n}}\n")

    def bytes(self) -> int:
        out = subprocess.run(["nft", "-j", "list", "table", "inet", self.table],
                             capture_output=True, text=True, check=True).stdout
        for item in json.loads(out)["nftables"]:
            for expr in item.get("rule", {}).get("expr", []):
                if "counter" in expr:
                    return int(expr["counter"]["bytes"])
        raise RuntimeError("nft counter not found")

    def close(self) -> None:
        subprocess.run(["nft", "delete", "table", "inet", self.table], capture_output=True)


class _Sides:
    def __init__(self, stack, counter: _Counter, steps: int, metrics_port: int):
        self.stack, self.counter, self.steps = stack, counter, steps
        self.metrics_port = metrics_port
        self.round = 0
        self._extra: dict[str, float] = {}

    def _round(self, compression: str) -> float:
        from fabricscope.lab.stack import await_agents_ready, start_agent
        from fabricscope.lab.training import start_training
        self.round += 1
        nodes = self.stack.lab.nodes
        for node in nodes:
            start_agent(self.stack, node, ["--compression", compression, "--spool-dir",
                                           str(self.stack.workdir / f"spool-{self.round}-"
                                               f"{node.index}")])
        try:
            await_agents_ready(self.stack)
            wire0, payload0, t0 = self.counter.bytes(), self._payload(), time.monotonic()
            with start_training(self.stack.lab, self.steps, model_mb=8) as run:
                for _ in run.steps():
                    pass
                if run.wait() != 0:
                    raise RuntimeError("training failed")
        finally:
            for proc in self.stack.agents.values():
                proc.stop()
            self.stack.agents.clear()
        seconds = time.monotonic() - t0
        wire, payload = self.counter.bytes() - wire0, self._payload() - payload0
        self._extra[f"payload B/node/s ({compression})"] = payload / len(nodes) / seconds
        return wire / len(nodes) / seconds

    def _payload(self) -> float:
        from fabricscope.lab.stack import http_get, metric_value
        return metric_value(http_get(f"http://127.0.0.1:{self.metrics_port}/metrics")[1],
                            "fabricscope_collector_received_bytes_total")

    def baseline(self) -> float:
        return self._round("none")

    def subject(self) -> float:
        return self._round("gzip")

    def extra(self) -> dict[str, float]:
        return dict(self._extra)


def _collector_metrics_port(stack) -> int:
    import re
    text = stack.collector.log_path.read_text(errors="replace")
    return int(re.search(r"collector metrics on http://[\d.]+:(\d+)/metrics", text).group(1))


@contextlib.contextmanager
def environment(args):
    from fabricscope.lab.stack import running_stack
    from fabricscope.lab.running import running_lab
    steps = getattr(args, "steps", None) or 20
    with running_lab(f"bwb{uuid.uuid4().hex[:4]}", 3) as lab:
        with running_stack(lab, agents=False) as stack:
            counter = _Counter(int(stack.collector_addr.rpartition(":")[2]))
            try:
                yield _Sides(stack, counter, steps, _collector_metrics_port(stack))
            finally:
                counter.close()


BENCH = Benchmark(
    name="wire-bytes",
    description="agent->collector bytes on the wire per node per second under DDP, gzip / none",
    unit="B/node/s",
    baseline_label="no compression",
    subject_label="gzip (default)",
    environment=environment,
    repeats=3,
)
