"""Test helpers for the nic probe: a private netns pair and the standalone probe runner.

The pair: two namespaces joined by one veth, addresses .1 and .2 of a random
198.19.X.0/24 (away from the lab's 198.18.x allocations), IPv6 off so that no
neighbour discovery or MLD crosses the quiet link. Names carry the pid and a
random tag, so concurrent tests never collide; teardown runs on any exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True)


@dataclass(frozen=True)
class Pair:
    ns_a: str
    ns_b: str
    if_a: str
    if_b: str
    addr_a: str
    addr_b: str

    def exec(self, ns: str, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", ns, *cmd]

    def counter(self, ns: str, ifname: str, name: str) -> int:
        out = sh(*self.exec(ns, "cat", f"/sys/class/net/{ifname}/statistics/{name}"))
        return int(out.stdout)


@contextlib.contextmanager
def netns_pair(mtu: int = 9000):
    tag = f"{os.getpid() % 0xFFFF:04x}{random.randrange(0x100):02x}"
    net = f"198.19.{random.randrange(1, 255)}"
    pair = Pair(f"fsnic-{tag}-a", f"fsnic-{tag}-b", f"fn{tag}a", f"fn{tag}b",
                f"{net}.1", f"{net}.2")
    try:
        for ns in (pair.ns_a, pair.ns_b):
            sh("ip", "netns", "add", ns)
            sh(*pair.exec(ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                          "net.ipv6.conf.default.disable_ipv6=1"))
        sh("ip", "link", "add", pair.if_a, "netns", pair.ns_a, "mtu", str(mtu), "type", "veth",
           "peer", "name", pair.if_b, "netns", pair.ns_b, "mtu", str(mtu))
        for ns, ifname, addr in ((pair.ns_a, pair.if_a, pair.addr_a),
                                 (pair.ns_b, pair.if_b, pair.addr_b)):
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", ifname)
            sh("ip", "-n", ns, "link", "set", ifname, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        # static neighbours: no ARP exchange in the middle of a measurement
        for ns, ifname, peer_ns, peer_if, peer_addr in (
                (pair.ns_a, pair.if_a, pair.ns_b, pair.if_b, pair.addr_b),
                (pair.ns_b, pair.if_b, pair.ns_a, pair.if_a, pair.addr_a)):
            mac = sh(*pair.exec(peer_ns, "cat", f"/sys/class/net/{peer_if}/address")).stdout.strip()
            sh("ip", "-n", ns, "neigh", "replace", peer_addr, "lladdr", mac, "dev", ifname,
               "nud", "permanent")
        yield pair
    finally:
        for ns in (pair.ns_a, pair.ns_b):
            sh("ip", "netns", "del", ns, check=False)


@dataclass
class Runner:
    """`python -m agent.probes.nic_standalone` inside a namespace, lines collected."""

    proc: subprocess.Popen
    lines: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    @classmethod
    def start(cls, prefix: list[str], *flags: str) -> "Runner":
        """prefix: e.g. ["ip", "netns", "exec", NS]; [] runs in the host's namespace."""
        proc = subprocess.Popen([*prefix, PYTHON, "-m", "agent.probes.nic_standalone", *flags],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        runner = cls(proc)
        threading.Thread(target=runner._read_out, daemon=True).start()
        threading.Thread(target=runner._read_err, daemon=True).start()
        return runner

    def _read_out(self) -> None:
        for line in self.proc.stdout:
            with self._lock:
                self.lines.append(json.loads(line))

    def _read_err(self) -> None:
        for line in self.proc.stderr:
            self.errors.append(line.rstrip())

    def wait_for(self, predicate, timeout_s: float = 60.0) -> dict:
        """First collected line matching predicate, polling until the deadline."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                for line in self.lines:
                    if predicate(line):
                        return line
            if self.proc.poll() is not None and not any(predicate(x) for x in self.lines):
                raise AssertionError(f"runner exited {self.proc.returncode}: "
                                     + " | ".join(self.errors[-5:]))
            time.sleep(0.05)
        raise AssertionError("runner: timed out; stderr: " + " | ".join(self.errors[-5:]))

    def ready(self) -> dict:
        return self.wait_for(lambda x: x.get("event") == "ready", 90.0)

    def stop(self, timeout_s: float = 60.0) -> dict:
        """SIGTERM, wait for the final stats line; returns it."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        return self.wait_for(lambda x: x.get("event") == "stats", 10.0)

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def records(self, measurement: str) -> list[dict]:
        with self._lock:
            return [x for x in self.lines if x.get("measurement") == measurement]


@contextlib.contextmanager
def running(prefix: list[str], *flags: str):
    runner = Runner.start(prefix, *flags)
    try:
        yield runner
    finally:
        runner.kill()
