"""The lab's scenario faults on the real kernel: leaf-spine labs and their uplinks,
CPU stragglers (cgroup quota), slow storage, and that teardown leaves nothing.

Every lab comes from running_lab (unique names, always torn down). Counters are
the kernel's own (TBF qdisc bytes/overlimits, nft drop counters, cgroup cpu.stat);
the only clock readings are lower bounds, which a slow machine cannot break.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from fabricscope.topology import load_topology
from fabricscope.lab import cgroups, exec_argv, naming, nft
from fabricscope.lab.running import running_lab, unique_name
from tests.kernel.test_lab import PY, ROOT, SINK, SOURCE, await_true, host_state, transfer

pytestmark = pytest.mark.root
BUSY = "while True: pass"


def _master(ipr, ifname: str) -> str | None:
    (msg,) = ipr.get_links(ipr.link_lookup(ifname=ifname)[0])
    master = msg.get_attr("IFLA_MASTER")
    return ipr.get_links(master)[0].get_attr("IFLA_IFNAME") if master else None


def _sysfs(path: str) -> str:
    return Path(path).read_text().strip()


def _warm_up(lab) -> None:
    """Every node talks to every other once, so the bridges have learned every MAC and
    the nodes every neighbour: later frames are unicast along one path only."""
    for a in lab.nodes:
        for b in lab.nodes:
            if a is not b:
                assert transfer(a, b, 1000)[0] == 1000


def test_leaf_spine_wiring_reachability_and_topology_file():
    from pyroute2 import IPRoute
    with running_lab(nodes=3, tors=2, link_rate="1gbit", wire_frames=True) as lab:
        tor0, tor1 = lab.tors
        assert (tor0.nodes, tor1.nodes) == ([0, 1], [2])
        with IPRoute() as ipr:
            assert [_master(ipr, n.port) for n in lab.nodes] == [tor0.bridge, tor0.bridge,
                                                                 tor1.bridge]
            for tor in lab.tors:
                assert _master(ipr, tor.uplink) == tor.bridge
                assert _master(ipr, tor.spine_port) == lab.spine
                assert _master(ipr, tor.bridge) is None
            addrs = [(m.get_attr("IFA_ADDRESS"), m["prefixlen"]) for m in
                     ipr.get_addr(index=ipr.link_lookup(ifname=lab.spine)[0], family=2)]
            assert addrs == [(lab.gateway, 24)]
            for tor in lab.tors:
                for end in (tor.uplink, tor.spine_port):
                    (msg,) = ipr.get_links(ipr.link_lookup(ifname=end)[0])
                    assert msg.get_attr("IFLA_GSO_MAX_SEGS") == 1          # wire frames
                    assert int(_sysfs(f"/sys/class/net/{end}/queues/rx-0/rps_cpus"), 16) > 0
                    assert _sysfs(f"/proc/sys/net/ipv6/conf/{end}/disable_ipv6") == "1"
                    assert _root_qdisc(end)["rate_bps"] == 10**9           # link rate
        for bridge in (lab.spine, tor0.bridge, tor1.bridge):
            assert _sysfs(f"/sys/class/net/{bridge}/bridge/stp_state") == "0"
            assert _sysfs(f"/proc/sys/net/ipv6/conf/{bridge}/disable_ipv6") == "1"
        # across ToRs both ways, within a ToR, and the gateway behind the spine
        assert transfer(lab.nodes[0], lab.nodes[2], 200_000) == (200_000, lab.nodes[0].address)
        assert transfer(lab.nodes[2], lab.nodes[1], 200_000) == (200_000, lab.nodes[2].address)
        assert transfer(lab.nodes[1], lab.nodes[0], 200_000) == (200_000, lab.nodes[1].address)
        with socket.create_server((lab.gateway, 0)) as server:
            subprocess.run(exec_argv(lab.nodes[2], [PY, "-c", SOURCE, lab.gateway,
                                                    server.getsockname()[1], 10]),
                           check=True, timeout=60)
            conn, peer = server.accept()
            conn.close()
            assert peer[0] == lab.nodes[2].address
        topo = load_topology(lab.topology_path)
        assert topo.tors == ("tor0", "tor1")
        assert topo.nodes == {"node0": "tor0", "node1": "tor0", "node2": "tor1"}


def _root_qdisc(ifname: str) -> dict:
    from pyroute2 import IPRoute

    from fabricscope.lab import tc
    with IPRoute() as ipr:
        return tc.root_qdisc(ipr, ipr.link_lookup(ifname=ifname)[0])


def test_an_uplink_shaper_holds_back_cross_tor_traffic_and_leaves_the_rack_alone():
    from fabricscope.lab.faults import clear, shape_uplink, uplink_qdisc
    from fabricscope.lab.topology import load
    with running_lab(nodes=3, tors=2) as lab:
        _warm_up(lab)
        params = shape_uplink(lab, "tor0", "50mbit", "16kb")
        assert params == {"rate_bps": 50_000_000, "burst": 16384, "limit": 16384 + 12500,
                          "direction": "up"}
        assert load(lab.name).uplink_faults == {"tor0": {"shape": params}}
        assert uplink_qdisc(lab, "tor0", "down")["kind"] == "noqueue"      # only "up"
        size = 4_000_000
        before = uplink_qdisc(lab, "tor0")
        assert transfer(lab.nodes[0], lab.nodes[1], size)[0] == size         # within tor0
        within = uplink_qdisc(lab, "tor0")
        assert transfer(lab.nodes[0], lab.nodes[2], size)[0] == size         # tor0 -> tor1
        across = uplink_qdisc(lab, "tor0")
        assert within["bytes"] - before["bytes"] < size // 100
        assert within["overlimits"] == before["overlimits"]
        assert across["bytes"] - within["bytes"] >= size
        assert across["overlimits"] > within["overlimits"]                  # it was held back
        shape_uplink(lab, "tor0", "50mbit", "16kb", direction="both")
        assert uplink_qdisc(lab, "tor0", "down")["rate_bps"] == 50_000_000
        clear(lab, uplink="tor0")
        assert [uplink_qdisc(lab, "tor0", d)["kind"] for d in ("up", "down")] == ["noqueue"] * 2
        assert load(lab.name).uplink_faults == {}


CONNECT = ("import socket,sys,time; t=time.monotonic(); "
           "s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=30); "
           "print(time.monotonic()-t); s.sendall(bytes(1000)); s.close()")


def _connect_s(src_node, dst_node) -> float:
    """Seconds node src_node's TCP handshake to dst_node took: one round trip."""
    sink = subprocess.Popen(exec_argv(dst_node, [PY, "-c", SINK, dst_node.address]),
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(sink.stdout.readline())
        out = subprocess.run(exec_argv(src_node, [PY, "-c", CONNECT, dst_node.address, port]),
                             check=True, timeout=120, capture_output=True, text=True)
        return float(out.stdout)
    finally:
        sink.kill()
        sink.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_delay_holds_every_frame_toward_the_node_and_drops_none():
    """node1's port delays what it sends toward node1 by 30 ms: each handshake to node1
    takes at least that (a lower bound), a transfer to it arrives whole and the
    stage's TAP dropped nothing; the stage runs in the lab's cgroup, so clearing the
    fault or taking the lab down ends it, and with it its filter on the port."""
    from pyroute2 import IPRoute
    from fabricscope.lab.delay_stage import FILTER_PRIO, stage_name
    from fabricscope.lab.faults import clear, delay
    from fabricscope.lab.topology import load
    with running_lab(nodes=2) as lab:
        _warm_up(lab)
        assert delay(lab, 1, "30ms") == pytest.approx(0.03)
        fault = load(lab.name).faults[1]["delay"]
        assert fault["delay_s"] == pytest.approx(0.03)
        assert fault["pid"] in cgroups.lab_pids(lab.name) or cgroups.detect() is None
        tap = stage_name(lab.nodes[1].port)
        assert _connect_s(lab.nodes[0], lab.nodes[1]) >= 0.03
        assert transfer(lab.nodes[0], lab.nodes[1], 4_000_000)[0] == 4_000_000
        assert int(_sysfs(f"/sys/class/net/{tap}/statistics/tx_dropped")) == 0
        assert int(_sysfs(f"/sys/class/net/{tap}/statistics/tx_packets")) > 0
        clear(lab, 1)
        assert not _alive(fault["pid"]) and not os.path.exists(f"/sys/class/net/{tap}")
        with IPRoute() as ipr:
            index = ipr.link_lookup(ifname=lab.nodes[1].port)[0]
            assert not [f for f in ipr.get_filters(index=index, parent=0xFFFFFFF3)
                        if f["info"] >> 16 == FILTER_PRIO]
        assert load(lab.name).faults == {}
        assert transfer(lab.nodes[0], lab.nodes[1], 100_000)[0] == 100_000
        pid = delay(lab, 0, "5ms") and load(lab.name).faults[0]["delay"]["pid"]
    await_true(lambda: not _alive(pid), 30, "the delay stage to end with its lab")


def test_uplink_loss_drops_frames_toward_the_rack_only():
    from fabricscope.lab.faults import clear, drops, loss_uplink, uplink_drops
    from fabricscope.lab.topology import load
    # wire frames: the rule draws per 1500-byte frame (thousands of them), not per GSO
    # burst of up to 64 KB, of which a transfer may make only a hundred
    with running_lab(nodes=3, tors=2, wire_frames=True) as lab:
        _warm_up(lab)      # the loss drops ARP frames too: neighbours first (see test_lab.py)
        loss_uplink(lab, "tor1", 5, direction="down")
        assert load(lab.name).uplink_faults == {"tor1": {"loss": {"pct": 5.0,
                                                                  "direction": "down"}}}
        rules = [i["rule"] for i in nft.list_json("chain", "bridge", lab.nft_table, "tor1_down")
                 if "rule" in i]
        assert [r["expr"][0]["match"]["right"] for r in rules] == [500]
        assert transfer(lab.nodes[0], lab.nodes[1], 2_000_000)[0] == 2_000_000   # within tor0
        assert uplink_drops(lab, "tor1") == {"up": 0, "down": 0}
        assert transfer(lab.nodes[0], lab.nodes[2], 2_000_000)[0] == 2_000_000   # into tor1
        dropped = uplink_drops(lab, "tor1")
        assert dropped["down"] > 0 and dropped["up"] == 0
        assert uplink_drops(lab, "tor0") == {"up": 0, "down": 0}
        assert all(drops(lab, i) == {"tx": 0, "rx": 0} for i in range(3))
        clear(lab)
        assert uplink_drops(lab, "tor1") == {"up": 0, "down": 0}
        assert load(lab.name).uplink_faults == {}


def test_a_cpu_fault_throttles_a_rank_and_not_the_rest_of_the_node():
    from fabricscope.lab.faults import clear, cpu
    from fabricscope.lab.topology import load
    from fabricscope.lab.training import start_rank
    with running_lab(nodes=2) as lab:
        node = lab.nodes[1]
        assert node.cgroup and cgroups.quota(node.cgroup) is None
        rank = start_rank(exec_argv(node, [PY, "-c", BUSY]), None, node.cgroup,
                          subprocess.DEVNULL, subprocess.DEVNULL)
        other = subprocess.Popen(exec_argv(node, ["sleep", "600"]))   # e.g. the node's agent
        try:
            assert cgroups.procs(node.cgroup) == [rank.pid]
            fault = cpu(lab, 1, 10)
            assert fault == {"pct": 10.0, "quota_us": 10_000, "period_us": 100_000}
            assert load(lab.name).faults == {1: {"cpu": fault}}
            assert cgroups.quota(node.cgroup) == 10_000
            start, used0 = cgroups.stat(node.cgroup), cgroups.usage_ns(node.cgroup)
            await_true(lambda: cgroups.stat(node.cgroup)["nr_throttled"]
                       >= start["nr_throttled"] + 5, 60, "5 throttled periods")
            end, used1 = cgroups.stat(node.cgroup), cgroups.usage_ns(node.cgroup)
            periods = end["nr_periods"] - start["nr_periods"]
            # at most a quota per period the cgroup ran in (+2 periods for the reads'
            # skew, +25 % for the slices the kernel hands out ahead of the quota)
            assert used1 - used0 <= (periods + 2) * fault["quota_us"] * 1000 * 1.25, \
                (used1 - used0, periods)
            clear(lab, 1)
            assert cgroups.quota(node.cgroup) is None and load(lab.name).faults == {}
            throttled, used = cgroups.stat(node.cgroup)["nr_throttled"], \
                cgroups.usage_ns(node.cgroup)
            # 0.3 s of CPU at the 10 % quota would have taken 30 periods, 29 throttled
            await_true(lambda: cgroups.usage_ns(node.cgroup) - used >= 300_000_000, 60,
                       "0.3 s of CPU for the busy loop")
            assert cgroups.stat(node.cgroup)["nr_throttled"] == throttled
            assert other.pid not in cgroups.procs(node.cgroup)
        finally:
            for proc in (rank, other):
                proc.kill()
                proc.wait()


# A data client in a node: one persistent connection, a request per stdin line
# ("get N" / "put N"), each answered with the seconds the request took.
CLIENT = ("import sys, time; from lab.dataserver import DataClient; c = DataClient(sys.argv[1])\n"
          "for line in sys.stdin:\n"
          " op, n = line.split(); t = time.monotonic()\n"
          " got = c.get(int(n)) if op == 'get' else c.put(bytes(int(n)))\n"
          " print(got, time.monotonic() - t, flush=True)")


def test_slow_storage_takes_at_least_its_rate_and_delay_until_cleared():
    from fabricscope.lab.dataserver import running_dataserver
    from fabricscope.lab.faults import storage
    from fabricscope.lab.storage_fault import StorageFault
    from fabricscope.lab.topology import load
    with running_lab(nodes=2) as lab, running_dataserver(lab, None) as addr:
        client = subprocess.Popen(exec_argv(lab.nodes[1], [PY, "-c", CLIENT, addr]), cwd=ROOT,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})

        def ask(op: str, n: int) -> float:
            client.stdin.write(f"{op} {n}\n")
            client.stdin.flush()
            got, seconds = client.stdout.readline().split()
            assert int(got) == n
            return float(seconds)
        try:
            n, rate, delay = 1 << 20, 20_000_000, 0.05
            ask("get", n)                                          # no fault
            assert storage(lab, rate="20mbit") == StorageFault(rate_bps=rate)
            assert load(lab.name).storage_fault == {"rate_bps": rate, "delay_s": 0.0}
            assert ask("get", n) >= n * 8 / rate                   # 0.42 s at least
            assert ask("put", n) >= n * 8 / rate
            storage(lab, delay="50ms")                             # replaces the rate
            assert ask("get", 1000) >= delay and ask("put", 1000) >= delay
            storage(lab, rate="20mbit", delay="50ms")
            assert ask("get", n) >= n * 8 / rate + delay
            assert storage(lab) == StorageFault()
            assert load(lab.name).storage_fault == {}
            ask("get", n)
        finally:
            client.stdin.close()
            client.wait(30)
        (log,) = Path(lab.dir).glob("dataserver-*.log")
        seen = [json.loads(ln)["storage_fault"] for ln in log.read_text().splitlines()
                if ln.startswith('{"storage_fault"')]
        assert seen == [{"rate_bps": rate, "delay_s": 0.0}, {"rate_bps": None, "delay_s": delay},
                        {"rate_bps": rate, "delay_s": delay}, {}]


