"""Pure parts of the lab: plans, state round trip, nft scripts, TBF parameters,
model sizing, rank environments, the CLI parser and its errors (no root)."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fabricscope.errors import UserError
from fabricscope.lab import exec_argv, exec_env, nft, tc
from fabricscope.lab.topology import load, plan
from fabricscope.lab.training import mlp_shape, param_bytes, rank_env

ROOT = Path(__file__).resolve().parents[2]


def test_plan_lays_out_nodes_on_the_subnet():
    lab = plan("demo", 3, "198.18.4.0/24", 10**9)
    assert (lab.gateway, lab.subnet, lab.prefixlen, lab.link_rate_bps) == \
        ("198.18.4.254", "198.18.4.0/24", 24, 10**9)
    assert [n.address for n in lab.nodes] == ["198.18.4.1", "198.18.4.2", "198.18.4.3"]
    assert [n.index for n in lab.nodes] == [0, 1, 2]
    assert len({n.port for n in lab.nodes} | {n.ifname for n in lab.nodes}) == 6
    assert lab.nodes[2].markers_dir.endswith("/demo/node2/markers")
    assert lab.world_size == 3
    assert lab.node(2) is lab.nodes[2]
    for bad in (3, -1, "1", True):
        with pytest.raises(UserError):
            lab.node(bad)


def test_state_round_trip(monkeypatch, tmp_path):
    monkeypatch.setenv("FABRICSCOPE_LAB_DIR", str(tmp_path))
    lab = plan("demo", 2, "198.18.9.0/24")
    lab.faults = {1: {"loss": {"pct": 2.5, "direction": "tx"}}}
    lab.save()
    data = json.loads((tmp_path / "demo.json").read_text())
    assert data["faults"] == {"1": {"loss": {"pct": 2.5, "direction": "tx"}}}
    assert {"name", "bridge", "gateway", "subnet", "link_rate_bps", "nodes"} <= set(data)
    assert {"index", "netns", "ifname", "port", "address", "mac", "markers_dir"} <= \
        set(data["nodes"][0])
    again = load("demo")
    assert again == lab
    with pytest.raises(UserError):
        load("other")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(UserError):
        load("broken")


def test_nft_table_script_hooks_every_port_both_ways():
    script = nft.create_table_script("fabricscope_abcdef", ["p0", "p1"])
    assert "table bridge fabricscope_abcdef {" in script
    assert 'iifname "p1" jump node1_tx' in script and 'oifname "p0" jump node0_rx' in script
    assert "hook prerouting" in script and "hook postrouting" in script


@pytest.mark.parametrize("direction,chains", [("both", {"tx", "rx"}), ("tx", {"tx"}),
                                              ("rx", {"rx"})])
def test_nft_loss_rules(direction, chains):
    script = nft.node_rules_script("t", 2, 0.5, direction)
    assert script.startswith("flush chain bridge t node2_tx\nflush chain bridge t node2_rx\n")
    rules = [ln for ln in script.splitlines() if ln.startswith("add rule")]
    assert {ln.split()[4].rsplit("_", 1)[1] for ln in rules} == chains
    assert all("numgen random mod 10000 < 50 counter drop" in ln for ln in rules)
    assert not [ln for ln in nft.node_rules_script("t", 2, None, "both").splitlines()
                if ln.startswith("add")]
    assert nft.loss_threshold(2) == 200 and nft.loss_threshold(0.01) == 1


def test_tbf_parameters():
    p = tc.tbf_params(100 * 10**6, 32768)
    assert p == {"rate_bps": 10**8, "burst": 32768, "limit": 32768 + 25000}
    assert tc.tbf_params(10**8, 32768, limit=65536)["limit"] == 65536
    assert tc.tbf_params(10**8, 32768, latency_s=0.01)["limit"] == 32768 + 125000
    assert tc.tbf_params(10**9)["burst"] == 125000
    for kwargs in ({"burst": 1000}, {"burst": 32768, "limit": 2000}):
        with pytest.raises(UserError):
            tc.tbf_params(10**8, **kwargs)
    with pytest.raises(UserError):
        tc.tbf_params(40 * 10**9)


@pytest.mark.parametrize("mb", [0.25, 1, 3, 8, 12, 40])
def test_mlp_parameter_bytes_are_close_to_the_request(mb):
    width, layers = mlp_shape(mb)
    assert width <= 1024 and layers >= 1
    assert param_bytes(width, layers) == pytest.approx(mb * 2**20, rel=0.01)


@pytest.mark.parametrize("mb", [0, -1, float("nan"), float("inf"), "8", True])
def test_bad_model_sizes_are_user_errors(mb):
    with pytest.raises(UserError):
        mlp_shape(mb)


def test_rank_environment():
    lab = plan("demo", 3, "198.18.4.0/24")
    base = {"RANK": "9", "MASTER_ADDR": "10.0.0.1", "PATH": "/bin", "PYTHONPATH": "/x"}
    env = rank_env(lab, 2, 29501, base)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_ADDR"],
            env["MASTER_PORT"]) == ("2", "3", "0", "198.18.4.1", "29501")
    assert env["GLOO_SOCKET_IFNAME"] == lab.nodes[2].ifname
    assert env["FABRICSCOPE_MARKERS_DIR"] == lab.nodes[2].markers_dir
    assert env["OMP_NUM_THREADS"] == "1" and env["PATH"] == "/bin"
    assert env["PYTHONPATH"].split(":") == [str(ROOT), "/x"]


def test_exec_helpers():
    lab = plan("demo", 2, "198.18.4.0/24")
    node = lab.nodes[1]
    assert exec_argv(node, ["ip", "addr", 3]) == ["ip", "netns", "exec", "fs-demo-n1", "ip", "addr",
                                                  "3"]
    env = exec_env(lab, node, {"FABRICSCOPE_AGENT_NODE": "mine"})
    assert env["FABRICSCOPE_MARKERS_DIR"] == node.markers_dir
    assert env["FABRICSCOPE_AGENT_NODE"] == "mine"          # caller's value wins
    assert exec_env(lab, node, {})["FABRICSCOPE_AGENT_NODE"] == "node1"


def test_cli_registers_under_fabricscope():
    from fabricscope.lab import cli
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["lab", "fault", "--name", "x", "--node", "1", "loss", "0.5"])
    assert (args.func, args.pct, args.direction) == (cli.cmd_fault_loss, "0.5", "both")
    args = parser.parse_args(["lab", "exec", "--name", "x", "--node", "0", "--", "ip", "-br", "a"])
    assert args.cmd == ["--", "ip", "-br", "a"]
    args = parser.parse_args(["lab", "train", "--name", "x", "--steps", "3"])
    assert (args.model_mb, args.batch, args.data_mb, args.checkpoint_every) == (8.0, 32, 0.0, 0)


def test_lab_train_refuses_negative_io_sizes_in_one_line():
    out = _lab_cli("train", "--name", "x", "--steps", "3", "--checkpoint-every", "-2")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "--data-mb and --checkpoint-every must be 0 or more" in out.stderr


def test_importing_the_lab_cli_does_not_import_torch_or_pyroute2():
    code = "import sys, lab.cli, lab.training, lab.faults; " \
           "print(any(m in sys.modules for m in ('torch', 'pyroute2')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def _lab_cli(*argv, env=None):
    return subprocess.run([sys.executable, "-m", "fabricscope", "lab", *argv], cwd=ROOT, capture_output=True,
                          text=True, env=env)


@pytest.mark.parametrize("argv", [
    ["up", "--name", "bad name", "--nodes", "2"],
    ["up", "--name", "ok", "--nodes", "0"],
    ["up", "--name", "ok", "--nodes", "2", "--link-rate", "1zbit"],
])
def test_bad_input_is_one_line_and_exit_2(argv):
    out = _lab_cli(*argv)
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fabricscope: error: "), out.stderr


def test_unknown_lab_is_one_line_and_exit_2(tmp_path):
    import os
    env = {**os.environ, "FABRICSCOPE_LAB_DIR": str(tmp_path)}
    for argv in (["fault", "--name", "nolab", "--node", "0", "loss", "2"],
                 ["train", "--name", "nolab", "--steps", "1"],
                 ["exec", "--name", "nolab", "--node", "0", "--", "true"]):
        out = _lab_cli(*argv, env=env)
        assert out.returncode == 2 and "no lab named 'nolab'" in out.stderr, out
        assert len(out.stderr.strip().splitlines()) == 1


def test_not_root_is_a_user_error(monkeypatch):
    import os

    from fabricscope.lab import topology
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(UserError) as err:
        topology.up("demo", 2)
    assert "root" in err.value.cause
    with pytest.raises(UserError):
        topology.down("demo")
