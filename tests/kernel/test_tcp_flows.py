"""Acceptance of the tcp_flows probe on the real kernel, in a 3-node lab sharing it.

One lab and one probe per node (attached in the node's namespace) serve the module;
each test measures deltas, uses its own ports and clears its faults in `finally`.
- retransmits per node, by kind, against nstat (TcpRetransSegs, TcpExtTCPFastRetrans,
  ...TCPSlowStartRetrans, ...TCPTimeouts, ...TCPLossProbes) and TC egress against
  TcpOutSegs; no node is charged with another's flows; exact to the segment while
  map syscalls hold the sender's CPU; SYN and SYN-ACK retransmits counted once;
- RTT percentiles against the kernel's srtt (what `ss -ti` prints), within a log2 bucket;
- opens, closes and resets, with exact byte counts;
- transfers and closes count every byte received, also when tcp_probe missed hits, and
  every byte acknowledged, also when it missed a connection's first hits;
- DDP ranks' flows carry their pid, command and rank.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import random
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from fabricscope.lab.stack import await_stable
from fabricscope.records import Record
from fabricscope.schema import validate
from tests.kernel.tcp_lab import (PY, Collector, await_up, finish, nstat, probes_on, send_argv,
                                  sink_argv, traffic)

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parents[2]
COUNTERS = ("TcpRetransSegs", "TcpOutSegs", "TcpExtTCPFastRetrans",
            "TcpExtTCPSlowStartRetrans", "TcpExtTCPTimeouts", "TcpExtTCPLossProbes")


@pytest.fixture(scope="module")
def lab():
    from fabricscope.lab.running import running_lab
    with running_lab(f"tf{uuid.uuid4().hex[:6]}", 3) as lab:
        yield lab


@pytest.fixture(scope="module")
def probes(lab):
    with probes_on(lab) as probes:
        yield probes


@pytest.fixture
def col(lab, probes):
    c = Collector(lab, probes)
    c.clear()
    return c


def segs(records, kind=None):
    return sum(r.fields["segs"] for r in records
               if r.measurement == "tcp_retransmit" and kind in (None, r.tags["kind"]))


def close_to(got, want, rel=0.02, slack=1):
    return abs(got - want) <= max(slack, rel * want)


def test_retransmits_per_node_match_nstat_by_kind(lab, probes, col):
    from fabricscope.lab.faults import clear, loss
    n0, n1, n2 = lab.nodes
    # retransmits found on TC egress, kinds from raw tracepoints (this kernel has them)
    assert all(p.raw_retransmit for p in probes)
    before, begun = [], []
    for n in lab.nodes:
        before.append(nstat(n.netns))
        # the kernel counts a retransmit before TC egress stamps it: an event stamped
        # after the read ended is not in it (records drained after the fixture's clear
        # may be older: a previous test's last retransmits)
        begun.append(time.time_ns())
    missed_before = [p.stats()["missed_retransmits"] for p in probes]
    try:
        loss(lab, 1, 2.0)                      # frames node 1 sends and receives
        with traffic([(n0, sink_argv(5301)), (n1, sink_argv(5302)), (n1, sink_argv(5303))]) \
                as sinks:
            for s in sinks:
                await_up(s)
            # enough GSO packets per sender that 2 % loss surely hits each of them (with
            # 16 MiB, node 2 once saw a single retransmit)
            with traffic([(n1, send_argv(n0.address, 5301, 48 << 20)),
                          (n0, send_argv(n1.address, 5302, 32 << 20)),
                          (n2, send_argv(n1.address, 5303, 32 << 20))]) as senders:
                for p in senders + sinks:
                    finish(p)
    finally:
        clear(lab, 1)
    kernel, read_at = [], []
    for b, n in zip(before, lab.nodes):
        # the kernel counts a retransmit before it reaches TC egress, which stamps our
        # event: every event stamped before the read began is in the read
        read_at.append(time.time_ns())
        after = nstat(n.netns)
        kernel.append({k: after.get(k, 0) - b.get(k, 0) for k in COUNTERS})
    assert all(k["TcpRetransSegs"] > 20 for k in kernel), kernel
    start = time.time_ns()
    # A window started after the traffic: every event before it has been drained.
    col.until(lambda c: all(any(r.time_ns > start for r in c.of(i, "tcp_node"))
                            for i in range(3)), 30, "a window after the traffic on every node")
    col.settle()                # and the records waiting for their owners' tags
    for i, node in enumerate(lab.nodes):
        # compare the span the kernel's counters cover: a FIN can still be resent while
        # the sockets close (CI once counted a FIN's loss probe sent between node 0's
        # read and the last node's)
        recs = [r for r in col.records[i] if begun[i] <= r.time_ns < read_at[i]]
        k = kernel[i]
        # a string: pytest prints it whole (a tuple's repr it would cut short)
        why = repr((i, k, {kind: segs(recs, kind) for kind in ("fast", "rto", "slow_start", "tlp")},
                    probes[i].stats(), [(r.time_ns, r.fields) for r in recs
                                        if r.measurement.startswith("tcp_retransmit")], read_at[i]))
        # attribution: only this node's flows, on this node only
        assert {r.tags["saddr"] for r in recs if "saddr" in r.tags} == {node.address}
        for r in recs:
            validate(Record(r.measurement, r.time_ns, {**r.tags, "node": node.name}, r.fields))
        missed = probes[i].stats()["missed_retransmits"] - missed_before[i]
        if missed:
            # Another tracing program (a uprobe of a concurrent test, ...) ran on the CPU
            # when a retransmit fired, so the kernel skipped ours: it must be counted
            # (in events_lost_total), and explain the shortfall (<= 45 segments per skb).
            short = k["TcpRetransSegs"] - segs(recs)
            assert 0 <= short <= 45 * missed, why
            continue
        assert close_to(segs(recs), k["TcpRetransSegs"]), why
        assert close_to(segs(recs, "fast"), k["TcpExtTCPFastRetrans"]), why
        assert close_to(segs(recs, "slow_start"), k["TcpExtTCPSlowStartRetrans"]), why
        timeouts = sum(r.tags["kind"] in ("rto", "syn", "synack") for r in recs
                       if r.measurement == "tcp_retransmit")
        assert close_to(timeouts, k["TcpExtTCPTimeouts"]), why
        tlps = sum(r.tags["kind"] == "tlp" for r in recs if r.measurement == "tcp_retransmit")
        assert tlps <= k["TcpExtTCPLossProbes"], why
        windows = col.of(i, "tcp_node")
        out = sum(w.fields["segs_out"] - w.fields["retrans_segs"] for w in windows)
        assert close_to(out, k["TcpOutSegs"]), (i, out, k)
        ratio = sum(w.fields["retrans_bytes"] for w in windows) / \
            sum(w.fields["bytes_out"] for w in windows)
        assert 0.002 < ratio < 0.2, ratio


def test_retransmits_are_exact_while_map_syscalls_hold_the_senders_cpu(lab, probes, col):
    """The kernel skips tracepoint programs while a BPF map syscall runs on their CPU
    (sometimes without counting the skip); retransmits are found on TC egress, which
    always runs. Sender and a map-syscall hammer share CPU 0 under 2 % loss: node 0's
    retransmitted segments equal its TcpRetransSegs, to the segment."""
    from fabricscope.lab.faults import clear, loss
    n0, n1 = lab.nodes[0], lab.nodes[1]
    before = nstat(n0.netns)["TcpRetransSegs"]
    begun, reads = time.time_ns(), []     # what the two reads cover: see the test above

    def retransmitted() -> int:
        reads.append(time.time_ns())
        return nstat(n0.netns)["TcpRetransSegs"] - before
    try:
        loss(lab, 1, 2.0)
        with traffic([(n1, ["taskset", "-c", "0", sys.executable, "-c", MAP_SYSCALLS])]) \
                as (hammer,):
            await_up(hammer)
            with traffic([(n1, sink_argv(5355))]) as (sink,):
                await_up(sink)
                with traffic([(n0, ["taskset", "-c", "0",
                                    *send_argv(n1.address, 5355, 32 << 20)])]) as (sender,):
                    finish(sender)
                finish(sink)
        # a FIN can still be retransmitted while the socket closes: count once settled
        # (the last read found what the reads of the quiet second before it found)
        kernel = await_stable(retransmitted, quiet_s=1.0, timeout_s=30,
                              what="node 0's TcpRetransSegs")
    finally:
        clear(lab, 1)
    assert kernel > 20, f"2 % loss should make node 0 retransmit, kernel counted {kernel}"
    start = time.time_ns()
    col.until(lambda c: any(r.time_ns > start for r in c.of(0, "tcp_node")), 30,
              "a window after the traffic")
    col.settle()
    recs = [r for r in col.records[0] if begun <= r.time_ns < reads[-1]]
    assert segs(recs) == kernel, (kernel, probes[0].stats(),
                                  [(r.tags["kind"], r.fields) for r in recs
                                   if r.measurement == "tcp_retransmit"])


# connect(), then hold the socket: "connected", or "timeout" once the client gives up
CONNECT = """import socket, sys, time
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    print("connected", flush=True)
    time.sleep(float(sys.argv[3]))