def lab_host_state(lab) -> dict:
    """host_state (test_lab.py) plus the lab's cgroups and its topology file."""
    h = cgroups.detect()
    cg = h.lab_dir(lab.name) if h else ""
    return {**host_state(lab),
            "cgroups": sorted(e for e in os.listdir(cg) if os.path.isdir(f"{cg}/{e}"))
            if cg and os.path.isdir(cg) else [],
            "topology": os.path.exists(lab.topology_path)}


NOTHING = {"netns": [], "links": [], "nft": False, "state": False, "dir": False, "cgroups": [],
           "topology": False}


def test_down_removes_spine_tors_uplinks_and_cgroups_also_without_the_state_file():
    import signal

    from fabricscope.lab.topology import down, up
    from fabricscope.lab.training import start_rank
    name = unique_name("d")
    try:
        lab = up(name, 4, tors=2, link_rate="1gbit")
        state = lab_host_state(lab)
        assert len(state["links"]) == 1 + 2 + 2 * 2 + 4     # spine, ToRs, uplink ends, ports
        assert state["cgroups"] == ["n0", "n1", "n2", "n3"] and state["topology"]
        # a process in a node's cgroup and outside its netns still belongs to the lab
        stray = start_rank(["sleep", "600"], None, lab.nodes[3].cgroup, subprocess.DEVNULL,
                           subprocess.DEVNULL)
        os.unlink(naming.state_file(name))          # lost: found by the derived names
        assert down(name) is True
        assert stray.wait(10) == -signal.SIGTERM
        assert lab_host_state(lab) == NOTHING
        assert down(name) is False
    finally:
        down(name)


