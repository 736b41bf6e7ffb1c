"""Collectors and agents as real subprocesses for the transport tests: start, SIGKILL,
restart by pid, read their /metrics; counts per node from a real influxd."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from fabricscope.lab.stack import http_get, metric_value

ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate, timeout_s: float = 60.0, what: str = "the condition",
             interval_s: float = 0.05):
    """Poll until predicate() is truthy; return its value (a deadline, not a fixed sleep)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


class ServiceProc:
    """One `python -m fabricscope ...` process; its log file survives restarts."""

    METRICS_LINE = re.compile(r"(?:metrics on http://|/readyz on )[\d.]+:(\d+)")

    def __init__(self, name: str, argv: list[str], workdir: Path):
        self.name, self.argv = name, argv
        self.log = workdir / f"{name}.log"
        self.popen: subprocess.Popen | None = None
        self._offset = 0
        self.metrics_port = 0

    def start(self, ready: str = r"listening on|running probes") -> "ServiceProc":
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as log:
            self.popen = subprocess.Popen([sys.executable, "-m", "fabricscope", *self.argv],
                                          cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        self.wait_log(ready)
        self.metrics_port = int(self.wait_log(self.METRICS_LINE.pattern).group(1))
        return self

    def text(self) -> str:
        """Log output of the current run."""
        with open(self.log, "rb") as f:
            f.seek(self._offset)
            return f.read().decode(errors="replace")

    def all_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_log(self, pattern: str, timeout_s: float = 60.0) -> re.Match:
        def seen():
            if self.popen.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.popen.returncode}:\n"
                                     f"{self.text()[-2000:]}")
            return re.search(pattern, self.text())
        return wait_for(seen, timeout_s, f"{self.name} to log {pattern!r}")

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind, as a crash or an OOM kill."""
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait(30)

    def stop(self) -> int | None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.popen.returncode if self.popen else None

    def rss_mb(self) -> float:
        return psutil.Process(self.pid).memory_info().rss / 2**20

    def metric(self, name: str, **labels) -> float:
        status, body = http_get(f"http://127.0.0.1:{self.metrics_port}/metrics")
        assert status == 200, f"{self.name} /metrics answered {status}"
        return metric_value(body, name, labels or None)


class Procs:
    """Every process a test started; stop_all() in a finally (also after failures)."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.started: list[ServiceProc] = []

    def collector(self, name: str, port: int, influx_url: str, *extra: str) -> ServiceProc:
        proc = ServiceProc(name, ["collector", "--listen", f"127.0.0.1:{port}",
                                  "--influx-url", influx_url, "--influx-db", "fs",
                                  "--metrics-host", "127.0.0.1", "--metrics-port", "0",
                                  "--retry-after-s", "0.5", *extra], self.workdir)
        self.started.append(proc)
        return proc

    def agent(self, node: str, port: int, *extra: str, rate: int = 2000,
              count: int = 10000) -> ServiceProc:
        proc = ServiceProc(node, ["agent", "--node", node, "--probes", "synthetic",
                                  "--collector", f"127.0.0.1:{port}",
                                  "--spool-dir", str(self.workdir / "spool" / node),
                                  "--metrics-host", "127.0.0.1", "--metrics-port", "0",
                                  "--synthetic-rate", str(rate),
                                  "--synthetic-count", str(count), "--flush-interval-s", "0.2",
                                  *extra], self.workdir)
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            proc.stop()


def synthetic_counts(influx, db: str = "fs") -> dict[str, tuple[int, int]]:
    """{node: (count(n), sum(n))} of the synthetic points in InfluxDB."""
    try:
        rows = influx.query('SELECT count("n"), sum("n") FROM "synthetic" GROUP BY "node"', db)
    except RuntimeError as exc:           # database not created yet
        if "database not found" in str(exc):
            return {}
        raise
    # a series whose points are still being written can come back with null
    # aggregates: nothing of it counted yet
    return {r["_tags"]["node"]: (int(r["count"] or 0), int(r["sum"] or 0)) for r in rows}


def complete(count: int) -> tuple[int, int]:
    """(count, sum) of records 0..count-1: every one exactly once."""
    return count, count * (count - 1) // 2