except OSError:
    print("timeout")
"""


@pytest.mark.parametrize("kind", ["syn", "synack"])
def test_handshake_retransmits_are_counted_once_with_their_kind(lab, probes, col, kind):
    """syn: node 1 drops our SYNs, so node 0 resends the SYN (1 s, then 3 s after the
    first), each repeating the socket's initial sequence number, which is how TC
    egress knows it for a retransmit. synack: node 1 drops the handshake's last ACK,
    so it resends its SYN-ACK, which acknowledges the same SYN again: also found on
    TC egress (the synack tracepoint, its source before, was once skipped by the
    kernel in CI: 1 of 2). One segment each, as nstat counts them (TcpRetransSegs,
    TcpExtTCPSynRetrans)."""
    n0, n1 = lab.nodes[0], lab.nodes[1]
    port = 5357 if kind == "syn" else 5358
    sender = n0 if kind == "syn" else n1
    dropped = "syn" if kind == "syn" else "ack"
    table = f"fs_{kind}_drop_{uuid.uuid4().hex[:6]}"
    nft = ["ip", "netns", "exec", n1.netns, "nft"]
    before = nstat(sender.netns)
    with traffic([(n1, sink_argv(port))] if kind == "synack" else []) as listeners:
        for p in listeners:
            await_up(p)
        subprocess.run([*nft, "-f", "-"], check=True, text=True, input=(
            f"table inet {table} {{\n chain input {{\n type filter hook input priority 0;\n"
            f" tcp dport {port} tcp flags & (syn | ack) == {dropped} drop\n }}\n}}\n"))
        try:
            out = subprocess.run(["ip", "netns", "exec", n0.netns, sys.executable, "-c",
                                  CONNECT, n1.address, str(port), "3.5"], capture_output=True,
                                 text=True, timeout=30).stdout.split()
        finally:
            subprocess.run([*nft, "delete", "table", "inet", table], check=False)
    assert out == (["timeout"] if kind == "syn" else ["connected"])
    counters = ("TcpRetransSegs", "TcpExtTCPSynRetrans")
    kernel = await_stable(lambda: {k: nstat(sender.netns).get(k, 0) - before.get(k, 0)
                                   for k in counters},
                          quiet_s=1.0, timeout_s=30, what=f"node {sender.index}'s counters")
    assert kernel["TcpExtTCPSynRetrans"] >= 2, kernel
    start = time.time_ns()
    col.until(lambda c: any(r.time_ns > start for r in c.of(sender.index, "tcp_node")), 30,
              "a window after the handshake")
    col.settle()
    side = "dport" if kind == "syn" else "sport"
    recs = [r for r in col.of(sender.index, "tcp_retransmit") if r.tags[side] == str(port)]
    state = "SYN_SENT" if kind == "syn" else "SYN_RECV"
    assert [(r.tags["kind"], r.tags["state"], r.fields["segs"]) for r in recs] == \
        [(kind, state, 1)] * kernel["TcpExtTCPSynRetrans"], (kernel, recs)
    assert kernel["TcpRetransSegs"] == kernel["TcpExtTCPSynRetrans"], kernel


INET_DIAG_INFO = 2       # the dump's tcp_info attribute
TCPI_RTT_AT = 68         # struct tcp_info: 8 bytes of u8 fields, then u32s; tcpi_rtt the 16th


def _srtts_us(dport: int) -> list[int]:
    """srtt (us) of the established TCP sockets to dport in this thread's namespace, the
    rtt that `ss -ti` prints, from one sock_diag dump with tcp_info: no process started
    (`ip netns exec ss` took a median 16 ms here, 68 ms with both cores busy)."""
    req = struct.pack("=BBBxI48x", socket.AF_INET, socket.IPPROTO_TCP,
                      1 << (INET_DIAG_INFO - 1), 1 << 1)            # TCP_ESTABLISHED
    out: list[int] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4) as nl:  # NETLINK_SOCK_DIAG
        nl.send(struct.pack("=IHHII", 16 + len(req), 20, 0x301, 1, 0) + req)  # dump
        while True:
            buf, at = nl.recv(1 << 16), 0
            while at + 16 <= len(buf):
                length, kind = struct.unpack_from("=IH", buf, at)
                if kind == 3:                                     # NLMSG_DONE
                    return out
                assert kind == 20 and length >= 16 + 72, (kind, length)
                if struct.unpack_from("!H", buf, at + 16 + 6)[0] == dport:   # idiag_dport
                    attr = at + 16 + 72                           # after inet_diag_msg
                    while attr + 4 <= at + length:
                        alen, atype = struct.unpack_from("=HH", buf, attr)
                        if atype == INET_DIAG_INFO and alen >= 4 + TCPI_RTT_AT + 4:
                            out += struct.unpack_from("=I", buf, attr + 4 + TCPI_RTT_AT)
                        attr += max(4, (alen + 3) & ~3)
                at += (length + 3) & ~3


def _sample_srtts(netns: str, dport: int, sender, out: list) -> None:
    """(wall ns, srtt us) of the connection to dport, every 0-10 ms (random) while the
    sender runs, read in the namespace by a thread of this process."""
    from tests.kernel.test_agent_kernel import in_netns
    pace = random.Random(dport)

    def sample() -> None:
        while sender.poll() is None:
            t = time.time_ns()
            out.extend((t, us) for us in _srtts_us(dport))
            time.sleep(pace.uniform(0.0, 0.01))
    in_netns(netns, sample)


def test_rtt_percentiles_agree_with_ss(lab, col):
    from fabricscope.lab.faults import clear, shape
    n0, n1 = lab.nodes[0], lab.nodes[1]
    samples: list[tuple[int, float]] = []        # (wall ns, srtt us) from sock_diag
    try:
        shape(lab, 1, "40mbit", "16kb")          # a standing queue toward node 1: ms RTTs
        with traffic([(n1, sink_argv(5311))]) as (sink,):
            await_up(sink)
            with traffic([(n0, send_argv(n1.address, 5311, seconds=4.0))]) as (sender,):
                # the kernel's srtt in a thread of its own, at random intervals: the RTT
                # saws between 0.1 and 5 ms (the shaper's drops), and the median of a few
                # samples at a steady beat (the poll loop's) can land on one phase of it;
                # CI once compared 3968 us from ss with 695 us of ours in a window so
                # sampled. Read by sock_diag, not `ss`: at a process per sample a busy
                # machine's 1 s window got ~11 samples, under the 20 compared
                sampler = threading.Thread(target=_sample_srtts, daemon=True,
                                           args=(n0.netns, 5311, sender, samples))
                sampler.start()
                while sender.poll() is None:
                    col.poll()
                    time.sleep(0.05)
                sampler.join()
                finish(sender)
            finish(sink)
    finally:
        clear(lab, 1)
    col.until(lambda c: any(r.time_ns > samples[-1][0] for r in c.of(0, "tcp_node")), 10,
              "a window after the transfer")
    windows = [r for r in col.of(0, "tcp_flow") if r.tags["dport"] == "5311"
               and r.fields["rtt_samples"] >= 20]
    compared = 0
    for w in windows:
        end = w.time_ns + int(w.fields["seconds"] * 1e9)
        # Ours samples srtt at each ACK that advanced snd_una, the sampler at random
        # instants: through a stall (the shaper dropped a tail, and the retransmission
        # timer runs for 200 ms or more) srtt stands still at its last value, high, and
        # only the sampler keeps reading it (a CI window: ours 431 us, 4743 us from
        # readings of a frozen srtt). A run of equal readings is one kernel update.
        ss = [us for i, (t, us) in enumerate(samples)
              if w.time_ns <= t < end and (i == 0 or samples[i - 1][1] != us)]
        if len(ss) < 20:
            continue
        ours, theirs = w.fields["rtt_p50_us"], statistics.median(ss)
        # ours comes from a log2 histogram (interpolated inside the bucket, so right to
        # the bucket): ss's median lies in the same bucket or a neighbour, "within a
        # log2 bucket" (a log2 distance of 1 failed once: 589 us vs 1187 us)
        assert abs(math.floor(math.log2(ours)) - math.floor(math.log2(theirs))) <= 1, \
            (w.fields, theirs)
        assert w.fields["rtt_min_us"] <= ours <= w.fields["rtt_max_us"]
        assert w.fields["rtt_p50_us"] <= w.fields["rtt_p90_us"] <= w.fields["rtt_p99_us"]
        compared += 1
        print(f"window {compared}: ours {ours:.0f} us, kernel's srtt median {theirs:.0f} us "
              f"of {len(ss)} samples (log2 distance {abs(math.log2(ours / theirs)):.2f})")
    assert compared >= 2, (windows, len(samples))
    assert statistics.median(us for _, us in samples) > 500    # the shaper made ms RTTs


def test_opens_closes_and_resets_with_exact_bytes(lab, col):
    n0, n1 = lab.nodes[0], lab.nodes[1]
    nbytes = 3_000_000
    with traffic([(n1, sink_argv(5321, exact=nbytes))]) as (sink,):
        await_up(sink)
        with traffic([(n0, send_argv(n1.address, 5321, nbytes, exact=nbytes, hold=1.0))]) \
                as (sender,):
            client_pid = sender.pid
            while sender.poll() is None:       # as the agent does: owners found while open
                col.poll()
                time.sleep(0.1)
            assert int(finish(sender)) == nbytes
        assert int(finish(sink)) == nbytes + 1
    # a refused connection: node 1 sends a RST without a socket, node 0 receives it
    refused = subprocess.run(["ip", "netns", "exec", n0.netns, "python3", "-c",
                              "import socket\ntry:\n socket.create_connection("
                              f"('{n1.address}', 5329))\nexcept ConnectionRefusedError:\n"
                              " print('refused')"], capture_output=True, text=True)
    assert refused.stdout.strip() == "refused", refused.stderr

    def flow_closed(c):
        return any(r.tags["dport"] == "5321" for r in c.of(0, "tcp_flow_close")) and \
            any(r.tags["dport"] == "5329" for r in c.of(0, "tcp_flow_close")) and \
            c.of(1, "tcp_reset") and c.of(0, "tcp_reset")
    col.until(flow_closed, 20, "closes and resets")
    (opened,) = [r for r in col.of(0, "tcp_flow_open") if r.tags["dport"] == "5321"]
    assert opened.tags["side"] == "client" and opened.fields["handshake_us"] > 0
    assert opened.tags["pid"] == str(client_pid)    # ip netns exec execs python: same pid
    (closed,) = [r for r in col.of(0, "tcp_flow_close") if r.tags["dport"] == "5321"]
    # the data and the sender's "z"; sent: and the FIN, acknowledged before the close
    assert closed.fields["bytes_acked"] == nbytes + 1 and \
        closed.fields["bytes_sent"] == nbytes + 2, (closed.tags, closed.fields)
    assert closed.fields["established"] and closed.fields["duration_s"] >= 1.0
    assert any(r.tags["sport"] == "5321" and r.tags["side"] == "server"
               for r in col.of(1, "tcp_flow_open"))
    (failed,) = [r for r in col.of(0, "tcp_flow_close") if r.tags["dport"] == "5329"]
    assert failed.tags["from_state"] == "SYN_SENT" and failed.fields["established"] is False
    sent = [r for r in col.of(1, "tcp_reset") if r.tags["sport"] == "5329"]
    assert sent and sent[0].tags["direction"] == "sent" and "state" not in sent[0].tags
    got = [r for r in col.of(0, "tcp_reset") if r.tags["dport"] == "5329"]
    assert got and got[0].tags["direction"] == "received"
    col.until(lambda c: sum(r.fields["bytes_acked"] for r in c.of(0, "tcp_flow")
                            if r.tags["dport"] == "5321") >= nbytes + 1, 10,
              "the flow's windows")
    assert sum(r.fields["bytes_acked"] for r in col.of(0, "tcp_flow")
               if r.tags["dport"] == "5321") == nbytes + 1


# Sends pieces of argv[3:] bytes: after each, waits until the peer acknowledged all of
# it (TIOCOUTQ 0), then pauses `pauses`[i] seconds.
PIECES = """import fcntl, socket, struct, sys, termios, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
for size, pause in zip(map(int, sys.argv[3:]), (0.008, 0.5, 0.0)):
    s.sendall(b"x" * size)
    while struct.unpack("i", fcntl.ioctl(s, termios.TIOCOUTQ, b"0000"))[0]:
        time.sleep(0.0002)
    time.sleep(pause)
