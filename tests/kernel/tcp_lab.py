"""Helpers of the TCP probe kernel tests: probes attached in each lab node's
namespace (in this process), real TCP traffic between nodes, nstat counters.

Everything started here is stopped by pid or detached in `finally` blocks.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

from fabricscope.records import Record
from fabricscope.lab import exec_argv
from tests.kernel.test_agent_kernel import in_netns

PY = sys.executable

# Reads until EOF; prints the byte count. With EXACT=n: reads n bytes, answers "k",
# reads 1 byte, answers "y", then waits for EOF (see test_tcp_flows: exact bytes).
SINK = """import socket, sys
port, exact = int(sys.argv[1]), int(sys.argv[2])
s = socket.create_server(("0.0.0.0", port))
print("up", flush=True)
c, _ = s.accept()
n = 0
if exact:
    while n < exact:
        n += len(c.recv(min(1 << 20, exact - n)))
    c.sendall(b"k")
    n += len(c.recv(1))
    c.sendall(b"y")
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    n += len(b)
print(n, flush=True)
"""
# Sends n bytes (or, with seconds > 0, as much as it can for that long), then closes.
# EXACT mode mirrors the sink's; hold: seconds to wait before closing.
SEND = """import socket, sys, time
addr, port, n, seconds, exact, hold = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                       float(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]))
s = socket.create_connection((addr, port))
buf, sent, end = b"x" * (1 << 16), 0, time.monotonic() + seconds
while (sent < n) if not seconds else (time.monotonic() < end):
    k = len(buf) if seconds else min(len(buf), n - sent)
    s.sendall(buf[:k])
    sent += k
if exact:
    assert s.recv(1) == b"k"
    s.sendall(b"z")
    assert s.recv(1) == b"y"
time.sleep(hold)
s.shutdown(socket.SHUT_WR)
s.recv(1)
print(sent, flush=True)
"""


@contextlib.contextmanager
def probes_on(lab, cls=None, config=None):
    """One probe per lab node, attached inside the node's namespace; always detached."""
    from fabricscope.agent import kernel
    from fabricscope.agent.probes.base import Clock, ProbeContext
    if cls is None:
        from fabricscope.agent.probes.tcp.flows import TcpFlowsProbe as cls
    kernel.prepare()
    probes = []
    try:
        for node in lab.nodes:
            probe = cls(ProbeContext(node.name, frozenset([node.address]), Clock(), config))
            probes.append(probe)
            in_netns(node.netns, probe.attach)
        yield probes
    finally:
        for node, probe in zip(lab.nodes, probes):
            in_netns(node.netns, probe.detach)


class Collector:
    """Polls every node's probe (in its namespace) into per-node record lists."""

    def __init__(self, lab, probes):
        self.lab, self.probes = lab, probes
        self.records: list[list[Record]] = [[] for _ in probes]

    def poll(self) -> None:
        for i, (node, probe) in enumerate(zip(self.lab.nodes, self.probes)):
            self.records[i] += in_netns(node.netns, probe.poll)

    def clear(self) -> None:
        self.settle()
        self.records = [[] for _ in self.probes]

    def settle(self, timeout_s: float = 30.0) -> None:
        """Poll until no probe holds records waiting for their owner's tags (they wait
        for the next /proc scan, at most Owners.rescan_s)."""
        self.until(lambda c: c._no_owner_waiting(c.probes), timeout_s,
                   "records waiting for owners")

    @staticmethod
    def _no_owner_waiting(probes) -> bool:
        return all(p.stats().get("owner_waiting", 0) == 0 for p in probes)

    def until_closed(self, closed, what: str, sweeps: int = 2) -> None:
        """Poll until closed(self), or until every probe swept `sweeps` times more and
        holds no record waiting for its owner, then assert closed(self). A socket whose
        every teardown hit the kernel skipped is closed by the first sweep at least
        Sweeper.recheck_s after it was last found alive (agent/probes/tcp/sweep.py):
        sweeps come every_s >= recheck_s apart, so by the second one after it closed.
        The deadline is only a guard against a sweep that never comes."""
        start = [p.stats()["sweeps"] for p in self.probes]

        def settled(c) -> bool:
            return c._no_owner_waiting(c.probes) and \
                all(p.stats()["sweeps"] - s >= sweeps for p, s in zip(c.probes, start))
        self.until(lambda c: closed(c) or settled(c), 300, what)
        assert closed(self), f"{what}: not closed after {sweeps} sweeps of every probe"

    def until(self, done, timeout_s: float = 30.0, what: str = "records"):
        """Poll until done(self) is true; fail naming `what` at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.poll()
            if done(self):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.1)

    def of(self, index: int, measurement: str) -> list[Record]:
        return [r for r in self.records[index] if r.measurement == measurement]


@contextlib.contextmanager
def traffic(procs_spec):
    """Start (node, argv) commands in their namespaces; kill leftovers on exit."""
    procs = []
    try:
        for node, argv in procs_spec:
            procs.append(subprocess.Popen(exec_argv(node, argv), stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def sink_argv(port: int, exact: int = 0) -> list[str]:
    return [PY, "-c", SINK, str(port), str(exact)]


def send_argv(addr: str, port: int, nbytes: int = 0, seconds: float = 0.0, exact: int = 0,
              hold: float = 0.0) -> list[str]:
    return [PY, "-c", SEND, addr, str(port), str(nbytes), str(seconds), str(exact), str(hold)]


def await_up(proc, timeout_s: float = 30.0) -> None:
    line = proc.stdout.readline().strip()
    assert line == "up", f"server did not start: {line!r} {proc.stderr.read()}"


def finish(proc, timeout_s: float = 120.0) -> str:
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, err
    return out.strip()


def nstat(netns: str) -> dict[str, int]:
    """Every kernel SNMP counter of a namespace (absolute; nstat -a, no history)."""
    out = subprocess.run(["ip", "netns", "exec", netns, "nstat", "-a", "-z", "-j"],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "NSTAT_HISTORY": os.devnull}).stdout
    merged: dict[str, int] = {}
    for table in json.loads(out).values():
        merged.update({k: int(v) for k, v in table.items()})
    return merged
