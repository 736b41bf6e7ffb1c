"""What the transport benchmarks share: InfluxDB + one collector process, and batches.

`running_collector()` starts a real influxd and `fabricscope collector` (a
subprocess, so its CPU time is its own: psutil reads it by pid) on loopback and
tears both down on exit. `serialized_batches(spec)` gives the exact bytes the
load generator's agents send, for the decode-only baseline.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil

from fabricscope.bench.loadgen import LoadSpec, build_batches
from fabricscope.lab.stack import await_condition, start_proc
from fabricscope.services import InfluxServer, free_port

DB = "fsbench"


@dataclass
class Env:
    influx: InfluxServer
    address: str
    proc: object            # fabricscope.lab.stack.Proc

    def cpu_seconds(self) -> float:
        times = psutil.Process(self.proc.popen.pid).cpu_times()
        return times.user + times.system


@contextlib.contextmanager
def running_collector(*extra_args: str):
    import sys
    with tempfile.TemporaryDirectory(prefix="fabricscope-bench-") as tmp, InfluxServer() as influx:
        port = free_port()
        proc = start_proc("collector", [sys.executable, "-m", "fabricscope", "collector",
                                        "--listen", f"127.0.0.1:{port}", "--influx-url",
                                        influx.url, "--influx-db", DB, "--metrics-host",
                                        "127.0.0.1", "--metrics-port", "0", *extra_args],
                          Path(tmp))
        try:
            def listening():
                if not proc.alive():
                    raise RuntimeError(f"collector exited: {proc.log_tail(5)}")
                return re.search(r"collector listening on", proc.log_path.read_text())
            await_condition(listening, 60, "the collector to listen")
            yield Env(influx, f"127.0.0.1:{port}", proc)
        finally:
            proc.stop()


def serialized_batches(spec: LoadSpec) -> list[bytes]:
    from fabricscope.wire import make_batch
    out = []
    for i in range(spec.agents):
        for seq, lines in enumerate(build_batches(spec, i), 1):
            out.append(make_batch(node=spec.node(i), agent_id=f"loadgen-{i}", seq=seq,
                                  lines=lines).SerializeToString())
    return out