s.close()
"""


def test_a_small_piece_right_after_a_transfer_is_its_tail_not_chatter(lab, col):
    """A stall splits a bulk transfer; its small rest is reported (with the pause), a
    small piece long after is not."""
    n0, n1 = lab.nodes[0], lab.nodes[1]
    tail0 = col.probes[0].stats()["transfers_tail"]
    small0 = col.probes[0].stats()["transfers_small"]
    with traffic([(n1, sink_argv(5323))]) as (sink,):
        await_up(sink)
        with traffic([(n0, [sys.executable, "-c", PIECES, n1.address, "5323",
                            "300000", "3000", "2000"])]) as (sender,):
            finish(sender)
        assert int(finish(sink)) == 305_000

    def mine(c):
        return [r for r in c.of(0, "tcp_transfer") if r.tags["dport"] == "5323"]
    col.until_closed(lambda c: any(r.tags["dport"] == "5323" for r in c.of(0, "tcp_flow_close")),
                     "the flow's close")
    pieces = sorted(mine(col), key=lambda r: r.time_ns)
    # the stall-split rest counts; the piece half a second later does not
    assert sum(r.fields["bytes_out"] for r in pieces) == 303_000, [(r.fields, r.time_ns) for r in pieces]
    assert "gap_s" not in pieces[0].fields
    last = pieces[-1]
    assert last.fields["bytes_out"] == 3000 and 0.002 < last.fields["gap_s"] <= 0.020, last
    stats = col.probes[0].stats()
    assert stats["transfers_tail"] - tail0 >= 1 and stats["transfers_small"] - small0 >= 1


# Connects, then waits for a line on stdin before it sends argv[3] bytes and closes.
SEND_ON_CUE = """import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
print("connected", flush=True)
sys.stdin.readline()
s.sendall(b"x" * int(sys.argv[3]))
s.close()
"""


def test_duplicate_segments_are_not_counted_as_received(lab, col):
    """Node 0 drops every ACK of node 1 for a while, so it resends segments node 1
    already has (its retransmission timer): tcp_probe fires for each again, and our
    ACKs, which do not advance, take them off (the kernel's D-SACKs of old data count
    them, TcpExtTCPDSACKOldSent). The close counts each byte once (counting data_len
    per hit, it counted 402,896 of 400,000: two resent segments)."""
    n0, n1 = lab.nodes[0], lab.nodes[1]
    port, nbytes = 5324, 400_000
    table = f"fs_ack_drop_{uuid.uuid4().hex[:6]}"
    nft = ["ip", "netns", "exec", n0.netns, "nft"]
    unacked0 = col.probes[1].stats()["received_unacked_bytes"]
    dsacks0 = nstat(n1.netns).get("TcpExtTCPDSACKOldSent", 0)
    with traffic([(n1, sink_argv(port))]) as (sink,):
        await_up(sink)
        with traffic([(n0, [sys.executable, "-c", SEND_ON_CUE, n1.address, str(port),
                            str(nbytes)])]) as (sender,):
            assert sender.stdout.readline().strip() == "connected", sender.stderr.read()
            subprocess.run([*nft, "-f", "-"], check=True, text=True, input=(
                f"table inet {table} {{\n chain input {{\n type filter hook input priority 0;\n"
                f" tcp sport {port} drop\n }}\n}}\n"))
            try:
                sender.stdin.write("go\n")
                sender.stdin.flush()
                col.until(lambda c: nstat(n1.netns).get("TcpExtTCPDSACKOldSent", 0) > dsacks0,
                          60, "node 1 receiving a segment twice")
            finally:
                subprocess.run([*nft, "delete", "table", "inet", table], check=False)
            finish(sender)
        assert int(finish(sink)) == nbytes

    def mine(c):
        return [r for r in c.of(1, "tcp_flow_close") if r.tags["sport"] == str(port)]
    col.until_closed(mine, "node 1's close")
    (closed,) = mine(col)
    # exact: each resent segment tcp_probe saw was taken off (received_unacked_bytes
    # grows by it). Whether it saw them is the kernel's: it skips the program on a busy
    # CPU now and then, and an unseen duplicate needs no taking off
    assert closed.fields["bytes_received"] == nbytes, \
        (closed, col.probes[1].stats()["received_unacked_bytes"] - unacked0)


# Keeps BPF map syscalls running on CPU 0 (lookups of a full per-CPU LRU hash, as an
# agent's drain does): each raises the CPU's bpf_prog_active, so a tracepoint program
# that runs meanwhile on that CPU (a task preempting it there) is skipped.
MAP_SYSCALLS = """import ctypes, sys
from bcc import BPF
m = BPF(text='BPF_TABLE("lru_percpu_hash", u64, u64, m, 4096);')["m"]
for i in range(4096):
    m[ctypes.c_ulonglong(i)] = m.Leaf(*([1] * m.total_cpu))
