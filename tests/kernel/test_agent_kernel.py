"""Agent on the real kernel: tcp_retransmit in two namespaces with nft random loss,
and `fabricscope agent --output jsonl` running inside a namespace.

Topology (all created here with unique names, torn down in finally):
  netns <tag>a: eth0 198.19.R.1 ─┐
                                  ├─ netns <tag>r: bridge br0, nft: 2 % TCP loss on pa
  netns <tag>b: eth0 198.19.R.2 ─┘
R is random in 128..254 (the lab allocates 198.18.0.0/15 from the bottom up), so
no other test's probe, filtering on its own addresses, sees ours.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fabricscope.records import Record

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parents[2]
PORT = 5201
CLONE_NEWNET = 0x40000000


def sh(*cmd, input=None, check=True):
    return subprocess.run(cmd, input=input, text=True, capture_output=True, check=check,
                          timeout=60)


class NetPair:
    def __init__(self, loss_pct: int = 2):
        self.tag = f"fsag{os.getpid() % 10000}{random.randrange(16 ** 3):03x}"
        self.a, self.b, self.br = f"{self.tag}a", f"{self.tag}b", f"{self.tag}r"
        net = random.randrange(128, 255)
        self.addr_a, self.addr_b = f"198.19.{net}.1", f"198.19.{net}.2"
        self.loss_pct = loss_pct

    def up(self) -> None:
        for ns in (self.a, self.b, self.br):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", self.br, "link", "add", "br0", "type", "bridge")
        for ns, port, addr in ((self.a, "pa", self.addr_a), (self.b, "pb", self.addr_b)):
            sh("ip", "-n", self.br, "link", "add", port, "type", "veth",
               "peer", "name", "eth0", "netns", ns)
            sh("ip", "-n", self.br, "link", "set", port, "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", addr + "/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", self.br, "link", "set", "br0", "up")
        sh("ip", "netns", "exec", self.br, "nft", "-f", "-", input=(
            "table bridge fsloss {\n chain lossy {\n"
            "  type filter hook forward priority 0; policy accept;\n"
            f'  iifname "pa" meta l4proto tcp numgen random mod 100 < {self.loss_pct} drop\n'
            " }\n}\n"))

    def down(self) -> None:
        for ns in (self.a, self.b, self.br):
            sh("ip", "netns", "del", ns, check=False)

    def no_loss(self) -> None:
        sh("ip", "netns", "exec", self.br, "nft", "delete", "table", "bridge", "fsloss")

    def snmp(self, ns: str, name: str) -> int:
        """A Tcp: counter of /proc/net/snmp in namespace ns."""
        lines = sh("ip", "netns", "exec", ns, "cat", "/proc/net/snmp").stdout.splitlines()
        for head, vals in zip(lines[::2], lines[1::2]):
            if head.startswith("Tcp:"):
                return int(dict(zip(head.split(), vals.split()))[name])
        raise KeyError(name)

    def retrans_segs(self, ns: str) -> int:
        return self.snmp(ns, "RetransSegs")

    def transfer(self, mib: int) -> None:
        """mib MiB from a to b over one TCP connection (server in b, client in a)."""
        server = subprocess.Popen(["ip", "netns", "exec", self.b, sys.executable, "-c",
                                   "import socket\ns = socket.create_server(('0.0.0.0', "
                                   f"{PORT}))\nprint('up', flush=True)\nc, _ = s.accept()\n"
                                   "while c.recv(1 << 20): pass\n"],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout.readline().strip() == "up"
            sh("ip", "netns", "exec", self.a, sys.executable, "-c",
               f"import socket\ns = socket.create_connection(('{self.addr_b}', {PORT}))\n"
               f"for _ in range({mib}): s.sendall(b'x' * (1 << 20))\n"
               "s.shutdown(socket.SHUT_WR)\ns.recv(1)\n")
            server.wait(60)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()

    def transfer_until_retransmitted(self, mib: int, at_least: int) -> int:
        """Transfers of mib MiB from a to b until a's kernel has retransmitted at
        least at_least segments; returns how many it did. Random loss on GSO-sized
        frames can spare one transfer entirely, so one transfer is no precondition."""
        before = self.retrans_segs(self.a)
        for _ in range(20):
            self.transfer(mib)
            if self.retrans_segs(self.a) - before >= at_least:
                break
        return self.retrans_segs(self.a) - before


@pytest.fixture
def netpair():
    pair = NetPair()
    try:
        pair.up()
        yield pair
    finally:
        pair.down()


def in_netns(name: str, fn):
    """Run fn in a thread that joined network namespace `name` (netns is per thread)."""
    out: dict = {}

    def run():
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns")
        finally:
            os.close(fd)
        try:
            out["value"] = fn()
        except BaseException as exc:    # re-raised in the caller
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")


@contextlib.contextmanager
def attached_probe(ns: str, address: str, config=None):
    from fabricscope.agent import kernel
    from fabricscope.agent.probes.base import Clock, ProbeContext
    from fabricscope.agent.probes.tcp.retransmit import TcpRetransmitProbe
    kernel.prepare()
    addresses = frozenset([address]) if isinstance(address, str) else frozenset(address)
    probe = TcpRetransmitProbe(ProbeContext(ns, addresses, Clock(), config))
    try:
        in_netns(ns, probe.attach)
        yield probe
    finally:
        in_netns(ns, probe.detach)


def collect_until(probe, records, done, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while True:
        records += probe.poll()
        if done(records) or time.monotonic() > deadline:
            return records
        time.sleep(0.05)


def seg_sum(records):
    return sum(r.fields["segs"] for r in records if r.measurement == "tcp_retransmit")


def test_retransmitted_segments_match_nstat_exactly_and_stay_with_their_node(netpair):
    p = netpair
    with attached_probe(p.a, p.addr_a) as probe_a, attached_probe(p.b, p.addr_b) as probe_b:
        assert probe_a.raw_retransmit and probe_b.raw_retransmit
        before = {ns: p.retrans_segs(ns) for ns in (p.a, p.b)}
        p.transfer_until_retransmitted(20, at_least=21)
        kernel = {ns: p.retrans_segs(ns) - before[ns] for ns in (p.a, p.b)}
        assert kernel[p.a] > 20, f"2 % loss should cause retransmits: {kernel}"
        recs_a = collect_until(probe_a, [], lambda r: seg_sum(r) >= kernel[p.a])
        recs_b = collect_until(probe_b, [], lambda r: seg_sum(r) >= kernel[p.b], 2)
        stats_a = probe_a.stats()
    assert seg_sum(recs_a) == kernel[p.a]
    assert seg_sum(recs_b) == kernel[p.b]
    sent = [r for r in recs_a if r.measurement == "tcp_retransmit"]
    assert len(sent) < kernel[p.a]      # TSO: fewer skbs than segments, hence segs
    for r in recs_a:
        assert (r.tags["saddr"], r.tags["daddr"], r.tags["dport"]) == \
            (p.addr_a, p.addr_b, str(PORT))
    assert all(r.tags["saddr"] == p.addr_b for r in recs_b)
    assert stats_a["lost"] == 0 and stats_a["segs_unknown"] == 0
    assert stats_a["emitted"] == len(recs_a) and stats_a["tc_packets"] > 0


def _tcx_egress(ns: str) -> list[int]:
    from fabricscope.agent import tc

    def query():
        from pyroute2 import IPRoute
        with IPRoute() as ipr:
            return tc.tcx_programs(ipr.link_lookup(ifname="eth0")[0], "egress")
    return in_netns(ns, query)


def test_detach_leaves_no_tcx_link_behind(netpair):
    p = netpair
    with attached_probe(p.a, p.addr_a) as probe:
        assert probe._tc.mechanism == "tcx"        # this kernel has tcx (6.6+)
        assert len(_tcx_egress(p.a)) == 1
        # tcx needs no qdisc: nothing shows in tc
        assert "clsact" not in sh("ip", "netns", "exec", p.a, "tc", "qdisc", "show", "dev",
                                  "eth0").stdout
    assert _tcx_egress(p.a) == []


def test_clsact_detach_leaves_no_filter_behind(netpair):
    from fabricscope.agent.config import AgentConfig
    p = netpair
    with attached_probe(p.a, p.addr_a, AgentConfig(tc_attach="clsact")) as probe:
        assert probe._tc.mechanism == "clsact" and _tcx_egress(p.a) == []
        shown = sh("ip", "netns", "exec", p.a, "tc", "filter", "show", "dev", "eth0",
                   "egress").stdout
        assert "tc_egress" in shown
    assert "clsact" not in sh("ip", "netns", "exec", p.a, "tc", "qdisc", "show", "dev",
                              "eth0").stdout


class AgentProc:
    def __init__(self, ns: str, args: list[str]):
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "fabricscope", "agent", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.ns, self.lines, self.stderr = ns, queue.Queue(), []
        threading.Thread(target=lambda: [self.lines.put(x) for x in self.proc.stdout],
                         daemon=True).start()
        threading.Thread(target=lambda: [self.stderr.append(x) for x in self.proc.stderr],
                         daemon=True).start()

    def readyz(self, port: int) -> str:
        return sh("ip", "netns", "exec", self.ns, "curl", "-s", "-o", "/dev/null", "-w",
                  "%{http_code}", f"http://127.0.0.1:{port}/readyz", check=False).stdout

    def await_port(self, timeout_s=60) -> int:
        import re
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.stderr):
                m = re.search(r"serving /metrics and /readyz on 127\.0\.0\.1:(\d+)", line)
                if m:
                    return int(m.group(1))
            assert self.proc.poll() is None, "".join(self.stderr)
            time.sleep(0.05)
        raise AssertionError("".join(self.stderr))

    def records_until(self, done, timeout_s=30):
        out, deadline = [], time.monotonic() + timeout_s
        while not done(out) and time.monotonic() < deadline:
            try:
                out.append(Record.from_json(self.lines.get(timeout=0.2)))
            except queue.Empty:
                pass
        return out

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def test_agent_cli_in_a_namespace_prints_its_records_as_json_lines(netpair, tmp_path):
    p = netpair
    agent = AgentProc(p.a, ["--node", "node-a", "--output", "jsonl", "--metrics-host",
                            "127.0.0.1", "--metrics-port", "0", "--markers-dir",
                            str(tmp_path), "--flush-interval-s", "0.1"])
    try:
        port = agent.await_port()
        deadline = time.monotonic() + 60
        while agent.readyz(port) != "200":
            assert time.monotonic() < deadline and agent.proc.poll() is None, \
                "".join(agent.stderr)
            time.sleep(0.1)
        kernel = p.transfer_until_retransmitted(10, at_least=1)
        subprocess.run([sys.executable, "-c", "from fabricscope import markers\n"
                        "markers.step(0)\nmarkers.step(1)\nmarkers.done()"], check=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT),
                            "FABRICSCOPE_MARKERS_DIR": str(tmp_path), "RANK": "0"})
        recs = agent.records_until(lambda r: seg_sum(r) >= kernel and sum(
            x.measurement == "train_step" for x in r) >= 2)
    finally:
        rc = agent.stop()
    assert rc == 0, "".join(agent.stderr)
    assert seg_sum(recs) == kernel > 0
    assert {r.tags["node"] for r in recs} == {"node-a"}
    # every flow record is node a's own (tcp_node windows name no flow)
    assert {r.tags["saddr"] for r in recs
            if r.measurement.startswith("tcp_") and "saddr" in r.tags} == {p.addr_a}
    assert [r.fields["step"] for r in recs if r.measurement == "train_step"] == [0, 1]
    assert not any("Traceback" in line for line in agent.stderr)
    # `ip netns exec` remounts /sys: the agent had to mount tracefs itself
    assert any("mounted tracefs on /sys/kernel/tracing" in line for line in agent.stderr)


def test_a_packet_through_stacked_interfaces_is_counted_once(netpair):
    """Node addresses on two stacked interfaces (a VLAN device and its parent on a
    real host; here, since this kernel has no 8021q, a bridge and its port): the
    probe hooks both, and each packet sent over the upper one passes TC egress
    twice. Without loss nothing is a retransmission, and the node's sent segments
    are TcpOutSegs, not twice it."""
    p = netpair
    p.no_loss()
    net = random.choice([n for n in range(128, 255) if f"198.19.{n}." not in p.addr_a])
    upper_a, upper_b = f"198.19.{net}.1", f"198.19.{net}.2"
    sh("ip", "-n", p.a, "link", "add", "brin", "type", "bridge")
    sh("ip", "-n", p.a, "link", "set", "eth0", "master", "brin")
    sh("ip", "-n", p.a, "addr", "add", upper_a + "/24", "dev", "brin")
    sh("ip", "-n", p.a, "link", "set", "brin", "up")
    sh("ip", "-n", p.b, "addr", "add", upper_b + "/24", "dev", "eth0")
    with attached_probe(p.a, [p.addr_a, upper_a]) as probe:
        assert sorted({h.ifname for h in probe._tc.hooks}) == ["brin", "eth0"]
        before = probe.stats()
        kernel_before = {k: p.snmp(p.a, k) for k in ("OutSegs", "RetransSegs")}
        p.addr_b = upper_b                          # the transfer goes over brin
        p.transfer(8)
        kernel = {k: p.snmp(p.a, k) - v for k, v in kernel_before.items()}
        records = collect_until(probe, [], lambda r: seg_sum(r) >= kernel["RetransSegs"], 5)
        after = probe.stats()
    # retransmits (a veth backlog may overflow now and then) once, as the kernel's
    assert seg_sum(records) == kernel["RetransSegs"], (kernel, records)
    # TcpOutSegs leaves retransmitted segments out
    assert after["tc_segs"] - before["tc_segs"] == kernel["OutSegs"] + kernel["RetransSegs"], \
        (kernel, before, after)
