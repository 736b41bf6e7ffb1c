"""iperf3-overhead-nic: TCP throughput across a netns pair with the nic probe attached / without.

Testbed: two fresh network namespaces joined by one veth (MTU 1500, TSO/GRO as
the kernel sets them), addresses .1/.2 of a random 198.19.X.0/24 (away from the
lab's 198.18.x allocations), IPv6 off, static neighbours. An iperf3 server runs
in B for the whole benchmark. Baseline round: `iperf3 -c -t T` from A, no probe.
Subject round: the same with the nic probe (`fabricscope.agent.probes.nic.standalone`, agent
defaults: 100 us bins, 0.2 s drains, flows) attached on both veth ends, started
before and stopped after the round. Figure: bits/s received.

Extra figures of the subject rounds (medians): events reaching user space per
second (non-empty bin slots + flow entries read) against wire packets per second
(segments, from the probes' own windows), both summed over the two ends ->
aggregation ratio (packets per event); CPU of the two probe processes in % of one
core; the TC program's cost per packet from BPF_PROG_TEST_RUN (warm caches).

The TC program's own cost, with no agent around it: `iperf3-overhead`
(bench/iperf3_lab.py) is the issue's figure, the lab with every probe. The
testbed (netns_pair, Runner) is also what tests/kernel/test_nic_*.py use.
`--steps N` sets T in seconds (default 3).
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

from fabricscope.bench.agent_footprint import cpu_seconds
from fabricscope.bench.harness import Benchmark

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable     # the probe runner needs this interpreter's packages (bcc, numpy)


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
def netns_pair(mtu: int = 1500):
    """Two fresh namespaces joined by one veth; removed (with the veth) on any exit."""
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
    """`python -m fabricscope.agent.probes.nic.standalone` inside a namespace, lines collected."""

    proc: subprocess.Popen
    lines: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    @classmethod
    def start(cls, prefix: list[str], *flags: str) -> "Runner":
        """prefix: e.g. ["ip", "netns", "exec", NS]; [] runs in the host's namespace."""
        proc = subprocess.Popen([*prefix, PYTHON, "-m", "fabricscope.agent.probes.nic.standalone", *flags],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        runner = cls(proc)
        threading.Thread(target=runner._read_out, daemon=True).start()
        threading.Thread(target=runner._read_err, daemon=True).start()
        return runner

    def _read_out(self) -> None:
        for line in self.proc.stdout:
            try:
                obj = json.loads(line)
            except ValueError:
                self.errors.append("stdout: " + line.rstrip())
                continue
            with self._lock:
                self.lines.append(obj)

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
                raise RuntimeError(f"nic runner exited {self.proc.returncode}: "
                                     + " | ".join(self.errors[-5:]))
            time.sleep(0.05)
        raise RuntimeError("nic runner: timed out; stderr: " + " | ".join(self.errors[-5:]))

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


# --- the benchmark ----------------------------------------------------------------------

def bpf_ns_per_packet(repeat: int = 1_000_000) -> float:
    """The TC program's own cost: BPF_PROG_TEST_RUN of fs_nic_ingress on one 1514-byte
    TCP/IPv4 frame, `repeat` times in the kernel (warm caches: a floor, not the cost
    under load; bpf_stats in a live run showed 0.4-0.9 us per skb on a busy 2-core VM)."""
    import struct

    from fabricscope.agent import bpf, kernel
    from fabricscope.agent.probes.nic.probe import register_interface
    from fabricscope.agent.probes.nic.bpfmap import prog_test_run
    kernel.prepare()
    prog = bpf.compile_program("nic", ["-DFS_NIC_RINGS=2", "-DFS_NIC_MAX_IFACES=1"])
    try:
        fn = prog.load_func(b"fs_nic_ingress", type(prog).SCHED_CLS)
        register_interface(prog, 1, 0, 14)      # test runs put the skb on loopback
        frame = (bytes(12) + b"\x08\x00" + bytes([0x45, 0, 0x05, 0xdc, 0, 0, 0x40, 0, 64, 6, 0, 0,
                                                 198, 19, 1, 1, 198, 19, 1, 2])
                 + struct.pack("!HH", 40000, 5201) + bytes(16 + 1460))
        return float(prog_test_run(fn.fd, frame, repeat)[1])
    finally:
        prog.cleanup()


class _Sides:
    def __init__(self, pair: Pair, seconds: int):
        self.pair, self.seconds = pair, seconds
        self._extra: dict[str, float] = {}
        self._bpf_ns = bpf_ns_per_packet()

    def _iperf(self) -> float:
        out = sh(*self.pair.exec(self.pair.ns_a, "iperf3", "-c", self.pair.addr_b,
                                 "-t", str(self.seconds), "-J"))
        return float(json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"])

    def baseline(self) -> float:
        return self._iperf()

    def subject(self) -> float:
        p = self.pair
        with running(p.exec(p.ns_a), "--interfaces", p.if_a) as ra, \
                running(p.exec(p.ns_b), "--interfaces", p.if_b) as rb:
            ra.ready()
            rb.ready()
            start, cpu0 = time.monotonic(), cpu_seconds(ra.proc.pid) + cpu_seconds(rb.proc.pid)
            bps = self._iperf()
            cpu = cpu_seconds(ra.proc.pid) + cpu_seconds(rb.proc.pid) - cpu0
            stats = [ra.stop(), rb.stop()]
            lifetime = time.monotonic() - start
        events = sum(s["slots_read"] + s["flow_entries_read"] for s in stats)
        packets = sum(w["fields"]["packets"] for r in (ra, rb) for w in r.records("nic_window"))
        self._extra = {"user_events_per_s": events / lifetime,
                       "wire_packets_per_s": packets / lifetime,
                       "aggregation_ratio": packets / max(events, 1),
                       "probe_cpu_pct_of_core": 100 * cpu / self.seconds,
                       "bins_lost": float(sum(s["lost"] for s in stats)),
                       "bpf_ns_per_packet_test_run": self._bpf_ns}
        return bps

    def extra(self) -> dict[str, float]:
        return self._extra


@contextlib.contextmanager
def iperf3_server(netns: str, port: int = 5201, once: bool = False):
    """`iperf3 -s` in network namespace netns, yielded once it listens; killed on exit."""
    def in_ns(*cmd: str) -> list[str]:
        return ["ip", "netns", "exec", netns, *cmd]

    proc = subprocess.Popen(in_ns("iperf3", "-s", "-p", str(port), *(["-1"] if once else [])),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while f":{port} " not in sh(*in_ns("ss", "-ltnH")).stdout:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"iperf3 server in {netns} did not start")
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@contextlib.contextmanager
def environment(args):
    seconds = getattr(args, "steps", None) or 3
    with netns_pair() as pair, iperf3_server(pair.ns_b):
        yield _Sides(pair, seconds)


BENCH = Benchmark(
    name="iperf3-overhead-nic",
    description="iperf3 TCP throughput across a netns pair with the nic probe attached / without",
    unit="bit/s",
    baseline_label="no probe",
    subject_label="nic probe on both ends",
    environment=environment,
    repeats=5,
    goal="ratio >= 0.97",
)