print("up", flush=True)
while True:
    for _ in m.items():
        pass
"""


# more than one wrap of a TCP sequence number, and not a multiple of it
WRAPS_ACK_NUMBERS = (1 << 32) + (1 << 29)


def test_received_bytes_of_missed_tcp_probe_hits_are_recovered_from_our_acks(lab, col):
    """tcp_probe misses hits while a map syscall holds the CPU (the receiver shares
    CPU 0 with one); the transfers and the close still count every byte received.
    The starved receiver also makes the sender retransmit (tail loss probes): those
    duplicates count twice, by design, so the counts lie in [sent, sent +
    retransmitted payload, from the sender's own probe]. Each round sends more than
    4 GiB, so the ACK numbers that the recovery compares wrap within a transfer.
    The hammer starves the agent's reader as well: where the ring had no room for
    some transfer events (counted lost), their bytes are missing from the transfers,
    never from the close, which waits in the kernel until it can go out."""
    n0, n1 = lab.nodes[0], lab.nodes[1]
    probe = col.probes[1]
    before = probe.stats()
    rounds = []
    with traffic([(n1, ["taskset", "-c", "0", sys.executable, "-c", MAP_SYSCALLS])]) as (hammer,):
        await_up(hammer)
        for k in range(12):        # until a miss happened (most rounds have some)
            port, small0, lost0 = 5340 + k, probe.stats()["transfers_small"], probe.stats()["lost"]
            with traffic([(n1, ["taskset", "-c", "0", *sink_argv(port)])]) as (sink,):
                await_up(sink)
                with traffic([(n0, send_argv(n1.address, port, nbytes=WRAPS_ACK_NUMBERS))]) as (sender,):
                    sent = int(finish(sender))
                assert int(finish(sink)) == sent
            col.until_closed(lambda c, p=str(port): any(r.tags["sport"] == p
                                                        for r in c.of(1, "tcp_flow_close"))
                             and any(r.tags["dport"] == p for r in c.of(0, "tcp_flow_close")),
                             "the flow's close on both ends")
            # pieces under tcp_transfer_min_bytes long after the one before (the sink
            # starved for over tcp_transfer_tail_us) are only counted, by design
            rounds.append((port, sent, probe.stats()["transfers_small"] - small0,
                           probe.stats()["lost"] - lost0))
            if probe.stats()["received_recovered_bytes"] > before["received_recovered_bytes"]:
                break
    after = probe.stats()
    recovered = after["received_recovered_bytes"] - before["received_recovered_bytes"]
    assert recovered > 0, f"no tcp_probe hit was missed in {len(rounds)} rounds"
    # the kernel's count of skipped runs is exported too; it can stay flat while bytes
    # go missing (not every hit that never ran our program is counted there)
    assert after["missed_hits"] >= before["missed_hits"]
    for port, sent, small, lost in rounds:
        dup = sum(r.fields.get("payload_bytes", 1 << 16) for r in col.of(0, "tcp_retransmit")
                  if r.tags["dport"] == str(port))
        (close,) = [r for r in col.of(1, "tcp_flow_close") if r.tags["sport"] == str(port)]
        assert sent <= close.fields["bytes_received"] <= sent + dup, (port, sent, dup, close)
        got = sum(r.fields["bytes_in"] for r in col.of(1, "tcp_transfer")
                  if r.tags["sport"] == str(port))
        assert got <= sent + dup, (port, sent, got, dup)
        if lost == 0:        # else the shortfall is the events counted lost
            assert got >= sent - small * 65536, (port, sent, got, small, dup)
            if small == 0:
                assert got >= sent, (port, sent, got, recovered)


# Sends argv[3] bytes, waits until the peer acknowledged them (TIOCOUTQ 0), says so
# and waits for a line on stdin; then sends argv[4] more in the sink's EXACT protocol.
SEND_AFTER_GO = """import fcntl, socket, struct, sys, termios, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.sendall(b"x" * int(sys.argv[3]))
while struct.unpack("i", fcntl.ioctl(s, termios.TIOCOUTQ, b"0000"))[0]:
    time.sleep(0.0002)
print("acked", flush=True)
sys.stdin.readline()
s.sendall(b"x" * int(sys.argv[4]))
assert s.recv(1) == b"k"
s.sendall(b"z")
assert s.recv(1) == b"y"
s.shutdown(socket.SHUT_WR)
s.recv(1)
"""


def send_first_unseen(lab, probe, port: int, first: int, rest: int) -> None:
    """Node 0 sends `first` bytes to a sink on node 1 while `probe`'s gate drops every
    hit (its window generation 0: the state before its first window), waits until
    they are acknowledged, reopens the gate and sends `rest` more in the sink's EXACT
    protocol (the sink answers one byte, node 0 one more)."""
    n0, n1 = lab.nodes[0], lab.nodes[1]
    window = probe._bpf[b"window"]
    with traffic([(n1, sink_argv(port, exact=first + rest))]) as (sink,):
        await_up(sink)
        window[ctypes.c_int(0)] = ctypes.c_uint32(0)      # no poll runs until restored
        try:
            with traffic([(n0, [PY, "-c", SEND_AFTER_GO, n1.address, str(port), str(first),
                                str(rest)])]) as (sender,):
                assert sender.stdout.readline().strip() == "acked", sender.stderr.read()
                window[ctypes.c_int(0)] = ctypes.c_uint32(probe._gen)
                sender.stdin.write("go\n")
                sender.stdin.flush()
                finish(sender)
        finally:
            window[ctypes.c_int(0)] = ctypes.c_uint32(probe._gen)
        assert int(finish(sink)) == first + rest + 1


def test_bytes_acknowledged_before_a_sockets_first_tcp_probe_hit_are_counted(lab, probes, col):
    """A new connection's first tcp_probe hits go uncounted (the kernel skips the
    program now and then: the first ACKs of a slow start, 7,240 bytes in one CI run).
    Here the program's own gate drops them for certain: node 0's window generation
    is 0 (the state before its first window) until the first piece is acknowledged.
    The connection's bytes then count from the first sequence number TC egress saw
    it send: the close, the windows and the transfers hold every byte acknowledged."""
    probe, first, rest = probes[0], 100_000, 300_000
    before = probe.stats()["acked_before_first_hit_bytes"]
    send_first_unseen(lab, probe, 5360, first, rest)
    col.until_closed(lambda c: any(r.tags["dport"] == "5360" for r in c.of(0, "tcp_flow_close")),
                     "the flow's close")
    (close,) = [r for r in col.of(0, "tcp_flow_close") if r.tags["dport"] == "5360"]
    # the data and the EXACT protocol's "z"; sent: and the FIN, acknowledged before the close
    assert close.fields["bytes_acked"] == first + rest + 1, close
    assert close.fields["bytes_sent"] == first + rest + 2, close
    assert probe.stats()["acked_before_first_hit_bytes"] - before == first
    col.until(lambda c: sum(r.fields["bytes_acked"] for r in c.of(0, "tcp_flow")
                            if r.tags["dport"] == "5360") >= first + rest + 1,
              10, "the flow's windows")
    assert sum(r.fields["bytes_acked"] for r in col.of(0, "tcp_flow")
               if r.tags["dport"] == "5360") == first + rest + 1
    # "z" counts for the transfer in progress at the close, reported only where it
    # follows the bulk within the tail window (a loaded host may part them)
    assert first + rest <= sum(r.fields["bytes_out"] for r in col.of(0, "tcp_transfer")
                               if r.tags["dport"] == "5360") <= first + rest + 1


# Answers each request of argv[2] bytes with 8 bytes at once, as a store acknowledges a
# write; closes after the client did.
ANSWER_EACH = """import socket, sys
srv = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("up", flush=True)
conn, _ = srv.accept()
size = int(sys.argv[2])
while True:
    got = 0
    while got < size:
        piece = conn.recv(size - got)
        if not piece:
            sys.exit(0)
        got += len(piece)
    conn.sendall(b"k" * 8)
