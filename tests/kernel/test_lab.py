"""The network lab on the real kernel: namespaces, bridge, nftables loss, TBF, DDP over gloo.

Every test builds its own lab(s) with running_lab (unique names), which tears
down also when the test fails midway.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fabricscope import markers
from fabricscope.lab import exec_argv, naming, nft, nsops
from fabricscope.lab.running import running_lab, unique_name

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable

# A node-side TCP sink: listens on its address, prints the port, counts bytes until EOF.
SINK = ("import socket,sys; s=socket.socket(); s.bind((sys.argv[1],0)); s.listen(); "
        "print(s.getsockname()[1], flush=True); c,a=s.accept(); n=0\n"
        "while True:\n d=c.recv(1<<16)\n if not d: break\n n+=len(d)\n"
        "print(n, a[0], flush=True)")
# A node-side TCP source: sends N bytes to host:port.
SOURCE = ("import socket,sys; "
          "s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=30); "
          "s.sendall(bytes(int(sys.argv[3]))); s.close()")


def await_true(fn, timeout_s: float, what: str, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def transfer(src_node, dst_node, nbytes: int) -> tuple[int, str]:
    """Send nbytes over TCP from src_node to dst_node; (bytes received, peer address)."""
    sink = subprocess.Popen(exec_argv(dst_node, [PY, "-c", SINK, dst_node.address]),
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(sink.stdout.readline())
        subprocess.run(exec_argv(src_node, [PY, "-c", SOURCE, dst_node.address, port, nbytes]),
                       check=True, timeout=120)
        received, peer = sink.stdout.readline().split()
        return int(received), peer
    finally:
        sink.kill()
        sink.wait()


def snmp(node, key: str = "RetransSegs", table: str = "Tcp") -> int:
    """A counter of /proc/net/snmp as seen inside the node's namespace."""
    text = subprocess.run(exec_argv(node, ["cat", "/proc/net/snmp"]), capture_output=True,
                          text=True, check=True).stdout
    head, values = [ln.split() for ln in text.splitlines() if ln.startswith(table + ":")][:2]
    return int(values[head.index(key)])


