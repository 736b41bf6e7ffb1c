"""Leaf-spine labs without root: node -> ToR blocks, derived names, plans, the state
round trip with ToRs and uplink/storage faults, the nft chains of uplinks."""

import json

import pytest

from fabricscope.errors import UserError
from fabricscope.lab import naming, nft
from fabricscope.lab.model import Lab, plan
from fabricscope.lab.topology import load


@pytest.mark.parametrize("nodes,tors,blocks", [
    (4, 1, [[0, 1, 2, 3]]),
    (4, 2, [[0, 1], [2, 3]]),
    (7, 3, [[0, 1, 2], [3, 4], [5, 6]]),
    (5, 5, [[0], [1], [2], [3], [4]]),
    (64, 3, [list(range(0, 22)), list(range(22, 43)), list(range(43, 64))]),
])
def test_nodes_hang_off_tors_in_contiguous_blocks(nodes, tors, blocks):
    assert naming.tor_blocks(nodes, tors) == blocks


@pytest.mark.parametrize("tors", [0, -1, 5, True, 2.0, "2"])
def test_bad_tor_counts_are_user_errors(tors):
    with pytest.raises(UserError) as err:
        naming.check_tors(tors, 4)
    assert "--tors between 1 and 4" in err.value.fix


def test_leaf_spine_names_fit_ifnamsiz_and_match_the_cleanup_patterns():
    h = naming.lab_hash("demo")
    assert naming.spine_name("demo") == f"fs{h}sp"
    assert naming.tor_bridge_name("demo", 1, 2) == f"fs{h}t1"
    assert naming.tor_bridge_name("demo", 0, 1) == naming.bridge_name("demo")   # one ToR
    assert (naming.uplink_name("demo", 3), naming.uplink_peer_name("demo", 3)) == \
        (f"fs{h}ut3", f"fs{h}us3")
    assert naming.tor_name(2) == "tor2"
    last = naming.MAX_NODES - 1
    bridges = [naming.spine_name("x" * 32), naming.tor_bridge_name("x" * 32, last, 64),
               naming.bridge_name("x" * 32)]
    veths = [naming.uplink_name("x" * 32, last), naming.uplink_peer_name("x" * 32, last),
             naming.port_name("x" * 32, last)]
    for ifname in bridges + veths:
        assert len(ifname) <= 15 and naming.IFNAME_RE.match(ifname), ifname
    assert all(naming.BRIDGE_RE.match(b) for b in bridges)
    assert not any(naming.BRIDGE_RE.match(v) for v in veths)


def test_plan_of_a_leaf_spine_lab():
    lab = plan("demo", 5, "198.18.4.0/24", tors=2)
    h = naming.lab_hash("demo")
    assert lab.spine == f"fs{h}sp" and lab.bridge == lab.spine        # the gateway's bridge
    assert [(t.name, t.bridge, t.uplink, t.spine_port, t.nodes) for t in lab.tors] == [
        ("tor0", f"fs{h}t0", f"fs{h}ut0", f"fs{h}us0", [0, 1, 2]),
        ("tor1", f"fs{h}t1", f"fs{h}ut1", f"fs{h}us1", [3, 4])]
    assert [n.tor for n in lab.nodes] == ["tor0"] * 3 + ["tor1"] * 2
    assert lab.topology_path.endswith("/demo/topology.yaml")
    topo = lab.topology()
    assert topo.tors == ("tor0", "tor1") and topo.tor_of("node4") == "tor1"
    assert topo.nodes_of("tor0") == ("node0", "node1", "node2")
    macs = [naming.mac("demo", t.index, s) for t in lab.tors for s in ("tor", "uplink",
                                                                       "uplink_peer")]
    macs += [naming.mac("demo", 0, "bridge")] + [n.mac for n in lab.nodes] + \
        [n.port_mac for n in lab.nodes]
    assert len(set(macs)) == len(macs)