"""
# Sends argv[4] requests of argv[3] bytes, each after the answer to the one before;
# closes first.
ASK_EACH = """import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
size, count = int(sys.argv[3]), int(sys.argv[4])
for _ in range(count):
    s.sendall(b"x" * size)
    got = 0
    while got < 8:
        got += len(s.recv(8 - got))
s.close()
"""


def test_bytes_acknowledged_by_the_last_segment_before_our_close_are_counted(lab, col):
    """tcp_probe shows a socket as the segment before left it, so each hit counts what
    the one before acknowledged. A peer that answers every request at once (a store
    acknowledging writes) makes its ACK ride on the answer after the first few (the
    delayed ACK of an interactive connection), and a socket that closes first gets no
    hit after the last answer: its last request's bytes are acknowledged but would go
    uncounted. A close from FIN_WAIT2 (our FIN acknowledged) says every byte sent was:
    the close and the windows hold them all."""
    n0, n1 = lab.nodes[0], lab.nodes[1]
    size, count, port = 1000, 80, 5367
    with traffic([(n1, [PY, "-c", ANSWER_EACH, str(port), str(size)])]) as (server,):
        await_up(server)
        with traffic([(n0, [PY, "-c", ASK_EACH, n1.address, str(port), str(size),
                            str(count)])]) as (client,):
            finish(client)
        finish(server)
    col.until_closed(lambda c: any(r.tags["dport"] == str(port)
                                   for r in c.of(0, "tcp_flow_close")), "the flow's close")
    (close,) = [r for r in col.of(0, "tcp_flow_close") if r.tags["dport"] == str(port)]
    assert close.tags["from_state"] == "FIN_WAIT2", close
    assert close.fields["bytes_acked"] == size * count, close
    col.until(lambda c: sum(r.fields["bytes_acked"] for r in c.of(0, "tcp_flow")
                            if r.tags["dport"] == str(port)) >= size * count,
              10, "the flow's windows")
    assert sum(r.fields["bytes_acked"] for r in col.of(0, "tcp_flow")
               if r.tags["dport"] == str(port)) == size * count


def test_bytes_received_before_a_sockets_first_tcp_probe_hit_are_counted(lab, probes, col):
    """A socket's first tcp_probe hits, which the kernel skips now and then while a
    map syscall holds the CPU, carry received bytes too. Here the program's gate
    drops them for certain (node 1's window generation 0) until the first piece is
    acknowledged by our ACKs. The recovery counts from the accepted socket's SYN-ACK,
    which acknowledged no data, so the close holds every byte received."""
    probe, first, rest, port = probes[1], 100_000, 300_000, 5361
    recovered0 = probe.stats()["received_recovered_bytes"]
    send_first_unseen(lab, probe, port, first, rest)
    col.until_closed(lambda c: any(r.tags["sport"] == str(port)
                                   for r in c.of(1, "tcp_flow_close")), "the flow's close")
    (close,) = [r for r in col.of(1, "tcp_flow_close") if r.tags["sport"] == str(port)]
    assert close.fields["bytes_received"] == first + rest + 1, close
    assert probe.stats()["received_recovered_bytes"] - recovered0 >= first


# Answers a client's first request byte with argv[2] bytes, then, after a line on stdin
# and a pause longer than tcp_transfer_gap_us, argv[3] more: one response in two parts
# (a storage server waiting on its disk); a second request gets argv[4].
RESPOND_IN_TWO = """import socket, sys, time
a, b, c = map(int, sys.argv[2:5])
srv = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("up", flush=True)
conn, _ = srv.accept()
assert conn.recv(1) == b"r"
conn.sendall(b"x" * a)
sys.stdin.readline()
time.sleep(0.01)
conn.sendall(b"x" * b)
assert conn.recv(1) == b"r"
conn.sendall(b"x" * c)
conn.recv(1)
"""
# Requests argv[3] + argv[4] bytes and says "a" and "b" as each part is in; after a
# line on stdin and a think time (longer than tcp_transfer_gap_us: a new transfer),
# requests argv[5] bytes.
REQUEST_TWICE = """import socket, sys, time
a, b, c = map(int, sys.argv[3:6])
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))