def host_state(lab) -> dict:
    """What of `lab` exists on the host right now."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    h = naming.lab_hash(lab.name)
    return {
        "netns": [n for n in os.listdir("/var/run/netns") if n.startswith(f"fs-{lab.name}-")]
        if os.path.isdir("/var/run/netns") else [],
        "links": [ln for ln in links.splitlines() if f"fs{h}" in ln],
        "nft": (nft.FAMILY, lab.nft_table) in nft.tables(),
        "state": os.path.exists(naming.state_file(lab.name)),
        "dir": os.path.exists(lab.dir),
    }


def test_nodes_reach_each_other_and_the_gateway():
    import socket

    from pyroute2 import IPRoute
    with running_lab(nodes=3) as lab:
        assert len({n.netns for n in lab.nodes}) == 3
        for node in lab.nodes:
            with IPRoute(netns=node.netns) as ns:
                links = {m.get_attr("IFLA_IFNAME"): m for m in ns.get_links()}
                assert set(links) == {"lo", node.ifname}
                assert links["lo"]["flags"] & 1 and links[node.ifname]["flags"] & 1   # IFF_UP
                assert links[node.ifname].get_attr("IFLA_ADDRESS") == node.mac
                addrs = [(m.get_attr("IFA_ADDRESS"), m["prefixlen"]) for m in ns.get_addr(family=2)
                         if m.get_attr("IFA_LABEL") == node.ifname]
                assert addrs == [(node.address, 24)]
        # node -> node, over TCP, in both directions around the ring
        for a, b in ((0, 1), (1, 2), (2, 0)):
            assert transfer(lab.nodes[a], lab.nodes[b], 100_000) == (100_000, lab.nodes[a].address)
        # node -> gateway (root namespace) and gateway -> node
        server = socket.create_server((lab.gateway, 0))
        try:
            port = server.getsockname()[1]
            subprocess.run(exec_argv(lab.nodes[2], [PY, "-c", SOURCE, lab.gateway, port, 10]),
                           check=True, timeout=60)
            conn, peer = server.accept()
            assert peer[0] == lab.nodes[2].address
            conn.close()
        finally:
            server.close()
        sink = subprocess.Popen(exec_argv(lab.nodes[1], [PY, "-c", SINK, lab.nodes[1].address]),
                                stdout=subprocess.PIPE, text=True)
        try:
            port = int(sink.stdout.readline())
            with socket.create_connection((lab.nodes[1].address, port), timeout=10) as c:
                c.sendall(b"x" * 1000)
            assert sink.stdout.readline().split() == ["1000", lab.gateway]
        finally:
            sink.kill()
            sink.wait()


def test_two_labs_coexist_on_distinct_subnets():
    with running_lab(nodes=2) as a, running_lab(nodes=2) as b:
        assert a.subnet != b.subnet and a.bridge != b.bridge
        assert {n.ifname for n in a.nodes}.isdisjoint(n.ifname for n in b.nodes)
        assert transfer(b.nodes[0], b.nodes[1], 1000)[0] == 1000
        # no path between labs: a's node has no route to b's subnet
        out = subprocess.run(exec_argv(a.nodes[0], [PY, "-c", SOURCE, b.nodes[0].address, 9, 1]),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and "unreachable" in out.stderr.lower()


def _in_netns(pid: int, ns_inode: int, comm: str) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == ns_inode and \
            Path(f"/proc/{pid}/comm").read_text().strip() == comm
    except OSError:
        return False


def test_down_removes_everything_and_is_idempotent():
    from fabricscope.lab.topology import down, up
    name = unique_name("d")
    try:
        lab = up(name, 2, link_rate="1gbit")
        state = host_state(lab)
        assert sorted(state["netns"]) == sorted(n.netns for n in lab.nodes)
        assert len(state["links"]) == 3             # bridge + two switch ports
        assert state["nft"] and state["state"] and state["dir"]
        # a process left in a node keeps its namespace alive unless down ends it
        sleeper = subprocess.Popen(exec_argv(lab.nodes[1], ["sleep", "600"]))
        ns_inode = os.stat(f"/var/run/netns/{lab.nodes[1].netns}").st_ino
        await_true(lambda: _in_netns(sleeper.pid, ns_inode, "sleep"), 10, "sleep inside node 1")
        assert down(name) is True
        assert sleeper.wait(10) == -signal.SIGTERM
        assert host_state(lab) == {"netns": [], "links": [], "nft": False, "state": False,
                                   "dir": False}
        assert down(name) is False
    finally:
        down(name)


def test_up_clears_a_stale_lab_of_the_same_name():
    from fabricscope.lab.topology import up
    with running_lab(nodes=2) as lab:
        os.unlink(naming.state_file(lab.name))      # state lost, objects still there
        again = up(lab.name, 3)
        assert len(again.nodes) == 3 and len(host_state(again)["netns"]) == 3
        assert transfer(again.nodes[2], again.nodes[0], 1000)[0] == 1000


def test_loss_fault_drops_frames_and_the_node_retransmits():
    from fabricscope.lab.faults import clear, drops, loss
    from fabricscope.lab.topology import load
    with running_lab(nodes=2) as lab:
        sender, receiver = lab.nodes[1], lab.nodes[0]
        # neighbours resolved first: the loss drops ARP frames too, and a connect whose
        # ARP requests were all dropped fails with EHOSTUNREACH (seen once in CI)
        assert transfer(sender, receiver, 1000)[0] == 1000
        loss(lab, 1, 10, direction="tx")
        assert load(lab.name).faults == {1: {"loss": {"pct": 10.0, "direction": "tx"}}}
        rules = [i["rule"] for i in nft.list_json("chain", "bridge", lab.nft_table, "node1_tx")
                 if "rule" in i]
        assert [r["expr"][0]["match"]["right"] for r in rules] == [1000]
        before = snmp(sender)
        assert transfer(sender, receiver, 20_000_000)[0] == 20_000_000
        assert drops(lab, 1)["tx"] > 0 and drops(lab, 1)["rx"] == 0
        assert snmp(sender) - before > 0          # node 1's own segments were lost
        assert drops(lab, 0) == {"tx": 0, "rx": 0}
        clear(lab, 1)
        assert load(lab.name).faults == {}
        assert drops(lab, 1) == {"tx": 0, "rx": 0}     # rules (and their counters) are gone
        loss(lab, 0, 0.25)
        rules = [i["rule"] for c in ("node0_tx", "node0_rx")
                 for i in nft.list_json("chain", "bridge", lab.nft_table, c) if "rule" in i]
        assert [r["expr"][0]["match"]["right"] for r in rules] == [25, 25]


def _root_qdisc(ifname: str, netns: str | None = None) -> dict:
    from pyroute2 import IPRoute
    with IPRoute(**({"netns": netns} if netns else {})) as ipr:
        index = ipr.link_lookup(ifname=ifname)[0]
        (msg,) = [m for m in ipr.get_qdiscs(index=index) if m["parent"] == 0xFFFFFFFF]
        out = {"kind": msg.get_attr("TCA_KIND")}
        if out["kind"] == "tbf":
            parms = msg.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")
            out.update(rate_bps=parms["rate"] * 8, limit=parms["limit"])
        return out


def test_shape_installs_tbf_with_the_requested_rate_and_clear_restores():
    from fabricscope.lab.faults import clear, shape
    with running_lab(nodes=2) as lab:
        port = lab.nodes[0].port
        assert _root_qdisc(port)["kind"] == "noqueue"
        shape(lab, 0, "100mbit", "32kb")
        assert _root_qdisc(port) == {"kind": "tbf", "rate_bps": 100_000_000,
                                     "limit": 32768 + 25000}
        shape(lab, 0, "20mbit", "16kb", limit="64kb")
        assert _root_qdisc(port) == {"kind": "tbf", "rate_bps": 20_000_000, "limit": 65536}
        assert _root_qdisc(lab.nodes[1].port)["kind"] == "noqueue"
        clear(lab)
        assert _root_qdisc(port)["kind"] == "noqueue"
    with running_lab(nodes=2, link_rate="1gbit") as lab:
        assert lab.link_rate_bps == 10**9 and lab.link_shaped
        node = lab.nodes[1]
        assert _root_qdisc(node.port)["rate_bps"] == 10**9
        assert _root_qdisc(node.ifname, node.netns)["rate_bps"] == 10**9
        shape(lab, 1, "50mbit", "32kb")
        clear(lab, 1)
        assert _root_qdisc(node.port)["rate_bps"] == 10**9    # back to the link rate


def read_ring(path: Path) -> tuple[dict, list[tuple[int, int]]]:
    """(metadata, [(kind, value)...]) of a marker ring file (layout: fabricscope/markers.py)."""
    data = path.read_bytes()
    magic, _version, capacity, _pid, written, meta_len = struct.unpack_from("<4sIII Q H", data)
    assert magic == markers.MAGIC
    meta = json.loads(data[26:26 + meta_len])
    entries = [struct.unpack_from("<QII q", data, markers.HEADER_SIZE + i * markers.ENTRY_SIZE)
               for i in range(min(written, capacity))]
    return meta, [(kind, value) for _t, kind, _r, value in entries]


def test_lab_train_runs_ddp_and_writes_markers_on_every_node():
    with running_lab(nodes=3) as lab:
        out = subprocess.run([PY, "-m", "fabricscope", "lab", "train", "--name", lab.name, "--steps", "3",
                              "--model-mb", "1"], cwd=ROOT, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        lines = [json.loads(ln) for ln in out.stdout.splitlines()]
        assert [ln["step"] for ln in lines] == [0, 1, 2]
        assert all(set(ln) == {"step", "seconds"} and ln["seconds"] > 0 for ln in lines)
        for node in lab.nodes:
            (ring,) = Path(node.markers_dir).glob("*.ring")
            meta, entries = read_ring(ring)
            assert meta["rank"] == str(node.index) and meta["world_size"] == "3"
            assert meta["master_addr"] == lab.nodes[0].address
            assert entries == [(markers.KIND_STEP, 0), (markers.KIND_STEP, 1),
                               (markers.KIND_STEP, 2), (markers.KIND_DONE, 0)]
            assert "MLP 1x512" in (Path(node.dir) / "train.log").read_text()


def test_a_failing_rank_ends_the_run_with_an_error():
    from fabricscope.lab.training import start_training
    with running_lab(nodes=2) as lab:
        with start_training(lab, 100_000, model_mb=0.25) as run:
            steps = run.steps()
            assert next(steps)["step"] == 0
            os.kill(run.procs[1].pid, signal.SIGKILL)
            assert run.wait(60) != 0
            assert all(p.poll() is not None for p in run.procs)
            assert run.error.startswith("rank 1 (node1) was killed by SIGKILL"), run.error
            assert len(list(steps)) < 100_000


def test_running_lab_tears_down_when_the_body_fails():
    names = []
    with pytest.raises(RuntimeError, match="midway"):
        with running_lab(nodes=2) as lab:
            names.append(lab.name)
            raise RuntimeError("failed midway")
    assert not [n for n in os.listdir("/var/run/netns") if n.startswith(f"fs-{names[0]}-")]
    assert not os.path.exists(naming.state_file(names[0]))


def test_running_lab_removes_labs_whose_owner_died_and_keeps_the_others():
    """A test process that dies where no teardown runs (SIGKILL; LLVM exits from C on a
    BPF program it cannot build) leaves its lab: the next running_lab removes it. A lab
    from `lab up` (no owner) and one whose owner lives stay."""
    from fabricscope.lab.topology import down, up
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan, manual, mine = unique_name("o"), unique_name("m"), unique_name("l")
    try:
        up(orphan, 2, owner_pid=dead.pid)
        up(manual, 2)
        up(mine, 2, owner_pid=os.getpid())
        with running_lab(nodes=2):
            assert not os.path.exists(naming.state_file(orphan))
            assert not [n for n in os.listdir("/var/run/netns") if n.startswith(f"fs-{orphan}-")]
            assert os.path.exists(naming.state_file(manual))
            assert os.path.exists(naming.state_file(mine))
    finally:
        for name in (orphan, manual, mine):
            down(name)


def test_cli_up_json_exec_fault_train_timeout_and_down():
    name = unique_name("c")
    env = {**os.environ}

    def cli(*argv, check=True):
        out = subprocess.run([PY, "-m", "fabricscope", "lab", *argv], cwd=ROOT,
                             capture_output=True, text=True, env=env, timeout=120)
        if check:
            assert out.returncode == 0, out.stderr
        return out
    try:
        data = json.loads(cli("up", "--name", name, "--nodes", "2", "--link-rate", "1gbit",
                              "--json").stdout)
        assert data["link_rate_bps"] == 10**9 and len(data["nodes"]) == 2
        assert data["gateway"].endswith(".254") and data["subnet"].endswith(".0/24")
        node = data["nodes"][1]
        shown = cli("exec", "--name", name, "--node", "1", "--", "sh", "-c",
                    "ip -o -4 addr show dev $0; echo $FABRICSCOPE_MARKERS_DIR", node["ifname"])
        assert f"inet {node['address']}/24" in shown.stdout
        assert shown.stdout.strip().endswith(node["markers_dir"])
        assert cli("exec", "--name", name, "--node", "0", "--", "sh", "-c", "exit 7",
                   check=False).returncode == 7
        for argv in (["fault", "--name", name, "--node", "2", "loss", "1"],
                     ["fault", "--name", name, "--node", "0", "loss", "lots"],
                     ["fault", "--name", name, "--node", "0", "loss", "101"],
                     ["fault", "--name", name, "--node", "0", "shape", "--rate", "x",
                      "--burst", "32kb"],
                     ["fault", "--name", name, "loss", "1"],
                     ["exec", "--name", name, "--node", "5", "--", "true"]):
            bad = cli(*argv, check=False)
            assert bad.returncode == 2 and bad.stderr.startswith("fabricscope: error: "), \
                (argv, bad.stderr)
            assert len(bad.stderr.strip().splitlines()) == 1
        stuck = cli("train", "--name", name, "--steps", "100000", "--timeout-s", "1", check=False)
        assert stuck.returncode == 1, stuck.stderr
        assert stuck.stderr.strip().splitlines()[-1] == \
            "fabricscope: error: training failed: training did not finish within 1 s"
        assert nsops.netns_pids([n["netns"] for n in data["nodes"]]) == []   # ranks ended
        cli("fault", "--name", name, "--node", "1", "loss", "2.5")
        assert "node1: loss 2.5% both" in cli("list").stdout
        cli("fault", "--name", name, "--node", "1", "clear")
        assert [lab["faults"] for lab in json.loads(cli("list", "--json").stdout)
                if lab["name"] == name] == [{}]
        assert "is down" in cli("down", "--name", name).stdout
        assert "nothing to remove" in cli("down", "--name", name).stdout
    finally:
        cli("down", "--name", name, check=False)


def test_one_tor_lab_is_the_single_bridge_with_a_topology_file_and_cpu_cgroups():
    from fabricscope.topology import load_topology
    from fabricscope.lab import cgroups
    with running_lab(nodes=2) as lab:
        (tor,) = lab.tors
        assert (tor.name, tor.bridge, tor.uplink, lab.spine) == ("tor0", lab.bridge, "", "")
        assert len(host_state(lab)["links"]) == 3           # bridge + two ports, no uplinks
        topo = load_topology(lab.topology_path)
        assert (topo.tors, topo.nodes) == (("tor0",), {"node0": "tor0", "node1": "tor0"})
        if cgroups.detect() is not None:
            assert [os.path.isdir(n.cgroup) for n in lab.nodes] == [True, True]
            assert all(cgroups.quota(n.cgroup) is None for n in lab.nodes)
