"""`fabricscope agent` as a user runs it: one-line errors, and a markers-only agent
(no root needed) printing JSON lines, ready on /readyz, stopping cleanly on SIGTERM."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from fabricscope import markers
from fabricscope.records import Record

ROOT = Path(__file__).resolve().parents[2]
ENV = {**{k: v for k, v in os.environ.items() if k not in markers.META_ENV},
       "PYTHONPATH": str(ROOT)}


def fabricscope(*args, **kw):
    return subprocess.run([sys.executable, "-m", "fabricscope", *args], capture_output=True,
                          text=True, env=ENV, cwd=ROOT, timeout=60, **kw)


@pytest.mark.parametrize("args, cause", [
    (["--batch-max-records", "x"], "--batch-max-records: 'x' is not a valid int"),
    (["--probes", "tcp_retransmit,nope"], "unknown probe nope"),
    (["--collector", "198.18.0.254"], "has no port"),
    (["--addresses", "198.18.0.300"], "is not an IP address"),
    (["--batch-max-records", "10", "--queue-max-records", "5"], "smaller than one batch"),
    (["--config", "/nonexistent/agent.yaml"], "cannot read config file"),
    (["--nice", "25"], "nice 25 is outside 0..19"),
])
def test_bad_flags_are_one_line_and_exit_2(args, cause):
    proc = fabricscope("agent", *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("fabricscope: error: ") and cause in lines[0] and "; fix: " in lines[0]


def test_unknown_yaml_key_is_one_line(tmp_path):
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("agent:\n  batch_max_record: 5\n")
    proc = fabricscope("agent", "--config", str(cfg))
    assert proc.returncode == 2 and "unknown key 'batch_max_record'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


class Agent:
    """A running `fabricscope agent` subprocess with its stdout lines in a queue."""

    def __init__(self, args):
        self.proc = subprocess.Popen([sys.executable, "-m", "fabricscope", "agent", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=ENV, cwd=ROOT)
        self.lines: queue.Queue = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put),
                         daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr.append),
                         daemon=True).start()

    @staticmethod
    def _pump(stream, put):
        for line in stream:
            put(line)

    def await_log(self, pattern, timeout_s=60):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.stderr):
                m = re.search(pattern, line)
                if m:
                    return m
            assert self.proc.poll() is None, "".join(self.stderr)
            time.sleep(0.05)
        raise AssertionError(f"no log line matching {pattern!r}: {''.join(self.stderr)}")

    def records(self, count, timeout_s=60):
        out, deadline = [], time.monotonic() + timeout_s
        while len(out) < count:
            try:
                out.append(Record.from_json(self.lines.get(timeout=max(0.0, deadline - time.monotonic()))))
            except queue.Empty:
                raise AssertionError(f"got {len(out)} of {count} records") from None
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def http_status(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def test_markers_only_agent_prints_steps_and_stops_cleanly(tmp_path):
    agent = Agent(["--probes", "markers", "--output", "jsonl", "--node", "n9",
                   "--markers-dir", str(tmp_path), "--metrics-host", "127.0.0.1",
                   "--metrics-port", "0", "--poll-interval-s", "0.05",
                   "--flush-interval-s", "0.05"])
    try:
        port = int(agent.await_log(r"serving /metrics and /readyz on 127\.0\.0\.1:(\d+)").group(1))
        deadline = time.monotonic() + 30
        while http_status(f"http://127.0.0.1:{port}/readyz")[0] != 200:
            assert time.monotonic() < deadline and agent.proc.poll() is None
            time.sleep(0.05)
        subprocess.run([sys.executable, "-c", "from fabricscope import markers\n"
                        "for i in range(3): markers.step(i)\nmarkers.done()"],
                       env={**ENV, "FABRICSCOPE_MARKERS_DIR": str(tmp_path), "RANK": "2",
                            "FABRICSCOPE_JOB": "cli"}, check=True, timeout=60)
        recs = agent.records(3)
        assert [(r.measurement, r.fields["step"]) for r in recs] == \
            [("train_step", 0), ("train_step", 1), ("train_step", 2)]
        assert all(r.tags == {"rank": "2", "job": "cli", "node": "n9"} for r in recs)
        _, metrics = http_status(f"http://127.0.0.1:{port}/metrics")
        assert 'fabricscope_agent_records_total{probe="markers"} 3.0' in metrics
        assert 'fabricscope_agent_probe_attached{probe="markers"} 1.0' in metrics
    finally:
        rc = agent.stop()
    assert rc == 0, "".join(agent.stderr)
    assert not any("Traceback" in line for line in agent.stderr)
    assert list(tmp_path.glob("*.ring")) == []


_THREADS = """
import os, threading
from fabricscope.agent.priority import lower_priority
ready, release = threading.Event(), threading.Event()
def idle():
    ready.set(); release.wait()
t = threading.Thread(target=idle, daemon=True); t.start(); ready.wait()
lower_priority({args})
seen = {{}}
def later():
    seen['later'] = ({probe})(0)
u = threading.Thread(target=later); u.start(); u.join()
mine = [threading.main_thread().native_id, t.native_id]
print([({probe})(tid) for tid in mine], seen['later'])
release.set(); t.join()
"""


def _threads_after_lower(args: str, probe: str) -> list[str]:
    """In a fresh process with a second thread: lower_priority(args), then `probe`
    (a function of a thread id) of both threads and of a thread started afterwards."""
    proc = subprocess.run([sys.executable, "-c", _THREADS.format(args=args, probe=probe)],
                          capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_lower_priority_leaves_a_kept_thread_at_its_priority():
    probe = "lambda tid: os.getpriority(os.PRIO_PROCESS, tid)"
    kept = _THREADS.replace("lower_priority({args})",
                            "from fabricscope.agent.priority import keep_priority\n"
                            "keep_priority(t.native_id)\nlower_priority({args})")
    proc = subprocess.run([sys.executable, "-c", kept.format(args="7", probe=probe)],
                          capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # threads start at the test runner's nice (a runner may itself run niced)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    low = max(7, base)
    assert proc.stdout.split() == [f"[{low},", f"{base}]", f"{low}"]


def test_lower_priority_reaches_every_thread_and_new_ones_inherit_it():
    low = max(7, os.getpriority(os.PRIO_PROCESS, 0))
    assert _threads_after_lower("7", "lambda tid: os.getpriority(os.PRIO_PROCESS, tid)") == \
        [f"[{low},", f"{low}]", f"{low}"]


def test_idle_policy_reaches_every_thread_and_new_ones_inherit_it():
    assert _threads_after_lower("7, 'idle'",
                                "lambda tid: os.sched_getscheduler(tid) == os.SCHED_IDLE") == \
        ["[True,", "True]", "True"]