def read(n):
    got = 0
    while got < n:
        got += len(s.recv(n - got))

s.sendall(b"r")
read(a)
print("a", flush=True)
read(b)
print("b", flush=True)
sys.stdin.readline()
time.sleep(0.01)
s.sendall(b"r")
read(c)
s.shutdown(socket.SHUT_WR)
"""


def test_a_responses_missed_tail_counts_for_it_not_for_the_next_response(lab, probes, col):
    """A read on a persistent connection whose last hits tcp_probe missed: its bytes
    are recovered from our ACKs at the next response's first hit, and they came
    before our next request (whose ACK covered them), so they are the read's own,
    however late our ACK of them left. Here the program's gate drops the tail for
    certain (node 0's window generation 0), and the tail comes 10 ms after the rest
    (its ACK leaves past the transfer gap, as a read's last ACK does when the reader
    is descheduled on a loaded host)."""
    n0, n1 = lab.nodes[0], lab.nodes[1]
    probe, (a, b, c), port = probes[0], (300_000, 200_000, 400_000), 5365
    window = probe._bpf[b"window"]
    recovered0 = probe.stats()["received_recovered_bytes"]
    with traffic([(n1, [PY, "-c", RESPOND_IN_TWO, str(port), str(a), str(b), str(c)])]) \
            as (server,):
        await_up(server)
        with traffic([(n0, [PY, "-c", REQUEST_TWICE, n1.address, str(port), str(a), str(b),
                            str(c)])]) as (client,):
            try:
                assert client.stdout.readline().strip() == "a", client.stderr.read()
                window[ctypes.c_int(0)] = ctypes.c_uint32(0)  # no poll runs until restored
                server.stdin.write("go\n")
                server.stdin.flush()
                assert client.stdout.readline().strip() == "b", client.stderr.read()
            finally:
                window[ctypes.c_int(0)] = ctypes.c_uint32(probe._gen)
            client.stdin.write("go\n")
            client.stdin.flush()
            finish(client)
        finish(server)
    col.until_closed(lambda c: any(r.tags["dport"] == str(port)
                                   for r in c.of(0, "tcp_flow_close")), "the flow's close")
    assert probe.stats()["received_recovered_bytes"] - recovered0 >= b
    reads = sorted((r for r in col.of(0, "tcp_transfer") if r.tags["dport"] == str(port)),
                   key=lambda r: r.time_ns)
    assert [r.fields["bytes_in"] for r in reads] == [a + b, c], [r.fields for r in reads]


def test_bytes_a_connecting_socket_received_before_its_first_tcp_probe_hit_count(
        lab, probes, col):
    """As above for the connecting side: node 0's hits are dropped from before it
    connects until the first response is read. The recovery counts from the socket's
    handshake ACK (TC egress), which acknowledged no data."""
    n0, n1 = lab.nodes[0], lab.nodes[1]
    probe, (a, b, c), port = probes[0], (300_000, 200_000, 400_000), 5366
    window = probe._bpf[b"window"]
    with traffic([(n1, [PY, "-c", RESPOND_IN_TWO, str(port), str(a), str(b), str(c)])]) \
            as (server,):
        await_up(server)
        window[ctypes.c_int(0)] = ctypes.c_uint32(0)      # no poll runs until restored
        try:
            with traffic([(n0, [PY, "-c", REQUEST_TWICE, n1.address, str(port), str(a),
                                str(b), str(c)])]) as (client,):
                assert client.stdout.readline().strip() == "a", client.stderr.read()
                window[ctypes.c_int(0)] = ctypes.c_uint32(probe._gen)
                server.stdin.write("go\n")
                server.stdin.flush()
                assert client.stdout.readline().strip() == "b", client.stderr.read()
                client.stdin.write("go\n")
                client.stdin.flush()
                finish(client)
        finally:
            window[ctypes.c_int(0)] = ctypes.c_uint32(probe._gen)
        finish(server)
    col.until_closed(lambda c: any(r.tags["dport"] == str(port)
                                   for r in c.of(0, "tcp_flow_close")), "the flow's close")
    (close,) = [r for r in col.of(0, "tcp_flow_close") if r.tags["dport"] == str(port)]
    assert close.fields["bytes_received"] == a + b + c, close


# Accepts n connections, answering each with one byte, then exits.
ACCEPT_N = """import socket, sys
s = socket.create_server(("0.0.0.0", int(sys.argv[1])), backlog=64)
print("up", flush=True)
for _ in range(int(sys.argv[2])):
    c, _ = s.accept()
    c.sendall(b"k")
    c.close()
"""
# n connections one after another, each waiting for the server's byte.
CONNECT_N = """import socket, sys
for _ in range(int(sys.argv[3])):
    with socket.create_connection((sys.argv[1], int(sys.argv[2]))) as c:
        c.recv(1)
"""


def test_every_connection_opens_and_closes_on_both_sides_while_map_syscalls_hold_the_cpu(
        lab, probes, col):
    """Short connections with client, server and a map-syscall hammer on CPU 0: the
    kernel skips some inet_sock_set_state hits (and, seen on 6.18, sometimes every
    tracepoint hit of a socket's teardown, raw ones included, uncounted), and each
    open or close it skipped is reported from TC egress (the socket's first
    acknowledging packet), at socket teardown (the raw tcp_destroy_sock), when a new
    socket reuses the freed socket's address (TC egress or the new socket's own hit),
    or by the sweep (sock_diag no longer lists the socket) instead: one open and one
    close per connection and side, whatever was skipped."""
    n0, n1 = lab.nodes[0], lab.nodes[1]
    stats = [probes[0].stats, probes[1].stats]
    before = [f() for f in stats]
    count = 150

    def connections(port):
        with traffic([(n1, ["taskset", "-c", "0", PY, "-c", ACCEPT_N, str(port),
                            str(count)])]) as (server,):
            await_up(server)
            with traffic([(n0, ["taskset", "-c", "0", PY, "-c", CONNECT_N, n1.address,
                                str(port), str(count)])]) as (client,):
                finish(client)
            finish(server)

    def events(what, port):
        return [[r for r in col.of(node, what) if r.tags[side] == str(port)]
                for node, side in ((0, "dport"), (1, "sport"))]

    def made_up():
        return sum(f()[key] - b[key] for f, b in zip(stats, before)
                   for key in ("opened_at_first_ack", "closed_at_destroy", "closed_at_reuse",
                               "closed_at_sweep"))

    ports = []
    with traffic([(n1, ["taskset", "-c", "0", sys.executable, "-c", MAP_SYSCALLS])]) as (hammer,):
        await_up(hammer)
        for k in range(6):         # until a skipped open or close was made up for
            ports.append(5370 + k)
            connections(ports[-1])
            col.until(lambda c: all(len(e) >= count for e in events("tcp_flow_open", ports[-1])),
                      30, "the opens")
            if made_up():
                break
    try:
        col.until_closed(lambda c: all(len(e) >= count for p in ports
                                       for e in events("tcp_flow_close", p)), "the closes")
    except AssertionError:
        raise AssertionError(f"closes {[[len(e) for e in events('tcp_flow_close', p)] for p in ports]}"
                             f" of {count}; {[f() for f in stats]}") from None
    assert made_up() > 0, f"no open or close hit was skipped in {len(ports)} rounds"
    for port in ports:
        for what in ("tcp_flow_open", "tcp_flow_close"):
            for node, got in enumerate(events(what, port)):
                peers = {r.tags["sport" if node == 0 else "dport"] for r in got}
                assert (len(got), len(peers)) == (count, count), \
                    (node, what, port, len(got), len(peers), [f() for f in stats])


def test_a_socket_gone_with_its_entries_left_is_closed_by_the_sweep(lab, probes, col):
    """Stands in for a socket whose every teardown hook the kernel skipped (seen on
    6.18, not to be caused at will): its entries, as the hooks and TC egress left them,
    for an address and cookie no socket has. Within a sweep or two (every 10 s) it finds
    the cookie gone from sock_diag and replays the raw tcp_destroy_sock program on
    it: one close, from_state UNKNOWN, stamped with the socket's last packet, counted
    as swept; a live connection's entry is left alone."""
    import ctypes
    n0, n1 = lab.nodes[0], lab.nodes[1]
    probe = probes[0]
    socks, socks_tx = probe._bpf[b"socks"], probe._bpf[b"socks_tx"]
    before = probe.stats()
    sk, port = 0x7fff_dead_0000_0040, 5390
    last_tx = time.monotonic_ns() - 5_000_000_000
    entry = socks.Leaf()
    entry.made_ns, entry.est_ns, entry.active, entry.cookie = last_tx - 1000, last_tx - 1000, 1, 1 << 62
    tx = socks_tx.Leaf()
    tx.ts_ns, tx.family, tx.state = last_tx, 2, 1
    mapped = bytes(10) + b"\xff\xff"
    ctypes.memmove(ctypes.addressof(tx.flow.saddr), mapped + bytes(map(int, n0.address.split("."))), 16)
    ctypes.memmove(ctypes.addressof(tx.flow.daddr), mapped + bytes(map(int, n1.address.split("."))), 16)
    tx.flow.sport, tx.flow.dport = 40000, port
    with traffic([(n1, sink_argv(port + 1))]) as (sink,):
        await_up(sink)
        with traffic([(n0, send_argv(n1.address, port + 1, seconds=6.0))]) as (sender,):
            col.until(lambda c: any(r.tags["dport"] == str(port + 1)
                                    for r in c.of(0, "tcp_flow_open")), 10, "the live open")
            socks_tx[ctypes.c_ulonglong(sk)] = tx
            socks[ctypes.c_ulonglong(sk)] = entry
            col.until(lambda c: any(r.tags["dport"] == str(port)
                                    for r in c.of(0, "tcp_flow_close")), 30, "the swept close")
            finish(sender)
        finish(sink)
    col.until_closed(lambda c: any(r.tags["dport"] == str(port + 1)
                                   for r in c.of(0, "tcp_flow_close")), "the live connection's close")
    live_closes = [r for r in col.of(0, "tcp_flow_close") if r.tags["dport"] == str(port + 1)]
    closes = [r for r in col.of(0, "tcp_flow_close") if r.tags["dport"] == str(port)]
    assert len(closes) == 1
    assert (closes[0].tags["sport"], closes[0].tags["from_state"]) == ("40000", "UNKNOWN")
    assert closes[0].time_ns == probe.ctx.clock.to_wall(last_tx)
    assert probe.stats()["closed_at_sweep"] - before["closed_at_sweep"] == 1
    # the sender, alive while swept around, closed by itself, not by the sweep
    assert len(live_closes) == 1 and live_closes[0].tags["from_state"] != "UNKNOWN"
    with pytest.raises(KeyError):
        socks[ctypes.c_ulonglong(sk)]


def test_ddp_rank_flows_carry_pid_comm_and_rank(lab, col):
    from fabricscope.lab.training import start_training
    with start_training(lab, 6, model_mb=1) as run:
        comms = {}
        while run.poll() is None:     # polled as the agent does, while the flows exist
            col.poll()
            for i, p in enumerate(run.procs):     # the ranks' command names, the last
                with contextlib.suppress(OSError):   # read while alive (after exec)
                    comms[i] = open(f"/proc/{p.pid}/comm").read().strip()
            time.sleep(0.1)
        pids = [p.pid for p in run.procs]
        assert run.wait() == 0, run.error
    ended = time.time_ns()
    # a window that started after the ranks exited: every window with their traffic is cut
    col.until(lambda c: all(any(r.time_ns > ended for r in c.of(i, "tcp_node"))
                            for i in range(3)), 20, "a window after the training on every node")
    col.settle()                # and the records waiting for their owners' tags
    job = f"{lab.nodes[0].address}:"
    for i, node in enumerate(lab.nodes):
        mine = [r for r in col.records[i] if r.tags.get("pid") == str(pids[i])]
        assert {r.tags["comm"] for r in mine} == {comms[i]}
        assert {r.tags["rank"] for r in mine} == {str(i)}
        assert all(r.tags["job"].startswith(job) and r.tags["world_size"] == "3" for r in mine)
        # the rank's traffic is charged to its own node only
        assert all(r.tags["saddr"] == node.address for r in col.records[i] if "saddr" in r.tags)
        others = [r for j in range(3) if j != i for r in col.records[j]]
        assert not any(r.tags.get("pid") == str(pids[i]) for r in others)
    assert sum(r.fields["bytes_acked"] for r in col.of(1, "tcp_flow")
               if r.tags.get("pid") == str(pids[1])) > 1 << 20


def test_a_bogus_tracepoint_makes_the_probe_unavailable_and_the_agent_runs_on(lab, tmp_path):
    from fabricscope.lab.stack import metric_value
    from tests.kernel.test_agent_kernel import AgentProc, sh
    node = lab.nodes[2]
    agent = AgentProc(node.netns, [
        "--node", node.name, "--output", "jsonl", "--metrics-host", "127.0.0.1",
        "--metrics-port", "0", "--markers-dir", str(tmp_path), "--flush-interval-s", "0.1",
        "--probes", "tcp_flows,markers",
        "--tcp-flow-hooks", "tcp/tcp_probe,tcp/fabricscope_bogus"])
    try:
        port = agent.await_port()
        deadline = time.monotonic() + 60
        while agent.readyz(port) != "200":
            assert time.monotonic() < deadline and agent.proc.poll() is None, \
                "".join(agent.stderr)
            time.sleep(0.1)
        text = sh("ip", "netns", "exec", node.netns, "curl", "-s",
                  f"http://127.0.0.1:{port}/metrics").stdout
        attached = {p: metric_value(text, "fabricscope_agent_probe_attached", {"probe": p})
                    for p in ("tcp_flows", "markers")}
        assert attached == {"tcp_flows": 0, "markers": 1}
        subprocess.run([sys.executable, "-c", "from fabricscope import markers\n"
                        "markers.step(0)\nmarkers.done()"], check=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT),
                            "FABRICSCOPE_MARKERS_DIR": str(tmp_path), "RANK": "0"})
        recs = agent.records_until(lambda r: any(x.measurement == "train_step" for x in r))
        assert [r.fields["step"] for r in recs if r.measurement == "train_step"] == [0]
    finally:
        rc = agent.stop()
    assert rc == 0, "".join(agent.stderr)
    said = [line for line in agent.stderr if "tcp_flows" in line and "unavailable" in line]
    assert len(said) == 1, said
    assert "tracepoint tcp/fabricscope_bogus does not exist on this kernel" in said[0]
    assert not any("Traceback" in line for line in agent.stderr)
