"""`fabricscope collector` as a process: bound address log line, signals, one-line errors."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from fabricscope.records import Record
from fabricscope.services import InfluxServer, free_port
from fabricscope.wire import make_batch, pb, pb_grpc

ROOT = Path(__file__).resolve().parents[2]


def fabricscope(*argv) -> list[str]:
    return [sys.executable, "-m", "fabricscope", *argv]


class Running:
    """A child process whose stderr lines are collected by a thread (no blocking reads)."""

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.put(line.rstrip("\n"))

    def wait_line(self, pattern: str, timeout_s: float = 60.0) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.seen}"
                continue
            self.seen.append(line)
            match = re.search(pattern, line)
            if match:
                return match
        raise AssertionError(f"no line matching {pattern!r} in {self.seen}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def test_collector_process_logs_its_address_serves_and_stops_on_sigterm():
    with InfluxServer() as influx:
        running = Running(fabricscope("collector", "--listen", "127.0.0.1:0", "--metrics-host",
                                      "127.0.0.1", "--metrics-port", "0", "--influx-url",
                                      influx.url, "--influx-db", "cli_test"))
        try:
            address = running.wait_line(r"collector listening on (127\.0\.0\.1:\d+)$").group(1)
            record = Record("train_step", time.time_ns(), {"job": "j", "rank": "0"},
                            {"step": 1, "seconds": 0.1})
            with grpc.insecure_channel(address) as channel:
                acks = list(pb_grpc.CollectorStub(channel).Stream(
                    iter([make_batch(node="n1", agent_id="a", seq=1, records=[record])]),
                    timeout=60))
            assert [(a.seq, a.status) for a in acks] == [(1, pb.Ack.OK)]
            rows = influx.query('SELECT count("step") FROM "train_step"', "cli_test")
            assert rows[0]["count"] == 1
        finally:
            code = running.stop()
        assert code == 0


@pytest.mark.parametrize("extra,message", [
    (["--max-message-bytes", "lots"], "--max-message-bytes: 'lots' is not a valid int"),
    (["--listen", "9470"], "listen address '9470' is not host:port"),
])
def test_bad_flags_are_one_line_errors(extra, message):
    result = subprocess.run(fabricscope("collector", *extra), cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith("fabricscope: error: ") and message in result.stderr


def test_unreachable_influxdb_is_a_one_line_error_at_startup():
    url = f"http://127.0.0.1:{free_port()}"
    result = subprocess.run(fabricscope("collector", "--listen", "127.0.0.1:0", "--metrics-port",
                                        "0", "--influx-url", url),
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"fabricscope: error: cannot reach InfluxDB at {url}: Connection refused; fix: start "
        "InfluxDB or point --influx-url (FABRICSCOPE_COLLECTOR_INFLUX_URL) at it"]