def test_one_tor_is_todays_single_bridge():
    lab = plan("demo", 3, "198.18.4.0/24")
    assert lab.spine == "" and lab.bridge == naming.bridge_name("demo")
    (tor,) = lab.tors
    assert (tor.name, tor.bridge, tor.uplink, tor.spine_port, tor.nodes) == \
        ("tor0", lab.bridge, "", "", [0, 1, 2])
    with pytest.raises(UserError) as err:
        lab.uplink("tor0")
    assert "no uplinks" in err.value.cause and "--tors 2" in err.value.fix


def test_uplink_lookup():
    lab = plan("demo", 4, "198.18.4.0/24", tors=2)
    assert lab.uplink("tor1").index == 1
    for bad in ("tor2", "spine", ""):
        with pytest.raises(UserError) as err:
            lab.uplink(bad)
        assert "tor0, tor1" in err.value.fix


def test_state_round_trip_with_tors_and_every_kind_of_fault(monkeypatch, tmp_path):
    monkeypatch.setenv("FABRICSCOPE_LAB_DIR", str(tmp_path))
    lab = plan("demo", 4, "198.18.9.0/24", tors=2)
    lab.nodes[1].cgroup = "/sys/fs/cgroup/cpu/fabricscope/demo/n1"
    lab.faults = {1: {"cpu": {"pct": 30.0, "quota_us": 30000, "period_us": 100000}}}
    lab.uplink_faults = {"tor0": {"loss": {"pct": 2.0, "direction": "up"}}}
    lab.storage_fault = {"rate_bps": 20_000_000, "delay_s": 0.05}
    lab.save()
    data = json.loads((tmp_path / "demo.json").read_text())
    assert data["tors"][1] == {"index": 1, "name": "tor1", "bridge": lab.tors[1].bridge,
                               "uplink": lab.tors[1].uplink,
                               "spine_port": lab.tors[1].spine_port, "nodes": [2, 3]}
    assert data["nodes"][3]["tor"] == "tor1" and data["faults"] == {"1": lab.faults[1]}
    assert load("demo") == lab


def test_a_state_file_from_before_tors_loads_as_one_tor(monkeypatch, tmp_path):
    monkeypatch.setenv("FABRICSCOPE_LAB_DIR", str(tmp_path))
    data = plan("old", 2, "198.18.9.0/24").to_dict()
    for key in ("tors", "spine", "topology_path", "uplink_faults", "storage_fault"):
        del data[key]
    for node in data["nodes"]:
        del node["tor"], node["cgroup"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    lab = load("old")
    assert [(t.name, t.bridge, t.nodes) for t in lab.tors] == [("tor0", lab.bridge, [0, 1])]
    assert [n.tor for n in lab.nodes] == ["tor0", "tor0"] and lab.storage_fault == {}
    assert Lab.from_dict(lab.to_dict()) == lab


def test_nft_table_hooks_uplink_ends_in_postrouting():
    script = nft.create_table_script("t", ["p0", "p1"], [("tor0", "ut0", "us0"),
                                                         ("tor1", "ut1", "us1")])
    assert "  chain tor1_up { }" in script and "  chain tor0_down { }" in script
    post = script[script.index("chain post"):]
    assert 'oifname "ut0" jump tor0_up' in post and 'oifname "us1" jump tor1_down' in post
    assert "tor0" not in script[:script.index("chain post")].split("chain pre")[1]
    assert nft.create_table_script("t", ["p0"]) == nft.create_table_script("t", ["p0"], [])


@pytest.mark.parametrize("direction,chains", [("both", {"up", "down"}), ("up", {"up"}),
                                              ("down", {"down"})])
def test_nft_uplink_loss_rules(direction, chains):
    script = nft.uplink_rules_script("t", "tor1", 2, direction)
    assert script.startswith("flush chain bridge t tor1_up\nflush chain bridge t tor1_down\n")
    rules = [ln for ln in script.splitlines() if ln.startswith("add rule")]
    assert {ln.split()[4].rsplit("_", 1)[1] for ln in rules} == chains
    assert all("numgen random mod 10000 < 200 counter drop" in ln for ln in rules)
    assert "add" not in nft.uplink_rules_script("t", "tor1", None, "both")