def test_a_failed_up_leaves_nothing(monkeypatch):
    from fabricscope.lab import topology
    made = cgroups.create

    def make_then_fail(name, count):
        made(name, count)
        raise RuntimeError("injected failure at the last step of up")
    monkeypatch.setattr(topology.cgroups, "create", make_then_fail)
    name = unique_name("f")
    try:
        with pytest.raises(RuntimeError, match="injected"):
            topology.up(name, 4, tors=2)
        assert lab_host_state(topology.plan(name, 4, "198.18.0.0/24", tors=2)) == NOTHING
    finally:
        monkeypatch.undo()
        topology.down(name)


def test_cli_leaf_spine_faults_list_clear_and_down():
    name = unique_name("c")

    def cli(*argv):
        out = subprocess.run([PY, "-m", "fabricscope", "lab", *argv], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def listed() -> dict:
        (lab,) = [lab for lab in json.loads(cli("list", "--json")) if lab["name"] == name]
        return lab
    try:
        data = json.loads(cli("up", "--name", name, "--nodes", "4", "--tors", "2", "--json"))
        assert [t["nodes"] for t in data["tors"]] == [[0, 1], [2, 3]] and data["spine"]
        assert load_topology(data["topology_path"]).tor_of("node3") == "tor1"
        cli("fault", "--name", name, "--uplink", "tor0", "shape", "--rate", "200mbit",
            "--burst", "16kb")
        cli("fault", "--name", name, "--uplink", "tor1", "loss", "2", "--direction", "down")
        cli("fault", "--name", name, "--node", "2", "cpu", "30")
        cli("fault", "--name", name, "storage", "--rate", "20mbit", "--delay", "50ms")
        line = next(ln for ln in cli("list").splitlines() if ln.startswith(name))
        assert line.split()[1:3] == ["4", "2"]
        assert line.endswith("node2: cpu 30%; tor0 uplink: shape 200mbit burst 16384B limit "
                             "66384B up; tor1 uplink: loss 2% down; storage: rate 20mbit, "
                             "delay 50ms"), line
        lab = listed()
        assert cgroups.quota(lab["nodes"][2]["cgroup"]) == 30_000
        cli("fault", "--name", name, "--uplink", "tor0", "clear")
        cli("fault", "--name", name, "storage", "clear")
        lab = listed()
        assert list(lab["uplink_faults"]) == ["tor1"] and lab["storage_fault"] == {}
        assert lab["faults"] == {"2": {"cpu": {"pct": 30.0, "quota_us": 30000,
                                               "period_us": 100000}}}
        cli("clear", "--name", name)
        lab = listed()
        assert (lab["faults"], lab["uplink_faults"]) == ({}, {})
        assert cgroups.quota(lab["nodes"][2]["cgroup"]) is None
        assert "is down" in cli("down", "--name", name)
    finally:
        subprocess.run([PY, "-m", "fabricscope", "lab", "down", "--name", name], cwd=ROOT,
                       capture_output=True, timeout=120)
